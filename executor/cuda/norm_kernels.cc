// LayerNorm (with its fused residual and dropout), LayerNormGrad, RMSNorm and RMSNormGrad in the CUDA
// backend's kernel table (layernorm.h): the normalised dims must be trailing (any axis), at most kNormMaxD
// elements, with scale and bias of exactly those elements; other cases (a broadcast scale) run on the host.
// X, Y, dY, dX, scale, bias and their gradients are all f32 or all bf16; the saved Mean and
// InvStdDev are f32 either way (ONNX's stash_type). The launchers sum dScale/dBias in fp32: for a
// bf16 graph they land in the workspace and are rounded into the outputs once.
#include <type_traits>
#include <utility>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/layernorm.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// (rows, d) of normalising `dims` from attr axis; nullopt for a bad axis or d out of range.
std::optional<std::pair<int64_t, int64_t>> RowsAndD(const ir::Node& node, const std::vector<int64_t>& dims) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = node.attrs.Get<int64_t>("axis", -1);
  if (axis < 0) axis += rank;
  if (rank == 0 || axis < 0 || axis >= rank) return std::nullopt;
  int64_t rows = 1, d = 1;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? rows : d) *= dims[i];
  if (d < 1 || d > kNormMaxD) return std::nullopt;
  return std::make_pair(rows, d);
}

std::vector<int64_t> StatDims(const ir::Node& node, std::vector<int64_t> dims) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = node.attrs.Get<int64_t>("axis", -1);
  if (axis < 0) axis += rank;
  for (int64_t i = axis; i < rank; ++i) dims[i] = 1;
  return dims;
}

// The activations' dtype when every input among `data` has it and every saved statistic among
// `stats` is f32; nullopt otherwise.
std::optional<ir::DType> NormDType(const std::vector<ir::Tensor>& in, std::initializer_list<size_t> data,
                                   std::initializer_list<size_t> stats) {
  if (!AllOfDType(in, stats, ir::DType::kF32)) return std::nullopt;
  for (ir::DType t : kKernelFloats)
    if (AllOfDType(in, data, t)) return t;
  return std::nullopt;
}

int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Workspace of a backward over (rows, d) with `sums` column sums wanted (dgamma, dbeta, dx_sums), of
// which `staged` are not f32: the launcher's, then an fp32 staging slot per staged one, 256-byte aligned.
int64_t BackwardWorkspaceBytes(int64_t rows, int64_t d, int sums, int staged) {
  if (sums == 0) return 0;
  return Aligned(NormBackwardWorkspaceBytes(rows, d)) + staged * Aligned(d * static_cast<int64_t>(sizeof(float)));
}

// Takes the backward's workspace and points the launcher's dgamma/dbeta/dx_sums at the outputs (f32)
// or at staging slots (bf16); returns the staged pairs (fp32 slot, bf16 output) to round after it.
template <typename T>
absl::StatusOr<std::vector<std::pair<float*, void*>>> ParamGrads(const KernelContext& ctx, const ir::Node& node,
                                                                 NormBackwardArgs<T>& a, const ir::Tensor& dgamma,
                                                                 const ir::Tensor& dbeta, const ir::Tensor& sums) {
  std::vector<std::pair<float*, void*>> staged;
  const std::pair<float**, const ir::Tensor*> wanted[] = {
      {&a.dgamma, &dgamma}, {&a.dbeta, &dbeta}, {&a.dx_sums, &sums}};
  int count = 0, stage = 0;
  for (const auto& [grad, out] : wanted) {
    count += out->defined();
    stage += out->defined() && out->dtype() != ir::DType::kF32;
  }
  if (count == 0) return staged;
  ASSIGN_OR_RETURN(void* ws, ctx.Workspace(node, BackwardWorkspaceBytes(a.rows, a.d, count, stage)));
  a.workspace = static_cast<float*>(ws);
  char* slot = static_cast<char*>(ws) + Aligned(NormBackwardWorkspaceBytes(a.rows, a.d));
  for (const auto& [grad, out] : wanted) {
    if (!out->defined()) continue;
    if (out->dtype() == ir::DType::kF32) {
      *grad = DevicePtr<float>(*out);
      continue;
    }
    *grad = reinterpret_cast<float*>(slot);
    staged.emplace_back(*grad, out->device_raw());
    slot += Aligned(a.d * static_cast<int64_t>(sizeof(float)));
  }
  return staged;
}

