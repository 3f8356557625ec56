// Broadcasting binary/ternary kernels against numpy.
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>& BroadcastShapes() {
  static const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> v = {
      {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}},       {{2, 3, 4}, {}},        {{}, {2, 3, 4}},
      {{2, 1, 4}, {1, 3, 1}}, {{5, 1}, {1, 6}},       {{3, 1, 5}, {3, 7, 1}}, {{1}, {7}},
      {{4, 3, 2}, {3, 1}},    {{2, 3, 0}, {1, 3, 1}}, {{64, 65}, {64, 1}},   {{2, 2, 2, 3}, {2, 1, 2, 1}},
  };
  return v;
}

TEST(Binary, ArithmeticBroadcastsLikeNumpyForEveryDType) {
  const std::vector<std::pair<OpKind, std::string>> ops = {
      {OpKind::kAdd, "x + y"}, {OpKind::kSub, "x - y"}, {OpKind::kMul, "x * y"}, {OpKind::kDiv, "DIV"}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    const bool is_int = ir::IsInteger(dt);  // integer results wrap on overflow, as numpy's
    std::map<std::string, Tensor> in;
    std::map<std::string, Tensor> got;
    std::string code;
    int c = 0;
    for (const auto& [sa, sb] : BroadcastShapes()) {
      Tensor x = is_int ? RandInt(dt, sa, 10 + c, -50, 50) : Rand(dt, sa, 10 + c);
      Tensor y = is_int ? RandInt(dt, sb, 20 + c, 1, 9) : Rand(dt, sb, 20 + c, 0.5, 2);
      const std::string s = std::to_string(c);
      in["x" + s] = x;
      in["y" + s] = y;
      for (const auto& [op, expr] : ops) {
        const std::string key = std::string(ir::OpName(op)) + s;
        got[key] = Eval1(MakeNode(op, 2), {x, y});
        std::string e = expr;
        if (e == "DIV") e = is_int ? "np.trunc(x / y).astype(x.dtype)" : "x / y";
        code += "x, y = a['x" + s + "'], a['y" + s + "']\nout['" + key + "'] = (" + e + ").astype(x.dtype)\n";
      }
      ++c;
    }
    auto ref = Numpy(in, code);
    for (const auto& [key, t] : got) {
      EXPECT_TRUE(AllClose(t, ref[key], is_int ? 0 : RelTol(dt) / 4, 0)) << key << " " << ir::DTypeName(dt);
    }
  }
}

TEST(Binary, ShapeAndDTypeErrorsNameTheNode) {
  auto r = Eval(MakeNode(OpKind::kAdd, 2, 1, {}, "/blk/Add"), {Rand(DType::kF32, {2, 3}, 1), Rand(DType::kF32, {4}, 2)});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Add node '/blk/Add'"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("[2,3] and [4]"), std::string::npos) << r.status();
  auto m = Eval(MakeNode(OpKind::kMul, 2), {Rand(DType::kF32, {2}, 1), Rand(DType::kF64, {2}, 2)});
  EXPECT_FALSE(m.ok());
  auto b = Eval(MakeNode(OpKind::kAdd, 2), {Tensor::FromVector<bool>({1}, {true}), Tensor::FromVector<bool>({1}, {true})});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("bool"), std::string::npos);
}

TEST(Binary, IntegerDivisionTruncatesAndRejectsZero) {
  Tensor x = I64Vec({7, -7, 7, -7, std::numeric_limits<int64_t>::min()});
  Tensor y = I64Vec({2, 2, -2, -2, -1});
  Tensor q = Eval1(MakeNode(OpKind::kDiv, 2), {x, y});
  EXPECT_EQ(q.ToInt64Vector(), (std::vector<int64_t>{3, -3, -3, 3, std::numeric_limits<int64_t>::min()}));
  auto r = Eval(MakeNode(OpKind::kDiv, 2), {I64Vec({1, 2}), I64Vec({1, 0})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("division by zero"), std::string::npos);
  auto m = Eval(MakeNode(OpKind::kMod, 2), {I64Vec({1}), I64Vec({0})});
  EXPECT_FALSE(m.ok());
}

TEST(Binary, ModFollowsPythonOrC) {
  Tensor x = I64Vec({7, -7, 7, -7, 0, 5});
  Tensor y = I64Vec({3, 3, -3, -3, 4, -1});
  ir::Attrs c_mode;
  c_mode.Set("fmod", int64_t{1});
  auto ref = Numpy({{"x", x}, {"y", y}}, "out['py'] = np.mod(a['x'], a['y'])\nout['c'] = np.fmod(a['x'], a['y'])\n");
  EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kMod, 2), {x, y}), ref["py"], 0, 0));
  EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kMod, 2, 1, c_mode), {x, y}), ref["c"], 0, 0));
  for (DType dt : {DType::kI32, DType::kI8, DType::kU8}) {
    Tensor xs = x.CastTo(dt), ys = Eval1(MakeNode(OpKind::kMul, 2), {y, y}).CastTo(dt);  // positive divisors
    auto r = Numpy({{"x", xs}, {"y", ys}}, "out['py'] = np.mod(a['x'], a['y'])\nout['c'] = np.fmod(a['x'], a['y'])\n");
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kMod, 2), {xs, ys}).BitwiseEquals(r["py"])) << ir::DTypeName(dt);
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kMod, 2, 1, c_mode), {xs, ys}).BitwiseEquals(r["c"])) << ir::DTypeName(dt);
  }
  for (DType dt : FloatDTypes()) {
    Tensor xf = Rand(dt, {3, 4}, 3, -10, 10), yf = Rand(dt, {4}, 4, 0.5, 3);
    auto rf = Numpy({{"x", xf}, {"y", yf}}, "out['r'] = np.fmod(a['x'], a['y'])\n");
    EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kMod, 2, 1, c_mode), {xf, yf}), rf["r"], 1e-6, 1e-6));
    // ONNX requires fmod = 1 for floats.
    EXPECT_FALSE(Eval(MakeNode(OpKind::kMod, 2), {xf, yf}).ok());
  }
}

