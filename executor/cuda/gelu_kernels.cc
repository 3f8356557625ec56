// Gelu and GeluGrad (f32 or bf16, erf or tanh form, with a fused dropout: op.h) in the CUDA backend's kernel
// table (gelu.cu).
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/gelu.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// The "approximate" attribute as gelu.h's flag; nullopt for a value the CPU kernel refuses.
std::optional<bool> TanhForm(const ir::Node& node) {
  const std::string a = node.attrs.Get<std::string>("approximate", "none");
  if (a == "none") return false;
  if (a == "tanh") return true;
  return std::nullopt;
}

// Y = Gelu(X), with its fused dropout.
KernelResult Gelu(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<bool> tanh_form = TanhForm(node);
  const std::optional<DropoutParams> drop = FusedDropout(ctx, node, in[0].num_elements());
  if (!tanh_form || !drop) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, in[0].dtype(), in[0].dims());
    if (!y.ok()) return y.status();
    const absl::Status st =
        GeluForward(DevicePtr<const T>(in[0]), DevicePtr<T>(*y), in[0].num_elements(), *tanh_form, &*drop, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*y};
  });
}

// dX = GeluGrad(dY, X), with the forward's fused dropout.
KernelResult GeluGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<bool> tanh_form = TanhForm(node);
  const std::optional<DropoutParams> drop = FusedDropout(ctx, node, in[0].num_elements());
  if (!tanh_form || !drop || in[0].dtype() != in[1].dtype() || in[0].dims() != in[1].dims()) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, in[0].dtype(), in[1].dims());
    if (!dx.ok()) return dx.status();
    const absl::Status st = GeluBackward(DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<T>(*dx),
                                         in[1].num_elements(), *tanh_form, &*drop, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*dx};
  });
}

}  // namespace

void RegisterGeluKernels(KernelTable& table) {
  table[ir::OpKind::kGelu].run = Gelu;
  table[ir::OpKind::kGeluGrad].run = GeluGrad;
}

}  // namespace onnxpipe::cuda
