#include "frontend/passes/sum_into_norm_grad.h"

#include <vector>

#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// Every input of `sum` is present and has the dtype and (known) shape of its output.
bool AddendsMatch(const ir::Graph& g, const ir::Node& sum) {
  const ir::Value& out = g.value(sum.outputs[0]);
  if (!out.shape_known || sum.inputs.size() < 2) return false;
  for (ValueId v : sum.inputs) {
    if (v == ir::kNoValue) return false;
    const ir::Value& in = g.value(v);
    if (!in.shape_known || in.dtype != out.dtype || in.shape != out.shape) return false;
  }
  return true;
}

bool Fuse(ir::Graph* g, const UseInfo& uses, NodeId id) {
  const ir::Node& norm = g->node(id);
  const int dy2 = ir::NormGradDy2Input(norm.op);
  if (dy2 < 0 || norm.inputs.empty()) return false;
  if (static_cast<int>(norm.inputs.size()) > dy2 && norm.inputs[dy2] != ir::kNoValue) return false;
  const ValueId dy = norm.inputs[0];
  const NodeId sum_id = PatternProducer(*g, uses, dy);
  if (sum_id == ir::kNoNode || g->node(sum_id).op != OpKind::kSum || !AddendsMatch(*g, g->node(sum_id))) return false;
  ir::Node& sum = g->node(sum_id);
  const ValueId last = sum.inputs.back();
  ValueId rest = dy;
  sum.inputs.pop_back();
  if (sum.inputs.size() == 1) {
    rest = sum.inputs[0];
    g->RemoveNode(sum_id);
  }
  ir::Node& n = g->node(id);
  if (static_cast<int>(n.inputs.size()) <= dy2) n.inputs.resize(dy2 + 1, ir::kNoValue);
  n.inputs[0] = rest;
  n.inputs[dy2] = last;
  return true;
}

}  // namespace

absl::StatusOr<bool> SumIntoNormGrad::Run(ir::Graph* g) { return RewriteEachNode(g, Fuse); }

}  // namespace onnxpipe::passes