TEST(Binary, PowWithMixedExponentTypes) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {2, 5}, 5, 0.1, 3);
    Tensor yf = Rand(dt, {5}, 6, -2, 2);
    Tensor yi = I64Vec({0, 1, 2, 3, -1});
    auto ref = Numpy({{"x", x}, {"yf", yf}, {"yi", yi}},
                     "x = a['x'].astype(np.float64)\nout['f'] = x ** a['yf'].astype(np.float64)\n"
                     "out['i'] = x ** a['yi'].astype(np.float64)\n");
    EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kPow, 2), {x, yf}), ref["f"].CastTo(dt), RelTol(dt), 0));
    EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kPow, 2), {x, yi}), ref["i"].CastTo(dt), RelTol(dt), 0));
  }
  Tensor p = Eval1(MakeNode(OpKind::kPow, 2), {I64Vec({2, 3, -2, 5}), I64Vec({10, 3, 3, -1})});
  EXPECT_EQ(p.ToInt64Vector(), (std::vector<int64_t>{1024, 27, -8, 0}));
}

TEST(Binary, ComparisonsAndLogic) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    Tensor x = RandInt(DType::kI64, {3, 4}, 8, -3, 3).CastTo(dt);
    Tensor y = RandInt(DType::kI64, {4}, 9, -3, 3).CastTo(dt);
    auto ref = Numpy({{"x", x}, {"y", y}},
                     "x, y = a['x'], a['y']\nout['eq'] = x == y\nout['lt'] = x < y\nout['gt'] = x > y\n"
                     "out['le'] = x <= y\nout['ge'] = x >= y\n");
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kEqual, 2), {x, y}).BitwiseEquals(ref["eq"])) << ir::DTypeName(dt);
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kLess, 2), {x, y}).BitwiseEquals(ref["lt"])) << ir::DTypeName(dt);
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kGreater, 2), {x, y}).BitwiseEquals(ref["gt"])) << ir::DTypeName(dt);
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kLessOrEqual, 2), {x, y}).BitwiseEquals(ref["le"])) << ir::DTypeName(dt);
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kGreaterOrEqual, 2), {x, y}).BitwiseEquals(ref["ge"])) << ir::DTypeName(dt);
  }
  Tensor p = Tensor::FromVector<bool>({2, 2}, {true, true, false, false});
  Tensor q = Tensor::FromVector<bool>({2}, {true, false});
  EXPECT_EQ(Eval1(MakeNode(OpKind::kAnd, 2), {p, q}).ToInt64Vector(), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kEqual, 2), {p, q}).ToInt64Vector(), (std::vector<int64_t>{1, 0, 0, 1}));
  // NaN compares unequal to everything, itself included.
  Tensor nan = Tensor::FromVector<float>({1}, {std::nanf("")});
  EXPECT_EQ(Eval1(MakeNode(OpKind::kEqual, 2), {nan, nan}).ToInt64Vector(), (std::vector<int64_t>{0}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kLess, 2), {p, q}).ok());
}

TEST(Binary, WhereBroadcastsThreeWaysForAnyDType) {
  Tensor c = RandInt(DType::kI64, {2, 1, 4}, 11, 0, 1).CastTo(DType::kBool);
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kBool}) {
    Tensor x = RandInt(DType::kI64, {3, 1}, 12, -9, 9).CastTo(dt);
    Tensor y = RandInt(DType::kI64, {1, 3, 4}, 13, -9, 9).CastTo(dt);
    auto ref = Numpy({{"c", c}, {"x", x}, {"y", y}}, "out['w'] = np.where(a['c'], a['x'], a['y'])\n");
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kWhere, 3), {c, x, y}).BitwiseEquals(ref["w"])) << ir::DTypeName(dt);
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kWhere, 3), {I64Vec({1}), I64Vec({1}), I64Vec({1})}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
