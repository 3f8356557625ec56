// Gelu and GeluGrad (f32 or bf16, erf or tanh form, with a fused dropout: op.h) in the CUDA backend's kernel
// table (gelu.cu).
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/gelu.h"
#include "frontend/ir/shape.h"
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

// Y = Gelu(X), with its fused dropout and, when asked for, its keep bits (output 1).
KernelResult Gelu(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<bool> tanh_form = TanhForm(node);
  const std::optional<DropoutParams> drop = FusedDropout(ctx, node, in[0].num_elements());
  const bool wants_bits = node.outputs.size() > 1 && node.outputs[1] != ir::kNoValue;
  const std::optional<std::vector<int64_t>> bits_dims = ir::KeepBitsDims(in[0].dims());
  if (!tanh_form || !drop || (wants_bits && !bits_dims)) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, in[0].dtype(), in[0].dims());
    if (!y.ok()) return y.status();
    ir::Tensor bits;
    if (wants_bits) {
      absl::StatusOr<ir::Tensor> b = ctx.FullOutput(node, 1, ir::DType::kU8, *bits_dims);
      if (!b.ok()) return b.status();
      bits = *b;
    }
    const absl::Status st =
        GeluForward(DevicePtr<const T>(in[0]), DevicePtr<T>(*y), in[0].num_elements(), *tanh_form, &*drop,
                    bits.defined() ? DevicePtr<uint8_t>(bits) : nullptr, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*y, bits};
  });
}

// dX = GeluGrad(dY, X, keep_bits?), with the forward's fused dropout.
KernelResult GeluGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<bool> tanh_form = TanhForm(node);
  const std::optional<DropoutParams> drop = FusedDropout(ctx, node, in[0].num_elements());
  if (!tanh_form || !drop || in[0].dtype() != in[1].dtype() || in[0].dims() != in[1].dims()) return std::nullopt;
  const bool has_bits = in.size() > 2 && in[2].defined();
  if (has_bits && (in[2].dtype() != ir::DType::kU8 || ir::KeepBitsDims(in[1].dims()) != in[2].dims())) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, in[0].dtype(), in[1].dims());
    if (!dx.ok()) return dx.status();
    const absl::Status st =
        GeluBackward(DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<T>(*dx), in[1].num_elements(),
                     *tanh_form, &*drop, has_bits ? DevicePtr<const uint8_t>(in[2]) : nullptr, ctx.stream);
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
