// GatedActivation and GatedActivationGrad (op.h) against numpy in float64: the forward as torch
// defines silu and gelu (math.erf for the exact GELU), the backward against central differences of
// that forward (an independent derivative), f32 and f64; either gradient alone; bf16 computed in f32
// and rounded once; and the operand checks.
#include <cmath>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

struct Act {
  const char* activation;
  const char* approximate;  // nullptr: absent
  const char* numpy;        // f(x) in float64 numpy
};

const Act kActs[] = {
    {"silu", nullptr, "x / (1 + np.exp(-x))"},
    {"gelu", "none", "0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))"},
    {"gelu", "tanh", "0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))"},
};

ir::Attrs AttrsOf(const Act& a) {
  ir::Attrs attrs;
  attrs.Set("activation", std::string(a.activation));
  if (a.approximate != nullptr) attrs.Set("approximate", std::string(a.approximate));
  return attrs;
}

// out['y'] = f(g) * u, out['dg'], out['du'] from dy by central differences of f (h = 1e-5).
std::map<std::string, Tensor> Reference(const Act& a, const Tensor& dy, const Tensor& gate, const Tensor& up) {
  return Numpy({{"dy", dy}, {"g", gate}, {"u", up}},
               std::string("import math\n"
                           "def f(x):\n    return ") +
                   a.numpy +
                   "\n"
                   "g, u, dy = (a[k].astype(np.float64) for k in ('g', 'u', 'dy'))\n"
                   "h = 1e-5\n"
                   "out['y'] = f(g) * u\n"
                   "out['dg'] = dy * u * (f(g + h) - f(g - h)) / (2 * h)\n"
                   "out['du'] = dy * f(g)\n");
}

TEST(GatedActivation, ForwardAndBackwardMatchNumpy) {
  for (const Act& a : kActs) {
    for (DType dt : FloatDTypes()) {
      SCOPED_TRACE(std::string(a.activation) + " " + (a.approximate ? a.approximate : "") + " " +
                   std::string(ir::DTypeName(dt)));
      const Tensor gate = Rand(dt, {2, 3, 40}, 1, -6, 6), up = Rand(dt, {2, 3, 40}, 2), dy = Rand(dt, {2, 3, 40}, 3);
      auto ref = Reference(a, dy, gate, up);
      // f32's 1 + erf(x) and 1 + tanh(u) cancel for x near -6 (as torch's f32 kernels do): an absolute error
      // of a few |x| ulps of 1.
      const double atol = dt == DType::kF32 ? 1e-6 : 1e-12;
      const Tensor y = Eval1(MakeNode(OpKind::kGatedActivation, 2, 1, AttrsOf(a)), {gate, up});
      EXPECT_TRUE(AllClose(y, ref["y"].CastTo(dt), RelTol(dt), atol));
      absl::StatusOr<std::vector<Tensor>> g =
          Eval(MakeNode(OpKind::kGatedActivationGrad, 3, 2, AttrsOf(a)), {dy, gate, up});
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_EQ(g->size(), 2u);
      // Central differences: truncation O(h^2), float64 cancellation about 1e-16 / h.
      EXPECT_TRUE(AllClose((*g)[0], ref["dg"].CastTo(dt), std::max(RelTol(dt), 1e-8), std::max(atol, 1e-9))) << "dGate";
      EXPECT_TRUE(AllClose((*g)[1], ref["du"].CastTo(dt), RelTol(dt), atol)) << "dUp";
    }
  }
}

TEST(GatedActivation, EitherGradientAlone) {
  const Act& a = kActs[0];
  const Tensor gate = Rand(DType::kF64, {5, 7}, 4, -4, 4), up = Rand(DType::kF64, {5, 7}, 5),
               dy = Rand(DType::kF64, {5, 7}, 6);
  absl::StatusOr<std::vector<Tensor>> both =
      Eval(MakeNode(OpKind::kGatedActivationGrad, 3, 2, AttrsOf(a)), {dy, gate, up});
  ASSERT_TRUE(both.ok()) << both.status();
  // dUp alone: output 0 absent.
  ir::Node up_only = MakeNode(OpKind::kGatedActivationGrad, 3, 2, AttrsOf(a));
  up_only.outputs[0] = ir::kNoValue;
  absl::StatusOr<std::vector<Tensor>> u = Eval(up_only, {dy, gate, up});
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FALSE((*u)[0].defined());
  EXPECT_TRUE(AllClose((*u)[1], (*both)[1], 0, 0));
  // dGate alone: one output.
  const Tensor dg = Eval1(MakeNode(OpKind::kGatedActivationGrad, 3, 1, AttrsOf(a)), {dy, gate, up});
  EXPECT_TRUE(AllClose(dg, (*both)[0], 0, 0));
}

// A bf16 node computes in f32 on the widened inputs and rounds each output once (cpu_evaluator.h).
TEST(GatedActivation, Bf16IsTheF32ResultRoundedOnce) {
  for (const Act& a : kActs) {
    const Tensor gate = Rand(DType::kF32, {4, 24}, 7, -5, 5).CastTo(DType::kBF16),
                 up = Rand(DType::kF32, {4, 24}, 8).CastTo(DType::kBF16),
                 dy = Rand(DType::kF32, {4, 24}, 9).CastTo(DType::kBF16);
    const Tensor y = Eval1(MakeNode(OpKind::kGatedActivation, 2, 1, AttrsOf(a)), {gate, up});
    const Tensor y32 =
        Eval1(MakeNode(OpKind::kGatedActivation, 2, 1, AttrsOf(a)), {gate.CastTo(DType::kF32), up.CastTo(DType::kF32)});
    ASSERT_EQ(y.dtype(), DType::kBF16);
    EXPECT_TRUE(AllClose(y, y32.CastTo(DType::kBF16), 0, 0)) << a.activation;
    absl::StatusOr<std::vector<Tensor>> g =
        Eval(MakeNode(OpKind::kGatedActivationGrad, 3, 2, AttrsOf(a)), {dy, gate, up});
    absl::StatusOr<std::vector<Tensor>> g32 =
        Eval(MakeNode(OpKind::kGatedActivationGrad, 3, 2, AttrsOf(a)),
             {dy.CastTo(DType::kF32), gate.CastTo(DType::kF32), up.CastTo(DType::kF32)});
    ASSERT_TRUE(g.ok() && g32.ok());
    for (int k = 0; k < 2; ++k) EXPECT_TRUE(AllClose((*g)[k], (*g32)[k].CastTo(DType::kBF16), 0, 0)) << k;
  }
}

TEST(GatedActivation, RefusesMisfitOperandsAndUnknownActivations) {
  const Tensor a = Rand(DType::kF32, {3, 4}, 1), b = Rand(DType::kF32, {1, 4}, 2);
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatedActivation, 2, 1, AttrsOf(kActs[0])), {a, b}).ok());  // no broadcast
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatedActivation, 2, 1, AttrsOf(kActs[0])), {a, a.CastTo(DType::kF64)}).ok());
  ir::Attrs relu;
  relu.Set("activation", std::string("relu"));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatedActivation, 2, 1, relu), {a, a}).ok());
  ir::Attrs silu_tanh = AttrsOf(kActs[0]);
  silu_tanh.Set("approximate", std::string("tanh"));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGatedActivation, 2, 1, silu_tanh), {a, a}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
