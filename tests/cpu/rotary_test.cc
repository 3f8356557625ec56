// Rotary and RotaryGrad (op.h) against hand-computed values (tables that differ between the two
// elements of a pair, so every index is checked) and numpy on broadcast tables with a partial
// rotary; the gradient is checked as the adjoint of the forward: <Rotary(x), d> = <x, RotaryGrad(d)>.
#include <cmath>

#include "gtest/gtest.h"
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

ir::Node RotaryNode(OpKind op, int64_t rotary_dim, bool interleaved) {
  ir::Attrs a;
  a.Set("rotary_dim", rotary_dim);
  a.Set("interleaved", int64_t{interleaved ? 1 : 0});
  return MakeNode(op, 3, 1, a);
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.num_elements(); ++i) v.push_back(t.GetAsDouble(i));
  return v;
}

TEST(Rotary, HandComputedBothForms) {
  const Tensor x = Tensor::FromVector<double>({1, 4}, {1, 2, 3, 4});
  const Tensor cos = Tensor::FromVector<double>({1, 4}, {2, 3, 5, 7});
  const Tensor sin = Tensor::FromVector<double>({1, 4}, {11, 13, 17, 19});
  // rotate-half: y[i] = x[i] c[i] - x[i+2] s[i], y[i+2] = x[i+2] c[i+2] + x[i] s[i+2].
  EXPECT_EQ(Values(Eval1(RotaryNode(OpKind::kRotary, 4, false), {x, cos, sin})),
            (std::vector<double>{1 * 2 - 3 * 11, 2 * 3 - 4 * 13, 3 * 5 + 1 * 17, 4 * 7 + 2 * 19}));
  // interleaved: pairs (0, 1) and (2, 3).
  EXPECT_EQ(Values(Eval1(RotaryNode(OpKind::kRotary, 4, true), {x, cos, sin})),
            (std::vector<double>{1 * 2 - 2 * 11, 2 * 3 + 1 * 13, 3 * 5 - 4 * 17, 4 * 7 + 3 * 19}));
  // The transposes: dx[lo] = d[lo] c[lo] + d[hi] s[hi], dx[hi] = d[hi] c[hi] - d[lo] s[lo].
  EXPECT_EQ(Values(Eval1(RotaryNode(OpKind::kRotaryGrad, 4, false), {x, cos, sin})),
            (std::vector<double>{1 * 2 + 3 * 17, 2 * 3 + 4 * 19, 3 * 5 - 1 * 11, 4 * 7 - 2 * 13}));
  EXPECT_EQ(Values(Eval1(RotaryNode(OpKind::kRotaryGrad, 4, true), {x, cos, sin})),
            (std::vector<double>{1 * 2 + 2 * 13, 2 * 3 - 1 * 11, 3 * 5 + 4 * 19, 4 * 7 - 3 * 17}));
}

TEST(Rotary, PartialWithBroadcastTablesMatchesNumpy) {
  for (DType dt : FloatDTypes()) {
    for (bool interleaved : {false, true}) {
      // x (2, 3, 5, 10), rotary_dim 6, tables (2, 1, 5, 6): broadcast over the heads.
      const Tensor x = Rand(dt, {2, 3, 5, 10}, 1), cos = Rand(dt, {2, 1, 5, 6}, 2), sin = Rand(dt, {2, 1, 5, 6}, 3);
      const Tensor y = Eval1(RotaryNode(OpKind::kRotary, 6, interleaved), {x, cos, sin});
      auto ref = Numpy({{"x", x}, {"c", cos}, {"s", sin}},
                       std::string("x, c, s = (a[k].astype(np.float64) for k in 'xcs')\n"
                                   "xr = x[..., :6]\n") +
                           (interleaved ? "rot = np.stack((-xr[..., 1::2], xr[..., ::2]), -1).reshape(xr.shape)\n"
                                        : "rot = np.concatenate((-xr[..., 3:], xr[..., :3]), -1)\n") +
                           "out['y'] = np.concatenate((xr * c + rot * s, x[..., 6:]), -1)\n");
      EXPECT_TRUE(AllClose(y, ref["y"].CastTo(dt), RelTol(dt), 1e-6)) << ir::DTypeName(dt) << " " << interleaved;
    }
  }
}

TEST(Rotary, GradientIsTheAdjoint) {
  for (bool interleaved : {false, true}) {
    // GPT-J's layout: x (2, 5, 3, 8) and tables (2, 5, 1, 4).
    const Tensor x = Rand(DType::kF64, {2, 5, 3, 8}, 4), d = Rand(DType::kF64, {2, 5, 3, 8}, 5);
    const Tensor cos = Rand(DType::kF64, {2, 5, 1, 4}, 6), sin = Rand(DType::kF64, {2, 5, 1, 4}, 7);
    const Tensor y = Eval1(RotaryNode(OpKind::kRotary, 4, interleaved), {x, cos, sin});
    const Tensor dx = Eval1(RotaryNode(OpKind::kRotaryGrad, 4, interleaved), {d, cos, sin});
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < x.num_elements(); ++i) {
      lhs += y.GetAsDouble(i) * d.GetAsDouble(i);
      rhs += x.GetAsDouble(i) * dx.GetAsDouble(i);
    }
    EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs) + 1e-12) << interleaved;
  }
}

TEST(Rotary, RejectsTablesThatDoNotFit) {
  const Tensor x = Rand(DType::kF32, {2, 8}, 1);
  EXPECT_FALSE(
      Eval(RotaryNode(OpKind::kRotary, 4, false), {x, Rand(DType::kF32, {2, 6}, 2), Rand(DType::kF32, {2, 6}, 3)})
          .ok());
  EXPECT_FALSE(
      Eval(RotaryNode(OpKind::kRotary, 4, false), {x, Rand(DType::kF32, {3, 4}, 2), Rand(DType::kF32, {3, 4}, 3)})
          .ok());
  EXPECT_FALSE(
      Eval(RotaryNode(OpKind::kRotary, 5, false), {x, Rand(DType::kF32, {5}, 2), Rand(DType::kF32, {5}, 3)}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
