// Unary kernels, Gelu, Cast, Not, Identity against numpy (float64 references) and hand values.
#include <cmath>
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

struct UnaryCase {
  OpKind op;
  const char* numpy;  // expression of x (float64)
  double lo, hi;
};

TEST(Elementwise, UnaryFloatOpsMatchNumpy) {
  const std::vector<UnaryCase> cases = {
      {OpKind::kSqrt, "np.sqrt(x)", 0.01, 4},
      {OpKind::kReciprocal, "1.0 / x", 0.25, 4},
      {OpKind::kNeg, "-x", -3, 3},
      {OpKind::kExp, "np.exp(x)", -5, 5},
      {OpKind::kLog, "np.log(x)", 0.01, 10},
      {OpKind::kErf, "np.vectorize(math.erf)(x)", -3, 3},
      {OpKind::kTanh, "np.tanh(x)", -4, 4},
      {OpKind::kRelu, "np.maximum(x, 0)", -3, 3},
      {OpKind::kSigmoid, "1 / (1 + np.exp(-x))", -30, 30},
  };
  for (DType dt : FloatDTypes()) {
    std::map<std::string, Tensor> in;
    std::string code = "import math\n";
    std::vector<Tensor> got;
    for (size_t c = 0; c < cases.size(); ++c) {
      Tensor x = Rand(dt, {3, 257}, 100 + c, cases[c].lo, cases[c].hi);
      const std::string name = "x" + std::to_string(c);
      in[name] = x;
      code += "x = a['" + name + "'].astype(np.float64)\nout['" + name + "'] = " + cases[c].numpy + "\n";
      got.push_back(Eval1(MakeNode(cases[c].op, 1), {x}));
    }
    auto ref = Numpy(in, code);
    for (size_t c = 0; c < cases.size(); ++c) {
      EXPECT_TRUE(AllClose(got[c], ref["x" + std::to_string(c)].CastTo(dt), RelTol(dt), 1e-6))
          << ir::OpName(cases[c].op) << " " << ir::DTypeName(dt);
    }
  }
}

TEST(Elementwise, SigmoidIsStableForLargeMagnitudes) {
  Tensor x = Tensor::FromVector<float>({4}, {-1000.f, -90.f, 90.f, 1000.f});
  Tensor y = Eval1(MakeNode(OpKind::kSigmoid, 1), {x});
  EXPECT_EQ(y.data<float>()[0], 0.f);
  EXPECT_FALSE(std::isnan(y.data<float>()[1]));
  EXPECT_EQ(y.data<float>()[2], 1.f);
  EXPECT_EQ(y.data<float>()[3], 1.f);
}

TEST(Elementwise, ReluKeepsNaNAndSupportsIntegers) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor y = Eval1(MakeNode(OpKind::kRelu, 1), {Tensor::FromVector<float>({3}, {nan, -1.f, 2.f})});
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 0.f);
  Tensor yi = Eval1(MakeNode(OpKind::kRelu, 1), {I64Vec({-5, 0, 7})});
  EXPECT_EQ(yi.ToInt64Vector(), (std::vector<int64_t>{0, 0, 7}));
}

TEST(Elementwise, NegIntegersWrapAtTheMinimum) {
  Tensor y = Eval1(MakeNode(OpKind::kNeg, 1),
                   {Tensor::FromVector<int32_t>({3}, {5, -7, std::numeric_limits<int32_t>::min()})});
  EXPECT_EQ(y.dtype(), DType::kI32);
  EXPECT_EQ(y.ToInt64Vector(), (std::vector<int64_t>{-5, 7, std::numeric_limits<int32_t>::min()}));
}

TEST(Elementwise, GeluBothFormsMatchTheirDefinitions) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {1000}, 7, -5, 5);
    ir::Attrs exact, tanh_form;
    tanh_form.Set("approximate", std::string("tanh"));
    Tensor y_erf = Eval1(MakeNode(OpKind::kGelu, 1, 1, exact), {x});
    Tensor y_tanh = Eval1(MakeNode(OpKind::kGelu, 1, 1, tanh_form), {x});
    auto ref = Numpy({{"x", x}},
                     "import math\nx = a['x'].astype(np.float64)\n"
                     "out['erf'] = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))\n"
                     "out['tanh'] = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))\n");
    EXPECT_TRUE(AllClose(y_erf, ref["erf"].CastTo(dt), RelTol(dt), 1e-6)) << ir::DTypeName(dt);
    EXPECT_TRUE(AllClose(y_tanh, ref["tanh"].CastTo(dt), RelTol(dt), 1e-6)) << ir::DTypeName(dt);
  }
  // Hand value: gelu(1) = Phi(1) = 0.8413447460685429.
  Tensor one = Eval1(MakeNode(OpKind::kGelu, 1), {Tensor::FromVector<double>({1}, {1.0})});
  EXPECT_NEAR(one.data<double>()[0], 0.8413447460685429, 1e-15);
  ir::Attrs bad;
  bad.Set("approximate", std::string("fast"));
  auto r = Eval(MakeNode(OpKind::kGelu, 1, 1, bad), {one});
  EXPECT_FALSE(r.ok());
}

