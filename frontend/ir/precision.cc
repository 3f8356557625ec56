#include "frontend/ir/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>

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

bool KeepsF32Output(const Node& node, int index) {
  switch (node.op) {
    case OpKind::kLayerNorm: return index == 1 || index == 2;
    case OpKind::kRMSNorm: return index == 1;
    case OpKind::kAttention: return index == 1;  // Stats
    case OpKind::kFusedMatMul: return node.attrs.Has("to");
    case OpKind::kSoftmaxCrossEntropyLoss: return true;  // loss, log_prob, Stats (op.h)
    default: return false;
  }
}

double MaxFinite(DType t) {
  switch (t) {
    case DType::kBF16: return BF16ToFloat(0x7f7f);
    case DType::kF16: return 65504.0;
    case DType::kF32: return std::numeric_limits<float>::max();
    default: return std::numeric_limits<double>::max();
  }
}

Tensor CastSaturating(const Tensor& t, DType to) {
  const double limit = MaxFinite(to);
  Tensor clamped(DType::kF64, t.dims());
  double* d = clamped.mutable_data<double>();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const double v = t.GetAsDouble(i);
    d[i] = std::isfinite(v) ? std::clamp(v, -limit, limit) : v;
  }
  return clamped.CastTo(to);
}

}  // namespace onnxpipe::ir
