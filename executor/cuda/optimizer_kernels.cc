// SGDUpdate, AdamWUpdate, SumSquares and ClipScale (f32 parameters and gradients) in the CUDA
// backend's kernel table (optimizer.h, elementwise.h). The update kernels work in place: the new
// parameter and state start as copies of the old ones (no copy when the plan hands the update the
// state's own storage, which the backend's Copy skips), then one fused step updates them. lr and
// step are scalars read on the host (a small synchronising copy when they live on the device).
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/optimizer.h"

namespace onnxpipe::cuda {
namespace {

float* MF(const ir::Tensor& t) { return static_cast<float*>(t.device_raw()); }

absl::StatusOr<ir::Tensor> OnHost(const KernelContext& ctx, const ir::Tensor& t) {
  if (t.on_host()) return t;
  return ctx.backend->ToHost(t, ctx.exec.stream);
}

const float* CF(const ir::Tensor& t) { return static_cast<const float*>(t.device_raw()); }

bool SameAs(const ir::Tensor& a, const ir::Tensor& b) {
  return a.has_data() && b.has_data() && a.dtype() == b.dtype() && a.dims() == b.dims();
}

// The optional clipping factor: a device f32 scalar, or null when absent; false when unusable.
bool ScalePointer(const std::vector<ir::Tensor>& in, size_t i, const float** scale) {
  *scale = nullptr;
  if (!HasInput(in, i)) return true;
  if (in[i].dtype() != ir::DType::kF32 || in[i].num_elements() != 1 || in[i].on_host()) return false;
  *scale = static_cast<const float*>(in[i].device_raw());
  return true;
}

// param', momentum_buf'? = SGDUpdate(param, grad, lr, momentum_buf?, scale?).
KernelResult SgdUpdate(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const double momentum = node.attrs.Get<double>("momentum", 0.0);
  const bool nesterov = node.attrs.Get<int64_t>("nesterov", 0) != 0;
  const double wd = node.attrs.Get<double>("weight_decay", 0.0);
  const float* scale = nullptr;
  if (in[0].dtype() != ir::DType::kF32 || !SameAs(in[0], in[1]) || in[2].num_elements() != 1 ||
      (momentum != 0) != HasInput(in, 3) || (HasInput(in, 3) && !SameAs(in[0], in[3])) || (nesterov && momentum == 0) ||
      !ScalePointer(in, 4, &scale) || (momentum != 0 && !WantsOutput(node, 1))) {
    return std::nullopt;  // the CPU kernel reports what is wrong (or keeps no new buffer)
  }
  absl::StatusOr<ir::Tensor> lr = OnHost(ctx, in[2]);
  if (!lr.ok()) return lr.status();
  std::vector<ir::Tensor> out(node.outputs.size() > 1 ? 2 : 1);
  absl::StatusOr<ir::Tensor> p = ctx.FullOutput(node, 0, in[0].dtype(), in[0].dims());
  if (!p.ok()) return p.status();
  out[0] = *p;
  OptimizerTensor t;
  t.param = MF(out[0]), t.param_in = CF(in[0]), t.grad = CF(in[1]), t.n = in[0].num_elements();
  if (momentum != 0) {
    absl::StatusOr<ir::Tensor> buf = ctx.FullOutput(node, 1, in[3].dtype(), in[3].dims());
    if (!buf.ok()) return buf.status();
    out[1] = *buf;
    t.state0 = MF(out[1]), t.state0_in = CF(in[3]);
  }
  if (absl::Status st = SgdStep({t}, lr->GetAsDouble(0), momentum, wd, nesterov, scale, ctx.stream); !st.ok()) {
    return st;
  }
  return out;
}

// param', m', v' = AdamWUpdate(param, grad, m, v, lr, step, scale?).
KernelResult AdamWUpdate(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const float* scale = nullptr;
  if (in[0].dtype() != ir::DType::kF32 || !SameAs(in[0], in[1]) || !SameAs(in[0], in[2]) || !SameAs(in[0], in[3]) ||
      !HasInput(in, 4) || !HasInput(in, 5) || in[4].num_elements() != 1 || in[5].num_elements() != 1 ||
      !ScalePointer(in, 6, &scale) || !WantsOutput(node, 1) || !WantsOutput(node, 2)) {
    return std::nullopt;
  }
  absl::StatusOr<ir::Tensor> lr = OnHost(ctx, in[4]);
  if (!lr.ok()) return lr.status();
  absl::StatusOr<ir::Tensor> step = OnHost(ctx, in[5]);
  if (!step.ok()) return step.status();
  if (step->GetAsInt(0) < 1) return std::nullopt;
  std::vector<ir::Tensor> out(3);
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<ir::Tensor> o =
        ctx.FullOutput(node, k, in[k == 0 ? 0 : k + 1].dtype(), in[k == 0 ? 0 : k + 1].dims());
    if (!o.ok()) return o.status();
    out[k] = *o;
  }
  OptimizerTensor t;
  t.param = MF(out[0]), t.param_in = CF(in[0]), t.grad = CF(in[1]);
  t.state0 = MF(out[1]), t.state0_in = CF(in[2]), t.state1 = MF(out[2]), t.state1_in = CF(in[3]);
  t.n = in[0].num_elements();
  if (absl::Status st = AdamWStep({t}, lr->GetAsDouble(0), step->GetAsInt(0), node.attrs.Get<double>("beta1", 0.9),
                                  node.attrs.Get<double>("beta2", 0.999), node.attrs.Get<double>("eps", 1e-8),
                                  node.attrs.Get<double>("weight_decay", 0.01), scale, ctx.stream);
      !st.ok()) {
    return st;
  }
  return out;
}

// The f32 inputs of SumSquares with their sizes; false when one is not f32 on the device.
bool SumSquaresOperands(const std::vector<ir::Tensor>& in, std::vector<const float*>* ptrs,
                        std::vector<int64_t>* sizes) {
  if (in.empty() || !HasInput(in, 0)) return false;
  for (const ir::Tensor& t : in) {
    if (!t.defined()) continue;
    if (!t.has_data() || t.dtype() != ir::DType::kF32) return false;
    ptrs->push_back(static_cast<const float*>(t.device_raw()));
    sizes->push_back(t.num_elements());
  }
  return true;
}

// () f32 = sum of x^2 over every element of every input (double accumulation).
KernelResult SumSquares(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  std::vector<const float*> ptrs;
  std::vector<int64_t> sizes;
  if (!SumSquaresOperands(in, &ptrs, &sizes)) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, ir::DType::kF32, {});
  if (!out.ok()) return out.status();
  const size_t bytes = GradNormWorkspaceBytes(sizes);
  absl::StatusOr<void*> ws = ctx.Workspace(node, static_cast<int64_t>(bytes));
  if (!ws.ok()) return ws.status();
  if (absl::Status st = GradNorm(ptrs, sizes, MF(*out), nullptr, 0, 0, *ws, bytes, ctx.stream); !st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

int64_t SumSquaresWorkspace(const ir::Graph& g, const ir::Node& node) {
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const auto d = InputDims(g, node, i);
    if (!d) continue;
    int64_t n = 1;
    for (int64_t x : *d) n *= x;
    sizes.push_back(n);
  }
  return static_cast<int64_t>(GradNormWorkspaceBytes(sizes));
}

// () f32 = min(1, max_norm / (norm + eps)) in fp32, NaN passing through (the CPU's three fp32
// operations: Add, Div, then Min, which propagates NaN).
KernelResult ClipScale(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const double max_norm = node.attrs.Get<double>("max_norm", 0.0);
  if (in[0].dtype() != ir::DType::kF32 || in[0].num_elements() != 1 || !(max_norm > 0)) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, ir::DType::kF32, {});
  if (!out.ok()) return out.status();
  const float consts[3] = {static_cast<float>(node.attrs.Get<double>("eps", 1e-6)), static_cast<float>(max_norm), 1.f};
  absl::StatusOr<void*> ws = ctx.Workspace(node, sizeof(consts));
  if (!ws.ok()) return ws.status();
  float* c = static_cast<float*>(*ws);
  // Pageable source: the call returns once `consts` is staged.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(c, consts, sizeof(consts), cudaMemcpyHostToDevice, ctx.stream));
  const ir::DType f = ir::DType::kF32;
  float* y = MF(*out);
  absl::Status st = Binary(BinaryOp::kAdd, f, in[0].device_raw(), {}, c, {}, y, ctx.stream);  // norm + eps
  if (st.ok()) st = Binary(BinaryOp::kDiv, f, c + 1, {}, y, {}, y, ctx.stream);               // max_norm / that
  if (st.ok()) st = Binary(BinaryOp::kMin, f, y, {}, c + 2, {}, y, ctx.stream);               // min(that, 1)
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

}  // namespace

void RegisterOptimizerKernels(KernelTable& table) {
  table[ir::OpKind::kSGDUpdate] = {SgdUpdate, nullptr, /*host_inputs=*/1u << 2};
  table[ir::OpKind::kAdamWUpdate] = {AdamWUpdate, nullptr, /*host_inputs=*/(1u << 4) | (1u << 5)};
  table[ir::OpKind::kSumSquares] = {SumSquares, SumSquaresWorkspace};
  table[ir::OpKind::kClipScale] = {ClipScale, [](const ir::Graph&, const ir::Node&) -> int64_t { return 12; }};
}

}  // namespace onnxpipe::cuda
