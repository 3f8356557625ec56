// Rotary and RotaryGrad (f32 or bf16; op.h) in the CUDA backend's kernel table (rotary.cu).
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/rotary.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// Y = Rotary(X, cos, sin), or dX = RotaryGrad(dY, cos, sin) with `transpose`.
KernelResult RunRotary(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in,
                       bool transpose) {
  const ir::DType dt = in[0].dtype();
  if (!AllOfDType(in, {1, 2}, dt) || in[1].dims() != in[2].dims()) return std::nullopt;
  const absl::StatusOr<RotaryDims> dims =
      MakeRotaryDims(in[0].dims(), in[1].dims(), node.attrs.Get<int64_t>("rotary_dim", -1),
                     node.attrs.Get<int64_t>("interleaved", 0) != 0);
  if (!dims.ok()) return std::nullopt;  // the CPU kernel reports what does not fit
  return WithFloatElement(dt, [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, dt, in[0].dims());
    if (!y.ok()) return y.status();
    const absl::Status st = Rotary(*dims, transpose, DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]),
                                   DevicePtr<const T>(in[2]), DevicePtr<T>(*y), ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*y};
  });
}

}  // namespace

void RegisterRotaryKernels(KernelTable& table) {
  table[ir::OpKind::kRotary].run = [](const KernelContext& ctx, const ir::Node& node,
                                      const std::vector<ir::Tensor>& in) {
    return RunRotary(ctx, node, in, /*transpose=*/false);
  };
  table[ir::OpKind::kRotaryGrad].run = [](const KernelContext& ctx, const ir::Node& node,
                                          const std::vector<ir::Tensor>& in) {
    return RunRotary(ctx, node, in, /*transpose=*/true);
  };
}

}  // namespace onnxpipe::cuda
