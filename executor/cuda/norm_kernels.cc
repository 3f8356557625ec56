// LayerNorm, LayerNormGrad, RMSNorm and RMSNormGrad (fp32) in the CUDA backend's kernel table
// (layernorm.h): the normalised dims must be trailing (any axis), at most kNormMaxD elements, with
// scale and bias of exactly those elements; other cases (a broadcast scale) run on the host.
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/layernorm.h"

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

float* MF(const ir::Tensor& t) { return t.defined() ? static_cast<float*>(t.device_raw()) : nullptr; }

// Y, Mean?, InvStdDev? = LayerNorm(X, scale, bias?).
KernelResult LayerNorm(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  if (!AllOfDType(in, {0, 1, 2}, ir::DType::kF32)) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[0].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  if (in[1].num_elements() != d || (HasInput(in, 2) && in[2].num_elements() != d)) return std::nullopt;
  std::vector<ir::Tensor> out(3);
  absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, ir::DType::kF32, in[0].dims());
  if (!y.ok()) return y.status();
  out[0] = *y;
  for (int k = 1; k <= 2; ++k) {
    if (!WantsOutput(node, k)) continue;
    absl::StatusOr<ir::Tensor> s = ctx.FullOutput(node, k, ir::DType::kF32, StatDims(node, in[0].dims()));
    if (!s.ok()) return s.status();
    out[k] = *s;
  }
  if (rows == 0) return out;
  NormForwardArgs<float> a;
  a.rows = rows, a.d = d;
  a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
  a.x = MF(in[0]), a.gamma = MF(in[1]), a.beta = HasInput(in, 2) ? MF(in[2]) : nullptr;
  a.y = MF(out[0]), a.mean = MF(out[1]), a.rstd = MF(out[2]);
  const absl::Status st = NormForward(a, ctx.stream);
  if (!st.ok()) return st;
  return out;
}

// dX, dScale?, dBias? = LayerNormGrad(dY, X, scale, mean?, inv_std_dev?).
KernelResult LayerNormGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  if (!AllOfDType(in, {0, 1, 2, 3, 4}, ir::DType::kF32) || in[0].dims() != in[1].dims()) return std::nullopt;
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
  std::vector<ir::Tensor> out(3);
  absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, ir::DType::kF32, in[1].dims());
  if (!dx.ok()) return dx.status();
  out[0] = *dx;
  for (int k = 1; k <= 2; ++k) {
    if (!WantsOutput(node, k)) continue;
    absl::StatusOr<ir::Tensor> g = ctx.Output(node, k, ir::DType::kF32, in[2].dims());
    if (!g.ok()) return g.status();
    out[k] = *g;
  }
  if (rows == 0) return out;
  NormBackwardArgs<float> a;
  a.rows = rows, a.d = d;
  a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
  a.dy = MF(in[0]), a.x = MF(in[1]), a.gamma = MF(in[2]);
  if (saved) a.mean = MF(in[3]), a.rstd = MF(in[4]);
  a.dx = MF(out[0]), a.dgamma = MF(out[1]), a.dbeta = MF(out[2]);
  if (a.dgamma != nullptr || a.dbeta != nullptr) {
    absl::StatusOr<void*> ws = ctx.Workspace(node, NormBackwardWorkspaceBytes(rows, d));
    if (!ws.ok()) return ws.status();
    a.workspace = static_cast<float*>(*ws);
  }
  const absl::Status st = NormBackward(a, ctx.stream);
  if (!st.ok()) return st;
  return out;
}

// Y, InvStdDev? = RMSNorm(X, scale).
KernelResult RMSNorm(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  if (!AllOfDType(in, {0, 1}, ir::DType::kF32)) return std::nullopt;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, in[0].dims());
  if (!rd) return std::nullopt;
  const auto [rows, d] = *rd;
  if (in[1].num_elements() != d) return std::nullopt;
  std::vector<ir::Tensor> out(2);
  absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, ir::DType::kF32, in[0].dims());
  if (!y.ok()) return y.status();
  out[0] = *y;
  if (WantsOutput(node, 1)) {
    absl::StatusOr<ir::Tensor> r = ctx.FullOutput(node, 1, ir::DType::kF32, StatDims(node, in[0].dims()));
    if (!r.ok()) return r.status();
    out[1] = *r;
  }
  if (rows == 0) return out;
  NormForwardArgs<float> a;
  a.kind = NormKind::kRmsNorm;
  a.rows = rows, a.d = d;
  a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
  a.x = MF(in[0]), a.gamma = MF(in[1]);
  a.y = MF(out[0]), a.rstd = MF(out[1]);
  const absl::Status st = NormForward(a, ctx.stream);
  if (!st.ok()) return st;
  return out;
}

// dX, dScale? = RMSNormGrad(dY, X, scale, inv_std_dev?).
KernelResult RMSNormGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  // The launcher always writes dX; a node without it (a frozen input) runs on the host.
  if (!WantsOutput(node, 0)) return std::nullopt;
  if (!AllOfDType(in, {0, 1, 2, 3}, ir::DType::kF32) || in[0].dims() != in[1].dims()) return std::nullopt;
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
  absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, ir::DType::kF32, in[1].dims());
  if (!dx.ok()) return dx.status();
  out[0] = *dx;
  if (WantsOutput(node, 1)) {
    absl::StatusOr<ir::Tensor> g = ctx.Output(node, 1, ir::DType::kF32, in[2].dims());  // zeros when rows == 0
    if (!g.ok()) return g.status();
    out[1] = *g;
  }
  if (rows == 0) return out;
  NormBackwardArgs<float> a;
  a.kind = NormKind::kRmsNorm;
  a.rows = rows, a.d = d;
  a.epsilon = static_cast<float>(node.attrs.Get<double>("epsilon", 1e-5));
  a.dy = MF(in[0]), a.x = MF(in[1]), a.gamma = MF(in[2]);
  if (saved) a.rstd = MF(in[3]);
  a.dx = MF(out[0]), a.dgamma = MF(out[1]);
  if (a.dgamma != nullptr) {
    absl::StatusOr<void*> ws = ctx.Workspace(node, NormBackwardWorkspaceBytes(rows, d));
    if (!ws.ok()) return ws.status();
    a.workspace = static_cast<float*>(*ws);
  }
  const absl::Status st = NormBackward(a, ctx.stream);
  if (!st.ok()) return st;
  return out;
}

// LayerNormGrad's and RMSNormGrad's (X is input 1 of both).
int64_t LayerNormGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<std::vector<int64_t>> x = InputDims(g, node, 1);
  if (!x) return 0;
  const std::optional<std::pair<int64_t, int64_t>> rd = RowsAndD(node, *x);
  return rd ? NormBackwardWorkspaceBytes(rd->first, rd->second) : 0;
}

}  // namespace

void RegisterNormKernels(KernelTable& table) {
  table[ir::OpKind::kLayerNorm].run = LayerNorm;
  table[ir::OpKind::kLayerNormGrad] = {LayerNormGrad, LayerNormGradWorkspace};
  table[ir::OpKind::kRMSNorm].run = RMSNorm;
  table[ir::OpKind::kRMSNormGrad] = {RMSNormGrad, LayerNormGradWorkspace};
}

}  // namespace onnxpipe::cuda