// Runs the backward, then rounds the staged fp32 parameter gradients into their bf16 outputs.
template <typename T>
KernelResult RunBackward(const KernelContext& ctx, const ir::Node& node, NormBackwardArgs<T>& a,
                         std::vector<ir::Tensor> out, const ir::Tensor& dgamma, const ir::Tensor& dbeta,
                         const ir::Tensor& sums = ir::Tensor()) {
  absl::StatusOr<std::vector<std::pair<float*, void*>>> staged = ParamGrads(ctx, node, a, dgamma, dbeta, sums);
  if (!staged.ok()) return staged.status();
  if (absl::Status st = NormBackward(a, ctx.stream); !st.ok()) return st;
  for (const auto& [from, to] : *staged) {
    if (absl::Status st = Cast(ir::DType::kF32, from, ir::DType::kBF16, to, a.d, ctx.stream); !st.ok()) return st;
  }
  return out;
}

// Y, Mean?, InvStdDev?, Sum? = LayerNorm(X, scale, bias?, residual?) with its fused dropout (op.h).
KernelResult LayerNorm(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> t = NormDType(in, {0, 1, 2, 3}, {});
  if (!t) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[0].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  if (in[1].num_elements() != d || (HasInput(in, 2) && in[2].num_elements() != d)) return std::nullopt;
  const bool residual = HasInput(in, 3);
  if (residual && in[3].dims() != in[0].dims()) return std::nullopt;
  std::optional<DropoutParams> drop;
  if (residual && node.attrs.Get<double>("dropout", 0.0) != 0.0) {
    drop = FusedDropout(ctx, node, in[0].num_elements());
    if (!drop) return std::nullopt;
  }
  std::vector<ir::Tensor> out(residual && WantsOutput(node, 3) ? 4 : 3);
  if (out.size() == 4) {
    absl::StatusOr<ir::Tensor> sum = ctx.FullOutput(node, 3, *t, in[0].dims());
    if (!sum.ok()) return sum.status();
    out[3] = *sum;
  }
  absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, *t, in[0].dims());
  if (!y.ok()) return y.status();
  out[0] = *y;
  for (int k = 1; k <= 2; ++k) {
    if (!WantsOutput(node, k)) continue;
    absl::StatusOr<ir::Tensor> s = ctx.FullOutput(node, k, ir::DType::kF32, StatDims(node, in[0].dims()));
    if (!s.ok()) return s.status();
    out[k] = *s;
  }
  if (rows == 0) return out;
  return WithFloatElement(*t, [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    NormForwardArgs<T> a;
    a.rows = rows, a.d = d;
    a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
    a.x = DevicePtr<T>(in[0]), a.gamma = DevicePtr<T>(in[1]), a.beta = HasInput(in, 2) ? DevicePtr<T>(in[2]) : nullptr;
    a.y = DevicePtr<T>(out[0]), a.mean = DevicePtr<float>(out[1]), a.rstd = DevicePtr<float>(out[2]);
    if (residual) a.residual = DevicePtr<T>(in[3]), a.sum = out.size() == 4 ? DevicePtr<T>(out[3]) : nullptr;
    if (drop && DropoutActive(*drop)) a.dropout = &*drop;
    if (absl::Status st = NormForward(a, ctx.stream); !st.ok()) return st;
    return out;
  });
}

// The output of LayerNormGrad's column sums wanted (4: of dX, 5: of dXDropped; op.h), 0 for none, -1 for
// what the kernel does not write (both, or sums of a dXDropped not written).
int SumsOutput(const ir::Node& node) {
  const int dx_sums = ir::ColumnSumsOutput(node.op, 0), dropped_sums = ir::ColumnSumsOutput(node.op, 3);
  const bool of_dx = WantsOutput(node, dx_sums), of_dropped = WantsOutput(node, dropped_sums);
  if (of_dx && of_dropped) return -1;
  if (of_dropped) return WantsOutput(node, 3) ? dropped_sums : -1;
  return of_dx ? dx_sums : 0;
}

