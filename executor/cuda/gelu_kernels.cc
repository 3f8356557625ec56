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

// dXSums' dtype (attr sums_to, default dX's): f32, bf16 or f16 (what the reduction writes), else nullopt.
std::optional<ir::DType> SumsDType(const ir::Node& node, ir::DType dx) {
  const std::optional<ir::DType> t =
      ir::ParseDType(node.attrs.Get<std::string>("sums_to", std::string(ir::DTypeName(dx))));
  if (!t || (*t != ir::DType::kF32 && *t != ir::DType::kBF16 && *t != ir::DType::kF16)) return std::nullopt;
  return t;
}

// (rows, cols) of dims viewed as rows of their last dim (rank >= 1).
std::pair<int64_t, int64_t> RowsAndCols(const std::vector<int64_t>& dims) {
  const int64_t cols = dims.back();
  return {cols == 0 ? 0 : ir::ElementCount(dims) / cols, cols};
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
  const std::optional<ir::DType> sums_dtype = SumsDType(node, in[0].dtype());
  if (WantsOutput(node, 1) && (!sums_dtype || in[1].rank() == 0)) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> dx = ctx.FullOutput(node, 0, in[0].dtype(), in[1].dims());
    if (!dx.ok()) return dx.status();
    const uint8_t* bits = has_bits ? DevicePtr<const uint8_t>(in[2]) : nullptr;
    if (!WantsOutput(node, 1)) {
      const absl::Status st = GeluBackward(DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<T>(*dx),
                                           in[1].num_elements(), *tanh_form, &*drop, bits, ctx.stream);
      if (!st.ok()) return st;
      return std::vector<ir::Tensor>{*dx};
    }
    const auto [rows, cols] = RowsAndCols(in[1].dims());
    absl::StatusOr<ir::Tensor> sums = ctx.FullOutput(node, 1, *sums_dtype, {cols});
    if (!sums.ok()) return sums.status();
    absl::StatusOr<void*> ws = ctx.Workspace(node, GeluSumsWorkspaceBytes(rows, cols));
    if (!ws.ok()) return ws.status();
    const absl::Status st =
        GeluBackwardWithSums(DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<T>(*dx), rows, cols,
                             *tanh_form, &*drop, bits, *sums_dtype, sums->device_raw(), *ws, ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*dx, *sums};
  });
}

// GeluGrad's scratch: the parts' column sums when dXSums is wanted.
int64_t GeluGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<std::vector<int64_t>> x = InputDims(g, node, 1);
  if (!WantsOutput(node, 1) || !x || x->empty()) return 0;
  const auto [rows, cols] = RowsAndCols(*x);
  return GeluSumsWorkspaceBytes(rows, cols);
}

}  // namespace

void RegisterGeluKernels(KernelTable& table) {
  table[ir::OpKind::kGelu].run = Gelu;
  table[ir::OpKind::kGeluGrad] = {GeluGrad, GeluGradWorkspace};
}

}  // namespace onnxpipe::cuda
