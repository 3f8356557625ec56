// ReduceSum / ReduceMean / ReduceMax against numpy for many axes sets, keepdims, dtypes.
#include <cmath>
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

ir::Node ReduceNode(OpKind op, std::vector<int64_t> axes, int64_t keepdims, bool set_axes = true) {
  ir::Attrs a;
  if (set_axes) a.Set("axes", axes);
  a.Set("keepdims", keepdims);
  return MakeNode(op, 1, 1, a);
}

TEST(Reduce, MatchesNumpyOverAxesSetsAndDTypes) {
  const std::vector<std::vector<int64_t>> axes_sets = {{0}, {1}, {2}, {3}, {-1}, {0, 2}, {1, 3},
                                                       {0, 1}, {2, 3}, {1, 2}, {0, 1, 2, 3}, {0, 3}};
  const std::vector<std::pair<OpKind, std::string>> ops = {
      {OpKind::kReduceSum, "np.sum"}, {OpKind::kReduceMean, "np.mean"}, {OpKind::kReduceMax, "np.max"}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32}) {
    const bool is_int = dt == DType::kI64 || dt == DType::kI32;
    Tensor x = is_int ? RandInt(dt, {3, 4, 5, 6}, 21, -100, 100) : Rand(dt, {3, 4, 5, 6}, 21);
    std::map<std::string, Tensor> got;
    std::string code = "x = a['x']\n";
    for (size_t s = 0; s < axes_sets.size(); ++s) {
      for (int64_t keep : {0, 1}) {
        for (const auto& [op, fn] : ops) {
          const std::string key = std::string(ir::OpName(op)) + "_" + std::to_string(s) + "_" + std::to_string(keep);
          got[key] = Eval1(ReduceNode(op, axes_sets[s], keep), {x});
          std::string axes = "(";
          for (int64_t ax : axes_sets[s]) axes += std::to_string(ax) + ",";
          axes += ")";
          std::string expr = fn + "(x.astype(np.float64), axis=" + axes + ", keepdims=" + (keep ? "True" : "False") + ")";
          if (is_int && op == OpKind::kReduceMean) expr = "np.trunc(" + expr + ")";
          code += "out['" + key + "'] = np.asarray(" + expr + ").astype(x.dtype)\n";
        }
      }
    }
    auto ref = Numpy({{"x", x}}, code);
    for (const auto& [key, t] : got) {
      EXPECT_TRUE(AllClose(t, ref[key], is_int ? 0 : RelTol(dt), is_int ? 0 : 1e-5)) << key << " " << ir::DTypeName(dt);
    }
  }
}

TEST(Reduce, EmptyAxesReduceAllOrNoop) {
  Tensor x = Rand(DType::kF64, {2, 3}, 3);
  double sum = 0;
  for (int i = 0; i < 6; ++i) sum += x.data<double>()[i];
  Tensor all = Eval1(ReduceNode(OpKind::kReduceSum, {}, 0, /*set_axes=*/false), {x});
  EXPECT_EQ(all.dims(), std::vector<int64_t>{});
  EXPECT_NEAR(all.data<double>()[0], sum, 1e-12);
  Tensor kept = Eval1(ReduceNode(OpKind::kReduceSum, {}, 1, false), {x});
  EXPECT_EQ(kept.dims(), (std::vector<int64_t>{1, 1}));
  ir::Attrs noop;
  noop.Set("noop_with_empty_axes", int64_t{1});
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kReduceMean, 1, 1, noop), {x}).BitwiseEquals(x));
}

TEST(Reduce, EmptySetGivesTheIdentity) {
  Tensor x(DType::kF32, {2, 0, 3});
  Tensor s = Eval1(ReduceNode(OpKind::kReduceSum, {1}, 0), {x});
  Tensor m = Eval1(ReduceNode(OpKind::kReduceMax, {1}, 0), {x});
  Tensor mean = Eval1(ReduceNode(OpKind::kReduceMean, {1}, 0), {x});
  ASSERT_EQ(s.dims(), (std::vector<int64_t>{2, 3}));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(s.data<float>()[i], 0.f);
    EXPECT_EQ(m.data<float>()[i], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isnan(mean.data<float>()[i]));
  }
  // Keeping the empty dim gives an empty output.
  EXPECT_EQ(Eval1(ReduceNode(OpKind::kReduceSum, {0}, 1), {x}).num_elements(), 0);
}

TEST(Reduce, MaxPropagatesNaNAndChecksAxes) {
  const float nan = std::nanf("");
  Tensor x = Tensor::FromVector<float>({2, 3}, {1.f, nan, 3.f, 4.f, 5.f, 6.f});
  Tensor m = Eval1(ReduceNode(OpKind::kReduceMax, {1}, 0), {x});
  EXPECT_TRUE(std::isnan(m.data<float>()[0]));
  EXPECT_EQ(m.data<float>()[1], 6.f);
  EXPECT_FALSE(Eval(ReduceNode(OpKind::kReduceSum, {2}, 1), {x}).ok());
  EXPECT_FALSE(Eval(ReduceNode(OpKind::kReduceSum, {1, -1}, 1), {x}).ok());
}

TEST(Reduce, LongReductionIsAccurate) {
  // 1e6 copies of 0.1f: float accumulation would drift by ~1e-3 relative; ours is in double.
  Tensor x(DType::kF32, {1000000});
  std::fill_n(x.mutable_data<float>(), 1000000, 0.1f);
  Tensor s = Eval1(ReduceNode(OpKind::kReduceSum, {0}, 0), {x});
  EXPECT_NEAR(s.data<float>()[0], 1000000 * static_cast<double>(0.1f), 0.01);
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