TEST(Elementwise, FloatOnlyOpsRejectIntegersNamingOpAndDType) {
  auto r = Eval(MakeNode(OpKind::kExp, 1, 1, {}, "/layer/Exp"), {I64Vec({1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("Exp node '/layer/Exp'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("i64"), std::string::npos) << r.status();
  // (bf16 and f16 are computed through f32: half_test.cc.)
  auto b = Eval(MakeNode(OpKind::kSoftmax, 1), {Tensor(DType::kI32, {2})});
  EXPECT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("i32"), std::string::npos) << b.status();
}

TEST(Elementwise, NotAndIdentity) {
  Tensor b = Tensor::FromVector<bool>({3}, {true, false, true});
  Tensor y = Eval1(MakeNode(OpKind::kNot, 1), {b});
  EXPECT_EQ(y.ToInt64Vector(), (std::vector<int64_t>{0, 1, 0}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kNot, 1), {I64Vec({1})}).ok());
  Tensor x = Rand(DType::kF32, {2, 3}, 1);
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kIdentity, 1), {x}).BitwiseEquals(x));
}

ir::Node CastNode(const std::string& to) {
  ir::Attrs a;
  a.Set("to", to);
  return MakeNode(OpKind::kCast, 1, 1, a);
}

TEST(Elementwise, CastMatchesNumpyAstype) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = Tensor::FromVector<double>({8}, {-2.7, -0.5, 0.0, 0.4, 1.5, 3.99, 1e10, -inf});
  // Finite in-range values: truncation toward zero, as numpy's astype.
  Tensor xi = Tensor::FromVector<double>({6}, {-2.7, -0.5, 0.0, 0.4, 1.5, 3.99});
  auto ref = Numpy({{"x", xi}, {"i", I64Vec({-3, 0, 5, 1 << 30})}},
                   "out['i64'] = a['x'].astype(np.int64)\nout['i32'] = a['x'].astype(np.int32)\n"
                   "out['f32'] = a['x'].astype(np.float32)\nout['b'] = a['x'].astype(np.bool_)\n"
                   "out['if'] = a['i'].astype(np.float32)\nout['ib'] = a['i'].astype(np.bool_)\n"
                   "out['ii'] = a['i'].astype(np.int32)\n");
  EXPECT_TRUE(AllClose(Eval1(CastNode("i64"), {xi}), ref["i64"], 0, 0));
  EXPECT_TRUE(AllClose(Eval1(CastNode("i32"), {xi}), ref["i32"], 0, 0));
  EXPECT_TRUE(Eval1(CastNode("f32"), {xi}).BitwiseEquals(ref["f32"]));
  EXPECT_TRUE(Eval1(CastNode("bool"), {xi}).BitwiseEquals(ref["b"]));
  EXPECT_TRUE(Eval1(CastNode("f32"), {I64Vec({-3, 0, 5, 1 << 30})}).BitwiseEquals(ref["if"]));
  EXPECT_TRUE(Eval1(CastNode("bool"), {I64Vec({-3, 0, 5, 1 << 30})}).BitwiseEquals(ref["ib"]));
  EXPECT_TRUE(Eval1(CastNode("i32"), {I64Vec({-3, 0, 5, 1 << 30})}).BitwiseEquals(ref["ii"]));
  // Out of range saturates, NaN gives 0 (undefined in ONNX; never undefined behaviour here).
  Tensor sat = Eval1(CastNode("i32"), {x});
  EXPECT_EQ(sat.data<int32_t>()[6], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(sat.data<int32_t>()[7], std::numeric_limits<int32_t>::min());
  Tensor nan = Eval1(CastNode("i64"), {Tensor::FromVector<float>({1}, {std::nanf("")})});
  EXPECT_EQ(nan.data<int64_t>()[0], 0);
  // Bool -> float and the identity cast.
  Tensor bf = Eval1(CastNode("f64"), {Tensor::FromVector<bool>({2}, {true, false})});
  EXPECT_EQ(bf.data<double>()[0], 1.0);
  EXPECT_EQ(bf.data<double>()[1], 0.0);
  // bf16 through the scalar converter: 1.5 is exact.
  Tensor h = Eval1(CastNode("bf16"), {Tensor::FromVector<float>({1}, {1.5f})});
  EXPECT_EQ(h.dtype(), DType::kBF16);
  EXPECT_EQ(Eval1(CastNode("f32"), {h}).data<float>()[0], 1.5f);
  auto bad = Eval(CastNode("string"), {xi});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("string"), std::string::npos);
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
