#include "frontend/passes/upcast_half_precision.h"

#include <map>
#include <string>

#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {
namespace {

using ir::IsHalf;

bool IsCastTo(const ir::Node& n, ir::DType t) {
  return n.op == ir::OpKind::kCast && n.attrs.Get<std::string>("to") == ir::DTypeName(t);
}

// Whether anything computes in half precision. What a previous run left is not: a half graph
// input read only by Casts to f32, a half graph output made by a Cast from a non-half value.
bool UsesHalf(const ir::Graph& g) {
  const std::vector<std::vector<ir::NodeId>> uses = g.ComputeUses();
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const ir::Value& val = g.value(v);
    if (!IsHalf(val.dtype) || (uses[v].empty() && !g.IsGraphOutput(v))) continue;
    bool settled = true;
    for (ir::NodeId u : uses[v]) settled = settled && IsCastTo(g.node(u), ir::DType::kF32);
    if (val.producer != ir::kNoNode) {
      const ir::Node& p = g.node(val.producer);
      settled = settled && g.IsGraphOutput(v) && p.op == ir::OpKind::kCast && p.inputs.size() == 1 &&
                !IsHalf(g.value(p.inputs[0]).dtype);
    } else {
      settled = settled && !val.constant;  // a graph input
    }
    if (!settled) return true;
  }
  return false;
}

ir::Attrs CastTo(ir::DType t) {
  ir::Attrs a;
  a.Set("to", std::string(ir::DTypeName(t)));
  return a;
}

}  // namespace

absl::StatusOr<bool> UpcastHalfPrecision::Run(ir::Graph* g) {
  if (!UsesHalf(*g)) return false;
  // Half inputs stay half (callers feed them); an output stays half only where the graph casts
  // it to half explicitly (a requested conversion). Outputs that are half because the model
  // computes in half come out in float32, the precision onnxpipe computes in.
  std::map<ir::ValueId, ir::DType> inputs, outputs;
  for (ir::ValueId v : g->inputs()) {
    if (IsHalf(g->value(v).dtype)) inputs[v] = g->value(v).dtype;
  }
  for (ir::ValueId v : g->outputs()) {
    const ir::Value& val = g->value(v);
    if (!IsHalf(val.dtype) || inputs.count(v) || val.producer == ir::kNoNode) continue;
    if (IsCastTo(g->node(val.producer), val.dtype)) outputs[v] = val.dtype;
  }
  RETURN_IF_ERROR(ir::ConvertFloatPrecision(*g, ir::DType::kF16, ir::DType::kF32));
  RETURN_IF_ERROR(ir::ConvertFloatPrecision(*g, ir::DType::kBF16, ir::DType::kF32));

  // A half input x: its consumers read Cast(x, f32) instead.
  for (const auto& [x, half] : inputs) {
    ir::Value& xv = g->value(x);
    xv.dtype = half;
    const std::string name = xv.name;
    const ir::ValueId wide = g->AddValue(g->UniqueName(name + "/f32"), ir::DType::kF32, xv.shape,
                                         xv.shape_known);
    const std::vector<ir::ValueId> graph_outputs = g->outputs();
    g->ReplaceAllUses(x, wide);
    g->outputs() = graph_outputs;  // an input that is also an output stays itself
    g->AddNode(ir::OpKind::kCast, name + "/UpcastHalf", {x}, {wide}, CastTo(ir::DType::kF32));
  }
  // A half output y: its producer writes a float32 value, and y = Cast(that, half).
  for (const auto& [y, half] : outputs) {
    ir::Value& yv = g->value(y);
    const std::string name = yv.name;
    const ir::ValueId wide = g->AddValue(g->UniqueName(name + "/f32"), ir::DType::kF32, yv.shape,
                                         yv.shape_known);
    const std::vector<ir::ValueId> graph_outputs = g->outputs();
    g->ReplaceAllUses(y, wide);  // other consumers read the float32 value
    g->outputs() = graph_outputs;
    ir::Value& yv2 = g->value(y);
    if (yv2.producer != ir::kNoNode) {
      ir::Node& p = g->node(yv2.producer);
      p.outputs[yv2.producer_output] = wide;
      g->value(wide).producer = yv2.producer;
      g->value(wide).producer_output = yv2.producer_output;
    } else if (yv2.constant) {  // a constant output: the float32 value holds the data
      g->value(wide).constant = yv2.constant;
      yv2.constant.reset();
    }
    yv2.dtype = half;
    yv2.producer = ir::kNoNode;
    g->AddNode(ir::OpKind::kCast, name + "/DowncastHalf", {wide}, {y}, CastTo(half));
  }
  RETURN_IF_ERROR(g->TopoSort());
  return true;
}

}  // namespace onnxpipe::passes
