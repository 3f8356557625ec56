// Gelu and GeluGrad (fp32, erf or tanh form) in the CUDA backend's kernel table (gelu.cu).
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

}  // namespace

void RegisterGeluKernels(KernelTable& table) {
  table[ir::OpKind::kGelu].run = [](const KernelContext& ctx, const ir::Node& node,
                                const std::vector<ir::Tensor>& in) -> std::optional<absl::StatusOr<std::vector<ir::Tensor>>> {
    const std::optional<bool> tanh_form = TanhForm(node);
    if (!tanh_form || in[0].dtype() != ir::DType::kF32) return std::nullopt;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, ir::DType::kF32, in[0].dims());
    if (!y.ok()) return y.status();
    const absl::Status st = GeluForward(static_cast<const float*>(in[0].device_raw()),
                                        static_cast<float*>(y->device_raw()), in[0].num_elements(), *tanh_form, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*y};
  };
  table[ir::OpKind::kGeluGrad].run = [](const KernelContext& ctx, const ir::Node& node,
                                    const std::vector<ir::Tensor>& in) -> std::optional<absl::StatusOr<std::vector<ir::Tensor>>> {
    const std::optional<bool> tanh_form = TanhForm(node);
    if (!tanh_form || in[0].dtype() != ir::DType::kF32 || in[1].dtype() != ir::DType::kF32 ||
        in[0].dims() != in[1].dims()) {
      return std::nullopt;
    }
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, ir::DType::kF32, in[1].dims());
    if (!dx.ok()) return dx.status();
    const absl::Status st =
        GeluBackward(static_cast<const float*>(in[0].device_raw()), static_cast<const float*>(in[1].device_raw()),
                     static_cast<float*>(dx->device_raw()), in[1].num_elements(), *tanh_form, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*dx};
  };
}

}  // namespace onnxpipe::cuda
