#include "frontend/ir/precision.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "frontend/ir/status.h"

namespace onnxpipe::ir {

namespace {

bool CastsToNonFloat(const Node& n) {
  if (n.op != OpKind::kCast) return false;
  const std::optional<DType> to = ParseDType(n.attrs.Get<std::string>("to", ""));
  return to.has_value() && !IsFloat(*to);
}

absl::Status Convert(Graph& g, DType from, DType to, const std::vector<bool>& keep) {
  RET_CHECK(IsFloat(from) && IsFloat(to)) << "precision conversion is between float types";
  if (from == to) return absl::OkStatus();
  for (ValueId v = 0; v < g.num_values(); ++v) {
    Value& val = g.value(v);
    if (val.dtype != from || (!keep.empty() && keep[v])) continue;
    val.dtype = to;
    if (val.constant) val.constant = val.constant->CastTo(to);
  }
  const std::string from_name(DTypeName(from)), to_name(DTypeName(to));
  for (NodeId id : g.LiveNodes()) {
    Node& n = g.node(id);
    if (!keep.empty() && !n.outputs.empty() && n.outputs[0] != kNoValue && keep[n.outputs[0]]) continue;
    if (n.op == OpKind::kCast && n.attrs.Get<std::string>("to") == from_name) n.attrs.Set("to", to_name);
    if (n.op == OpKind::kConstantOfShape && n.attrs.Has("value")) {
      Tensor t = n.attrs.Get<Tensor>("value");
      if (t.dtype() == from) n.attrs.Set("value", t.CastTo(to));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConvertFloatPrecision(Graph& g, DType from, DType to) { return Convert(g, from, to, {}); }

std::vector<bool> IndexArithmetic(const Graph& g, DType from) {
  const std::vector<std::vector<NodeId>> uses = g.ComputeUses();
  std::vector<bool> index(g.num_values(), false);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Value& val = g.value(v);
    index[v] = val.dtype == from && !uses[v].empty() && (val.producer != kNoNode || val.constant.has_value());
  }
  for (ValueId v : g.inputs()) index[v] = false;
  for (ValueId v : g.outputs()) index[v] = false;
  auto index_node = [&](const Node& n) {  // every float output index arithmetic
    for (ValueId o : n.outputs) {
      if (o == kNoValue || !index[o]) return false;
    }
    return !n.outputs.empty();
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (ValueId v = 0; v < g.num_values(); ++v) {
      if (!index[v]) continue;
      bool ok = true;
      for (NodeId u : uses[v]) ok = ok && (CastsToNonFloat(g.node(u)) || index_node(g.node(u)));
      if (const NodeId p = g.value(v).producer; ok && p != kNoNode) {
        for (ValueId in : g.node(p).inputs) {
          if (in != kNoValue && IsFloat(g.value(in).dtype) && !index[in]) ok = false;
        }
        ok = ok && index_node(g.node(p));
      }
      if (!ok) {
        index[v] = false;
        changed = true;
      }
    }
  }
  return index;
}

absl::Status ConvertComputePrecision(Graph& g, DType from, DType to) {
  return Convert(g, from, to, IndexArithmetic(g, from));
}

bool KeepsF32Output(const Node& node, int index) {
  switch (node.op) {
    case OpKind::kLayerNorm: return index == 1 || index == 2;
    case OpKind::kRMSNorm: return index == 1;
    case OpKind::kAttention: return index == 1;  // Stats
    case OpKind::kFusedMatMul: return node.attrs.Has("to");
    case OpKind::kGeluGrad:
    case OpKind::kLayerNormGrad:  // column sums in a GEMM KSum's place, in its dtype
      return IsColumnSumsOutput(node.op, index) && node.attrs.Get<std::string>("sums_to", "") == "f32";
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
