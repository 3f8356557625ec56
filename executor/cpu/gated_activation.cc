// GatedActivation and GatedActivationGrad (op.h): Y = act(gate) * up, and dGate = dY * up *
// act'(gate), dUp = dY * act(gate), each one parallel pass over the elements with the activation
// chosen once outside the loop. The forward computes act(gate) exactly as the unfused Sigmoid/Mul or
// Gelu kernel would, then the product, so a fused f32/f64 graph gives the unfused graph's bits.
#include "frontend/ir/gated_activation.h"

#include <vector>

#include "executor/cpu/activation.h"
#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

constexpr int64_t kGrain = 1 << 14;

// The activation and its derivative for `act`, as stateless functors.
template <typename T>
struct SiluFns {
  static T Value(T x) { return Silu(x); }
  static T Derivative(T x) { return SiluDerivative(x); }
};
template <typename T>
struct GeluErfFns {
  static T Value(T x) { return GeluErf(x); }
  static T Derivative(T x) { return GeluErfDerivative(x); }
};
template <typename T>
struct GeluTanhFns {
  static T Value(T x) { return GeluTanh(x); }
  static T Derivative(T x) { return GeluTanhDerivative(x); }
};

// f(Fns{}) with the functors of `act`.
template <typename T, typename F>
auto WithActivation(ir::GatedAct act, F&& f) {
  switch (act) {
    case ir::GatedAct::kSilu:
      return f(SiluFns<T>{});
    case ir::GatedAct::kGeluErf:
      return f(GeluErfFns<T>{});
    case ir::GatedAct::kGeluTanh:
      break;
  }
  return f(GeluTanhFns<T>{});
}

// The node's activation, and gate and up (inputs first, first + 1) of one dtype and dims.
absl::StatusOr<ir::GatedAct> CheckOperands(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t first) {
  const std::optional<ir::GatedAct> act = ir::GatedActOf(node.attrs);
  if (!act)
    return INVALID_ARGUMENT() << Describe(node) << ": attributes " << node.attrs.ToString()
                              << " name no gated activation (op.h)";
  for (size_t i = 0; i < first + 2; ++i) {
    if (in[i].dims() != in[first].dims() || in[i].dtype() != in[first].dtype())
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " " << ir::DTypeName(in[i].dtype())
                                << DimsToString(in[i].dims()) << " and input " << first << " "
                                << ir::DTypeName(in[first].dtype()) << DimsToString(in[first].dims())
                                << " must have one dtype and shape";
  }
  return *act;
}

Outputs GatedActivationKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(const ir::GatedAct act, CheckOperands(node, in, 0));
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
    const T *gate = in[0].data<T>(), *up = in[1].data<T>();
    T* y = out.mutable_data<T>();
    WithActivation<T>(act, [&](auto fns) {
      using Fns = decltype(fns);
      ParallelFor(out.num_elements(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) y[i] = Fns::Value(gate[i]) * up[i];
      });
    });
    return std::vector<ir::Tensor>{out};
  });
}

// Inputs (dY, gate, up); either output may be absent (op.h).
Outputs GatedActivationGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(const ir::GatedAct act, CheckOperands(node, in, 1));
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    std::vector<ir::Tensor> outs(node.outputs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      if (!WantsOutput(node, k)) continue;
      ASSIGN_OR_RETURN(outs[k], AllocOutput(node, ctx, static_cast<int>(k), in[0].dtype(), in[0].dims()));
    }
    const T *dy = in[0].data<T>(), *gate = in[1].data<T>(), *up = in[2].data<T>();
    T* dgate = outs[0].defined() ? outs[0].mutable_data<T>() : nullptr;
    T* dup = outs.size() > 1 && outs[1].defined() ? outs[1].mutable_data<T>() : nullptr;
    WithActivation<T>(act, [&](auto fns) {
      using Fns = decltype(fns);
      ParallelFor(in[0].num_elements(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if (dgate != nullptr) dgate[i] = dy[i] * up[i] * Fns::Derivative(gate[i]);
          if (dup != nullptr) dup[i] = dy[i] * Fns::Value(gate[i]);
        }
      });
    });
    return outs;
  });
}

}  // namespace

REGISTER_CPU_KERNEL(kGatedActivation, GatedActivationKernel);
REGISTER_CPU_KERNEL(kGatedActivationGrad, GatedActivationGradKernel);

}  // namespace onnxpipe::cpu