// dX, dScale?, dBias?, dXDropped?, dXSums?, dXDroppedSums? = LayerNormGrad(dY, X, scale, mean?, inv_std_dev?,
// dresidual?, dY2?).
KernelResult LayerNormGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> t = NormDType(in, {0, 1, 2, 5, 6}, {3, 4});
  if (!t || in[0].dims() != in[1].dims()) return std::nullopt;
  for (int i : {5, 6})
    if (HasInput(in, i) && in[i].dims() != in[1].dims()) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[1].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  // Parameter gradients have scale's shape; only a scale of exactly the normalised dims is covered.
  const int64_t rank = in[1].rank();
  int64_t axis = node.attrs.Get<int64_t>("axis", -1);
  if (axis < 0) axis += rank;
  if (in[2].dims() != std::vector<int64_t>(in[1].dims().begin() + axis, in[1].dims().end())) return std::nullopt;
  const bool saved = HasInput(in, 3) && HasInput(in, 4);
  if (saved && (in[3].num_elements() != rows || in[4].num_elements() != rows)) return std::nullopt;
  std::optional<DropoutParams> drop;
  if (WantsOutput(node, 3)) {
    drop = FusedDropout(ctx, node, in[1].num_elements());
    if (!drop) return std::nullopt;
  }
  const int sums_at = SumsOutput(node);
  const std::optional<ir::DType> sums_dtype =
      ir::ParseDType(node.attrs.Get<std::string>("sums_to", std::string(ir::DTypeName(*t))));
  if (sums_at < 0 || (sums_at > 0 && (axis != rank - 1 || (sums_dtype != ir::DType::kF32 && sums_dtype != *t)))) {
    return std::nullopt;
  }
  std::vector<ir::Tensor> out(sums_at > 0 ? sums_at + 1 : drop ? 4 : 3);
  if (sums_at > 0) {
    absl::StatusOr<ir::Tensor> s = ctx.Output(node, sums_at, *sums_dtype, {d});  // zeros when rows == 0
    if (!s.ok()) return s.status();
    out[sums_at] = *s;
  }
  for (int k : {0, 3}) {
    if (k == 3 && !drop) continue;
    if (k >= static_cast<int>(out.size())) continue;
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, k, *t, in[1].dims());
    if (!dx.ok()) return dx.status();
    out[k] = *dx;
  }
  for (int k = 1; k <= 2; ++k) {
    if (!WantsOutput(node, k)) continue;
    absl::StatusOr<ir::Tensor> g = ctx.Output(node, k, *t, in[2].dims());
    if (!g.ok()) return g.status();
    out[k] = *g;
  }
  if (rows == 0) return out;
  return WithFloatElement(*t, [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    NormBackwardArgs<T> a;
    a.rows = rows, a.d = d;
    a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
    a.dy = DevicePtr<T>(in[0]), a.x = DevicePtr<T>(in[1]), a.gamma = DevicePtr<T>(in[2]);
    if (saved) a.mean = DevicePtr<float>(in[3]), a.rstd = DevicePtr<float>(in[4]);
    if (HasInput(in, 5)) a.dresidual = DevicePtr<T>(in[5]);
    if (HasInput(in, 6)) a.dy2 = DevicePtr<T>(in[6]);
    a.dx = DevicePtr<T>(out[0]);
    if (drop) a.dropout = &*drop, a.dx_dropped = DevicePtr<T>(out[3]);
    a.sums_of_dropped = sums_at == 5;
    return RunBackward(ctx, node, a, out, out[1], out[2], sums_at > 0 ? out[sums_at] : ir::Tensor());
  });
}

// Y, InvStdDev?, Sum? = RMSNorm(X, scale, residual?).
KernelResult RMSNorm(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> t = NormDType(in, {0, 1, 2}, {});
  if (!t) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[0].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  if (in[1].num_elements() != d) return std::nullopt;
  const bool residual = HasInput(in, 2);
  if (residual && in[2].dims() != in[0].dims()) return std::nullopt;
  std::vector<ir::Tensor> out(residual && WantsOutput(node, 2) ? 3 : 2);
  if (out.size() == 3) {
    absl::StatusOr<ir::Tensor> sum = ctx.FullOutput(node, 2, *t, in[0].dims());
    if (!sum.ok()) return sum.status();
    out[2] = *sum;
  }
  absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, *t, in[0].dims());
  if (!y.ok()) return y.status();
  out[0] = *y;
  if (WantsOutput(node, 1)) {
    absl::StatusOr<ir::Tensor> r = ctx.FullOutput(node, 1, ir::DType::kF32, StatDims(node, in[0].dims()));
    if (!r.ok()) return r.status();
    out[1] = *r;
  }
  if (rows == 0) return out;
  return WithFloatElement(*t, [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    NormForwardArgs<T> a;
    a.kind = NormKind::kRmsNorm;
    a.rows = rows, a.d = d;
    a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
    a.x = DevicePtr<T>(in[0]), a.gamma = DevicePtr<T>(in[1]);
    a.y = DevicePtr<T>(out[0]), a.rstd = DevicePtr<float>(out[1]);
    if (residual) a.residual = DevicePtr<T>(in[2]), a.sum = out.size() == 3 ? DevicePtr<T>(out[2]) : nullptr;
    if (absl::Status st = NormForward(a, ctx.stream); !st.ok()) return st;
    return out;
  });
}

