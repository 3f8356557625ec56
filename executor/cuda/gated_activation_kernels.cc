// GatedActivation and GatedActivationGrad (f32 or bf16; op.h) in the CUDA backend's kernel table
// (gated_activation.cu).
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/gated_activation.h"
#include "frontend/ir/gated_activation.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::cuda {
namespace {

// The node's activation when inputs [first, in.size()) share one dtype and dims; nullopt otherwise
// (the CPU kernel reports what does not fit).
std::optional<ir::GatedAct> Operands(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t first) {
  for (size_t i = first; i < in.size(); ++i)
    if (!in[i].defined() || in[i].dtype() != in[first].dtype() || in[i].dims() != in[first].dims()) return std::nullopt;
  return ir::GatedActOf(node.attrs);
}

// Y = GatedActivation(gate, up).
KernelResult Forward(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::GatedAct> act = Operands(node, in, 0);
  if (!act) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> y = ctx.FullOutput(node, 0, in[0].dtype(), in[0].dims());
    if (!y.ok()) return y.status();
    const absl::Status st = GatedActivationForward(*act, DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]),
                                                   DevicePtr<T>(*y), in[0].num_elements(), ctx.stream);
    if (!st.ok()) return st;
    return std::vector<ir::Tensor>{*y};
  });
}

// dGate, dUp = GatedActivationGrad(dY, gate, up), each only where the node has that output.
KernelResult Backward(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::GatedAct> act = Operands(node, in, 0);
  if (!act) return std::nullopt;
  return WithFloatElement(in[0].dtype(), [&](auto tag) -> KernelResult {
    using T = typename decltype(tag)::type;
    std::vector<ir::Tensor> outs(node.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      if (!WantsOutput(node, k)) continue;
      absl::StatusOr<ir::Tensor> g = ctx.FullOutput(node, static_cast<int>(k), in[0].dtype(), in[0].dims());
      if (!g.ok()) return g.status();
      outs[k] = *g;
    }
    T* dgate = outs.size() > 0 ? DevicePtr<T>(outs[0]) : nullptr;
    T* dup = outs.size() > 1 ? DevicePtr<T>(outs[1]) : nullptr;
    const absl::Status st =
        GatedActivationBackward(*act, DevicePtr<const T>(in[0]), DevicePtr<const T>(in[1]), DevicePtr<const T>(in[2]),
                                dgate, dup, in[0].num_elements(), ctx.stream);
    if (!st.ok()) return st;
    return outs;
  });
}

}  // namespace

void RegisterGatedActivationKernels(KernelTable& table) {
  table[ir::OpKind::kGatedActivation].run = Forward;
  table[ir::OpKind::kGatedActivationGrad].run = Backward;
}

}  // namespace onnxpipe::cuda
