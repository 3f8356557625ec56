// Sin, Cos, Abs, Sign, Ceil, Min, Max kernels against numpy (float64 references), every dtype they
// take, with numpy broadcasting for Min/Max, NaN propagation, and Abs of the most negative integer.
#include <cmath>
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

TEST(MathOps, SinCosAbsMatchNumpy) {
  const std::vector<std::pair<OpKind, std::string>> ops = {
      {OpKind::kSin, "np.sin(x)"},   {OpKind::kCos, "np.cos(x)"}, {OpKind::kAbs, "np.abs(x)"},
      {OpKind::kSign, "np.sign(x)"}, {OpKind::kCeil, "np.ceil(x)"}};
  for (DType dt : FloatDTypes()) {
    std::map<std::string, Tensor> in;
    std::map<std::string, Tensor> got;
    std::string code;
    for (size_t c = 0; c < ops.size(); ++c) {
      const std::string name = std::string(ir::OpName(ops[c].first));
      in[name] = Rand(dt, {3, 257}, 40 + c, -7, 7);
      got[name] = Eval1(MakeNode(ops[c].first, 1), {in[name]});
      code += "x = a['" + name + "'].astype(np.float64)\nout['" + name + "'] = " + ops[c].second + "\n";
    }
    auto ref = Numpy(in, code);
    for (const auto& [name, t] : got) {
      EXPECT_TRUE(AllClose(t, ref[name].CastTo(dt), RelTol(dt), 1e-6)) << name << " " << ir::DTypeName(dt);
    }
  }
}

TEST(MathOps, AbsOfIntegers) {
  Tensor x = Tensor::FromVector<int64_t>({4}, {-3, 0, 5, std::numeric_limits<int64_t>::min()});
  Tensor y = Eval1(MakeNode(OpKind::kAbs, 1), {x});
  EXPECT_EQ(y.data<int64_t>()[0], 3);
  EXPECT_EQ(y.data<int64_t>()[1], 0);
  EXPECT_EQ(y.data<int64_t>()[2], 5);
  EXPECT_EQ(y.data<int64_t>()[3], std::numeric_limits<int64_t>::min());  // wraps, as numpy
}

// Sign at the points where it steps (0, -0, NaN) and of integers; Ceil at integers, halves and -0.5.
TEST(MathOps, SignAndCeilAtTheirSteps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = Tensor::FromVector<double>({7}, {-2.5, -0.5, -0.0, 0.0, 0.5, 3.0, nan});
  Tensor s = Eval1(MakeNode(OpKind::kSign, 1), {x});
  const std::vector<double> sign = {-1, -1, 0, 0, 1, 1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(s.data<double>()[i], sign[i]) << i;
  EXPECT_TRUE(std::isnan(s.data<double>()[6]));
  Tensor c = Eval1(MakeNode(OpKind::kCeil, 1), {x});
  const std::vector<double> ceil = {-2, -0.0, -0.0, 0, 1, 3};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.data<double>()[i], ceil[i]) << i;
  EXPECT_TRUE(std::signbit(c.data<double>()[1]));  // ceil(-0.5) is -0, as numpy's
  Tensor xi = Tensor::FromVector<int64_t>({4}, {-7, 0, 9, std::numeric_limits<int64_t>::min()});
  Tensor si = Eval1(MakeNode(OpKind::kSign, 1), {xi});
  EXPECT_EQ(si.dtype(), DType::kI64);
  const std::vector<int64_t> want = {-1, 0, 1, -1};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(si.data<int64_t>()[i], want[i]) << i;
}

TEST(MathOps, MinMaxBroadcastLikeNumpy) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}}, {{}, {2, 3}}, {{3, 1, 5}, {3, 7, 1}}, {{2, 0}, {1, 1}}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    const bool is_int = ir::IsInteger(dt);
    std::map<std::string, Tensor> in;
    std::map<std::string, Tensor> got;
    std::string code;
    for (size_t c = 0; c < shapes.size(); ++c) {
      const std::string s = std::to_string(c);
      in["x" + s] = is_int ? RandInt(dt, shapes[c].first, 60 + c, 0, 9) : Rand(dt, shapes[c].first, 60 + c);
      in["y" + s] = is_int ? RandInt(dt, shapes[c].second, 70 + c, 0, 9) : Rand(dt, shapes[c].second, 70 + c);
      got["min" + s] = Eval1(MakeNode(OpKind::kMin, 2), {in["x" + s], in["y" + s]});
      got["max" + s] = Eval1(MakeNode(OpKind::kMax, 2), {in["x" + s], in["y" + s]});
      code += "x, y = a['x" + s + "'], a['y" + s + "']\nout['min" + s + "'] = np.minimum(x, y)\nout['max" + s +
              "'] = np.maximum(x, y)\n";
    }
    auto ref = Numpy(in, code);
    for (const auto& [key, t] : got) EXPECT_TRUE(AllClose(t, ref[key], 0, 0)) << key << " " << ir::DTypeName(dt);
  }
}

TEST(MathOps, MinMaxPropagateNaNAndCheckDTypes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::FromVector<float>({3}, {nan, 1.f, 2.f});
  Tensor b = Tensor::FromVector<float>({3}, {0.f, nan, 3.f});
  for (OpKind op : {OpKind::kMin, OpKind::kMax}) {
    Tensor y = Eval1(MakeNode(op, 2), {a, b});
    EXPECT_TRUE(std::isnan(y.data<float>()[0]));
    EXPECT_TRUE(std::isnan(y.data<float>()[1]));
    EXPECT_EQ(y.data<float>()[2], op == OpKind::kMin ? 2.f : 3.f);
  }
  auto r = Eval(MakeNode(OpKind::kMin, 2, 1, {}, "/m/Min"), {a, Rand(DType::kF64, {3}, 1)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/m/Min"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
