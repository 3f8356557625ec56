#include "frontend/passes/residual_norm_fusion.h"

#include <set>
#include <vector>

#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// Whether node `target` is among the producers that `v` depends on.
bool DependsOn(const ir::Graph& g, ValueId v, NodeId target) {
  std::vector<ValueId> stack = {v};
  std::set<NodeId> seen;
  while (!stack.empty()) {
    const NodeId p = ProducerId(g, stack.back());
    stack.pop_back();
    if (p == ir::kNoNode) continue;
    if (p == target) return true;
    if (!seen.insert(p).second) continue;
    for (ValueId in : g.node(p).inputs)
      if (in != ir::kNoValue) stack.push_back(in);
  }
  return false;
}

// A Dropout that only `add` reads, whose mask nobody reads: the node, else kNoNode.
NodeId FusibleDropout(const ir::Graph& g, const UseInfo& uses, ValueId v) {
  const NodeId id = PatternProducer(g, uses, v);
  if (id == ir::kNoNode) return ir::kNoNode;
  const ir::Node& d = g.node(id);
  if (d.op != OpKind::kDropout || d.inputs.size() != 1) return ir::kNoNode;
  if (d.outputs.size() > 1 && d.outputs[1] != ir::kNoValue && uses.NumUses(d.outputs[1]) > 0) return ir::kNoNode;
  return id;
}

bool SameShape(const ir::Value& a, const ir::Value& b) {
  return a.shape_known && b.shape_known && a.shape == b.shape && a.dtype == b.dtype;
}

bool Fuse(ir::Graph* g, const UseInfo& uses, NodeId id) {
  const ir::Node& ln = g->node(id);
  const int r = ir::NormResidualInput(ln.op);
  if (r < 0 || (static_cast<int>(ln.inputs.size()) > r && ln.inputs[r] != ir::kNoValue)) return false;
  const bool layer_norm = ln.op == OpKind::kLayerNorm;  // RMSNorm takes no fused dropout
  const ValueId s = ln.inputs[0];
  const ir::Node* add = ProducerOf(*g, s, OpKind::kAdd);
  if (add == nullptr || add->inputs.size() != 2) return false;
  const NodeId add_id = ProducerId(*g, s);
  const ValueId a0 = add->inputs[0], a1 = add->inputs[1];
  if (!SameShape(g->value(a0), g->value(s)) || !SameShape(g->value(a1), g->value(s))) return false;
  // The normalisation's other operands must not depend on the sum, which the norm now makes.
  for (size_t i = 1; i < ln.inputs.size(); ++i)
    if (ln.inputs[i] != ir::kNoValue && DependsOn(*g, ln.inputs[i], add_id)) return false;
  NodeId drop = layer_norm ? FusibleDropout(*g, uses, a1) : ir::kNoNode;
  ValueId x = a1, residual = a0;
  if (layer_norm && drop == ir::kNoNode && (drop = FusibleDropout(*g, uses, a0)) != ir::kNoNode) {
    std::swap(x, residual);
  }
  double ratio = 0;
  std::string key;
  if (drop != ir::kNoNode) {
    const ir::Node& d = g->node(drop);
    ratio = d.attrs.Get<double>("ratio", 0.5);
    key = d.attrs.Get<std::string>("rng_key", d.name);
    x = d.inputs[0];
  }
  const bool sum_read = uses.NumUses(s) > 1;
  g->RemoveNode(add_id);
  if (drop != ir::kNoNode) g->RemoveNode(drop);
  ir::Node& n = g->node(id);
  n.inputs[0] = x;
  n.inputs.resize(r + 1, ir::kNoValue);
  n.inputs[r] = residual;
  if (drop != ir::kNoNode) {
    n.attrs.Set("dropout", ratio);
    n.attrs.Set("rng_key", key);
  }
  if (sum_read) {
    const int sum = ir::NormSumOutput(n.op);
    if (static_cast<int>(n.outputs.size()) <= sum) n.outputs.resize(sum + 1, ir::kNoValue);
    SetOutput(g, id, sum, s);
  }
  return true;
}

}  // namespace

absl::StatusOr<bool> ResidualNormFusion::Run(ir::Graph* g) {
  const bool changed = RewriteEachNode(g, Fuse);
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