// dX, dScale? = RMSNormGrad(dY, X, scale, inv_std_dev?, dY2?, dresidual?).
KernelResult RMSNormGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  // The launcher always writes dX; a node without it (a frozen input) runs on the host.
  if (!WantsOutput(node, 0)) return std::nullopt;
  const std::optional<ir::DType> t = NormDType(in, {0, 1, 2, 4, 5}, {3});
  if (!t || in[0].dims() != in[1].dims()) return std::nullopt;
  for (int i : {4, 5})
    if (HasInput(in, i) && in[i].dims() != in[1].dims()) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[1].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  const int64_t rank = in[1].rank();
  int64_t axis = node.attrs.Get<int64_t>("axis", -1);
  if (axis < 0) axis += rank;
  if (in[2].dims() != std::vector<int64_t>(in[1].dims().begin() + axis, in[1].dims().end())) return std::nullopt;
  const bool saved = HasInput(in, 3);
  if (saved && in[3].num_elements() != rows) return std::nullopt;
  std::vector<ir::Tensor> out(2);
  absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, *t, in[1].dims());
  if (!dx.ok()) return dx.status();
  out[0] = *dx;
  if (WantsOutput(node, 1)) {
    absl::StatusOr<ir::Tensor> g = ctx.Output(node, 1, *t, in[2].dims());  // zeros when rows == 0
    if (!g.ok()) return g.status();
    out[1] = *g;
  }
  if (rows == 0) return out;
  return WithFloatElement(*t, [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    NormBackwardArgs<T> a;
    a.kind = NormKind::kRmsNorm;
    a.rows = rows, a.d = d;
    a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
    a.dy = DevicePtr<T>(in[0]), a.x = DevicePtr<T>(in[1]), a.gamma = DevicePtr<T>(in[2]);
    if (saved) a.rstd = DevicePtr<float>(in[3]);
    if (HasInput(in, 4)) a.dy2 = DevicePtr<T>(in[4]);
    if (HasInput(in, 5)) a.dresidual = DevicePtr<T>(in[5]);
    a.dx = DevicePtr<T>(out[0]);
    return RunBackward(ctx, node, a, out, out[1], ir::Tensor());
  });
}

// LayerNormGrad's and RMSNormGrad's (X is input 1 of both; dScale and dBias are outputs 1 and 2).
int64_t LayerNormGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<std::vector<int64_t>> x = InputDims(g, node, 1);
  if (!x) return 0;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, *x);
  if (!rd) return 0;
  const bool half = g.value(node.inputs[1]).dtype != ir::DType::kF32;
  int sums = 0, staged = 0;
  for (int k : {1, 2, 4, 5}) {
    if (!WantsOutput(node, k)) continue;
    ++sums;
    staged += k <= 2 ? half : g.value(node.outputs[k]).dtype != ir::DType::kF32;
  }
  return BackwardWorkspaceBytes(rd->first, rd->second, sums, staged);
}

}  // namespace

void RegisterNormKernels(KernelTable& table) {
  table[ir::OpKind::kLayerNorm].run = LayerNorm;
  table[ir::OpKind::kLayerNormGrad] = {LayerNormGrad, LayerNormGradWorkspace};
  table[ir::OpKind::kRMSNorm].run = RMSNorm;
  table[ir::OpKind::kRMSNormGrad] = {RMSNormGrad, LayerNormGradWorkspace};
}

}  // namespace onnxpipe::cuda
