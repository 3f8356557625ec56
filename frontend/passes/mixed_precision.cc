// Three phases: (1) decide every f32 value's dtype (masters and graph inputs stay f32, constants
// convert saturating, computed values follow their producer); (2) give every operand the dtype its
// consumer computes in, through a Cast per use for masters and one shared Cast per (value, dtype)
// otherwise; (3) cast the graph outputs back to f32 under their own names.
#include "frontend/passes/mixed_precision.h"

#include <map>
#include <optional>
#include <regex>
#include <set>
#include <utility>

#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {
namespace {

using ir::DType;
using ir::ValueId;

// Ops that compute in f32 whatever the compute dtype: the loss (autocast's fp32 list).
bool StaysF32(ir::OpKind op) { return op == ir::OpKind::kSoftmaxCrossEntropyLoss; }

// Operands such an op reads in whatever float dtype they have: the loss's scores, which its kernels
// widen to f32 as they read them (op.h), so no f32 copy of the logits (rows x vocabulary) exists.
bool ReadsAnyFloat(ir::OpKind op, size_t input) {
  return op == ir::OpKind::kSoftmaxCrossEntropyLoss && input == 0;
}

ir::Attrs CastTo(DType t) {
  ir::Attrs a;
  a.Set("to", std::string(ir::DTypeName(t)));
  return a;
}

// Adds y = Cast(x, to) with y named after x; the node takes `scope` so that the partitioner keeps
// it with its consumer.
ValueId AddCast(ir::Graph* g, ValueId x, DType to, const std::string& scope) {
  const ir::Value& xv = g->value(x);
  const std::string name = g->UniqueName(xv.name + "/" + std::string(ir::DTypeName(to)));
  const ValueId y = g->AddValue(name, to, xv.shape, xv.shape_known);
  const ir::NodeId id = g->AddNode(ir::OpKind::kCast, name, {x}, {y}, CastTo(to));
  g->node(id).scope = scope;
  return y;
}

}  // namespace

absl::StatusOr<bool> MixedPrecision::Run(ir::Graph* g) {
  const DType compute = options_.compute;
  if (!ir::IsHalf(compute)) {
    return INVALID_ARGUMENT() << "mixed precision computes in bf16 or f16, not " << ir::DTypeName(compute);
  }
  std::optional<std::regex> freeze;
  if (!options_.freeze_regex.empty()) {
    try {
      freeze.emplace(options_.freeze_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return INVALID_ARGUMENT() << "--freeze regex '" << options_.freeze_regex << "' is invalid: " << e.what();
    }
  }

  // Phase 1: the dtype of every f32 value.
  const int32_t nv = g->num_values();
  std::vector<bool> master(nv, false);
  bool changed = false;
  for (ValueId v = 0; v < nv; ++v) {
    ir::Value& val = g->value(v);
    if (val.dtype != DType::kF32) continue;
    if (val.constant && val.is_initializer && val.producer == ir::kNoNode &&
        val.param_state != ir::ParamState::kFrozen && !(freeze && std::regex_search(val.name, *freeze))) {
      master[v] = true;
    } else if (val.constant) {
      val.constant = ir::CastSaturating(*val.constant, compute);
      val.dtype = compute;
      changed = true;
    } else if (val.producer != ir::kNoNode) {
      const ir::Node& p = g->node(val.producer);
      if (StaysF32(p.op) || ir::KeepsF32Output(p, val.producer_output)) continue;
      val.dtype = compute;
      changed = true;
    }
  }
  for (ir::NodeId id : g->LiveNodes()) {
    ir::Node& n = g->node(id);
    if (n.outputs.empty() || n.outputs[0] == ir::kNoValue || g->value(n.outputs[0]).dtype != compute) continue;
    if (n.op == ir::OpKind::kCast && n.attrs.Get<std::string>("to") == ir::DTypeName(DType::kF32)) {
      n.attrs.Set("to", std::string(ir::DTypeName(compute)));
    }
    if ((n.op == ir::OpKind::kConstant || n.op == ir::OpKind::kConstantOfShape) && n.attrs.Has("value") &&
        n.attrs.Get<ir::Tensor>("value").dtype() == DType::kF32) {
      n.attrs.Set("value", ir::CastSaturating(n.attrs.Get<ir::Tensor>("value"), compute));
    }
  }

  // Phase 2: operands in the consumer's dtype. Cast nodes read any float dtype as they are.
  std::map<std::pair<ValueId, DType>, ValueId> shared;
  for (ir::NodeId id : g->LiveNodes()) {
    if (g->node(id).op == ir::OpKind::kCast) continue;
    const DType want = StaysF32(g->node(id).op) ? DType::kF32 : compute;
    for (size_t i = 0; i < g->node(id).inputs.size(); ++i) {
      const ValueId v = g->node(id).inputs[i];
      if (v == ir::kNoValue || ReadsAnyFloat(g->node(id).op, i)) continue;
      const DType have = g->value(v).dtype;
      if (have == want || (have != DType::kF32 && have != compute)) continue;
      const std::string scope = g->node(id).scope;
      ValueId cast;
      if (v < nv && master[v]) {
        cast = AddCast(g, v, want, scope);  // one per use
      } else if (auto it = shared.find({v, want}); it != shared.end()) {
        cast = it->second;
      } else {
        cast = shared[{v, want}] = AddCast(g, v, want, scope);
      }
      g->node(id).inputs[i] = cast;  // AddCast may have moved the node storage: index again
      changed = true;
    }
  }

  // Phase 3: graph outputs keep their names and f32; the producer writes a compute-dtype value.
  std::set<ValueId> done;
  for (ValueId y : std::vector<ValueId>(g->outputs())) {
    const ir::Value& yv = g->value(y);
    if (yv.dtype != compute || yv.producer == ir::kNoNode || y >= nv || !done.insert(y).second) continue;
    const ir::NodeId producer = yv.producer;
    const int index = yv.producer_output;
    const std::string scope = g->node(producer).scope;
    const ValueId h = g->AddValue(g->UniqueName(yv.name + "/" + std::string(ir::DTypeName(compute))), compute,
                                  yv.shape, yv.shape_known);
    const std::vector<ValueId> outputs = g->outputs();
    g->ReplaceAllUses(y, h);
    g->outputs() = outputs;
    g->node(producer).outputs[index] = h;
    g->value(h).producer = producer;
    g->value(h).producer_output = index;
    g->value(y).producer = ir::kNoNode;
    g->value(y).dtype = DType::kF32;
    const ir::NodeId id = g->AddNode(ir::OpKind::kCast, g->value(y).name + "/f32", {h}, {y}, CastTo(DType::kF32));
    g->node(id).scope = scope;
  }
  RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
