// Dropout and DropoutGrad (f32 or bf16, scaled in fp32 and rounded once) in the CUDA backend's kernel table
// (dropout.h): the keep mask is the CPU backend's, bit for bit (same Philox stream, node key, step offset and
// micro-batch row offset), so a GPU run drops the elements a CPU run drops.
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/dropout.h"

namespace onnxpipe::cuda {
namespace {

// Y, mask? = Dropout(X); in inference (or ratio 0) Y = X and the mask is all ones.
KernelResult Dropout(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (!IsKernelFloat(x.dtype())) return std::nullopt;
  const int64_t n = x.num_elements();
  const std::optional<DropoutParams> p = FusedDropout(ctx, node, n);
  if (!p) return std::nullopt;  // the CPU kernel reports it
  std::vector<ir::Tensor> out(2);
  absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, x.dtype(), x.dims());
  if (!y.ok()) return y.status();
  out[0] = *y;
  if (WantsOutput(node, 1)) {
    absl::StatusOr<ir::Tensor> m = ctx.FullOutput(node, 1, ir::DType::kBool, x.dims());
    if (!m.ok()) return m.status();
    out[1] = *m;
  }
  if (n == 0) return out;
  uint8_t* mask = out[1].defined() ? static_cast<uint8_t*>(out[1].device_raw()) : nullptr;
  if (absl::Status st = DropoutForward(*p, x.dtype(), x.device_raw(), out[0].device_raw(), mask, n, ctx.stream);
      !st.ok()) {
    return st;
  }
  return out;
}

// dX = DropoutGrad(dY, mask?): dY * keep * scale, scale 1 outside training or with ratio 0 (as
// the CPU kernel); keep from the mask, or regenerated from the forward's stream without it.
KernelResult DropoutGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& dy = in[0];
  const bool has_mask = HasInput(in, 1);
  if (!IsKernelFloat(dy.dtype()) || (has_mask && (in[1].dtype() != ir::DType::kBool || in[1].dims() != dy.dims()))) {
    return std::nullopt;
  }
  const std::optional<DropoutParams> p = FusedDropout(ctx, node, dy.num_elements());
  if (!p) return std::nullopt;  // the CPU kernel reports it
  absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, dy.dtype(), dy.dims());
  if (!dx.ok()) return dx.status();
  if (dy.num_elements() == 0) return std::vector<ir::Tensor>{*dx};
  const uint8_t* mask = has_mask ? static_cast<const uint8_t*>(in[1].device_raw()) : nullptr;
  if (absl::Status st =
          DropoutBackward(*p, dy.dtype(), dy.device_raw(), mask, dx->device_raw(), dy.num_elements(), ctx.stream);
      !st.ok()) {
    return st;
  }
  return std::vector<ir::Tensor>{*dx};
}

}  // namespace

void RegisterDropoutKernels(KernelTable& table) {
  table[ir::OpKind::kDropout].run = Dropout;
  table[ir::OpKind::kDropoutGrad].run = DropoutGrad;
}

}  // namespace onnxpipe::cuda
