#include "frontend/ir/precision.h"

#include "frontend/ir/status.h"

namespace onnxpipe::ir {

absl::Status ConvertFloatPrecision(Graph& g, DType from, DType to) {
  RET_CHECK(IsFloat(from) && IsFloat(to)) << "precision conversion is between float types";
  if (from == to) return absl::OkStatus();
  for (ValueId v = 0; v < g.num_values(); ++v) {
    Value& val = g.value(v);
    if (val.dtype != from) continue;
    val.dtype = to;
    if (val.constant) val.constant = val.constant->CastTo(to);
  }
  const std::string from_name(DTypeName(from)), to_name(DTypeName(to));
  for (NodeId id : g.LiveNodes()) {
    Node& n = g.node(id);
    if (n.op == OpKind::kCast && n.attrs.Get<std::string>("to") == from_name) n.attrs.Set("to", to_name);
    if (n.op == OpKind::kConstantOfShape && n.attrs.Has("value")) {
      Tensor t = n.attrs.Get<Tensor>("value");
      if (t.dtype() == from) n.attrs.Set("value", t.CastTo(to));
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::ir
