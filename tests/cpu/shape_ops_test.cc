// Data-movement and indexing kernels against numpy: Transpose, Reshape, Flatten, Squeeze,
// Unsqueeze, Concat, Split, Slice, Shape, Expand, Gather, Trilu, Range, Constant(OfShape).
#include <limits>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

ir::Attrs A(const std::string& k, ir::AttrValue v) {
  ir::Attrs a;
  a.Set(k, std::move(v));
  return a;
}

TEST(ShapeOps, TransposeMatchesNumpyForAllDTypes) {
  const std::vector<std::vector<int64_t>> perms = {{0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 0, 3, 2}, {2, 3, 0, 1}};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kBool}) {
    Tensor x = RandInt(DType::kI64, {2, 3, 4, 5}, 1, -50, 50).CastTo(dt);
    std::string code;
    std::vector<Tensor> got;
    for (size_t p = 0; p < perms.size(); ++p) {
      got.push_back(Eval1(MakeNode(OpKind::kTranspose, 1, 1, A("perm", perms[p])), {x}));
      code += "out['" + std::to_string(p) + "'] = np.transpose(a['x'], (" + std::to_string(perms[p][0]) + "," +
              std::to_string(perms[p][1]) + "," + std::to_string(perms[p][2]) + "," + std::to_string(perms[p][3]) + "))\n";
    }
    code += "out['default'] = np.transpose(a['x'])\n";
    auto ref = Numpy({{"x", x}}, code);
    for (size_t p = 0; p < perms.size(); ++p) EXPECT_TRUE(got[p].BitwiseEquals(ref[std::to_string(p)])) << p;
    EXPECT_TRUE(Eval1(MakeNode(OpKind::kTranspose, 1), {x}).BitwiseEquals(ref["default"]));
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kTranspose, 1, 1, A("perm", std::vector<int64_t>{0, 0})), {Rand(DType::kF32, {2, 2}, 1)}).ok());
  // Large enough for several (partial) 32x32 tiles of the blocked transpose path.
  Tensor big = Rand(DType::kF64, {3, 70, 45}, 2);
  auto ref = Numpy({{"x", big}}, "out['a'] = np.transpose(a['x'], (0, 2, 1))\nout['b'] = np.transpose(a['x'], (2, 1, 0))\n"
                                 "out['c'] = np.transpose(a['x'], (1, 2, 0))\n");
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kTranspose, 1, 1, A("perm", std::vector<int64_t>{0, 2, 1})), {big}).BitwiseEquals(ref["a"]));
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kTranspose, 1, 1, A("perm", std::vector<int64_t>{2, 1, 0})), {big}).BitwiseEquals(ref["b"]));
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kTranspose, 1, 1, A("perm", std::vector<int64_t>{1, 2, 0})), {big}).BitwiseEquals(ref["c"]));
}

TEST(ShapeOps, ReshapeZeroMinusOneAndAllowzero) {
  Tensor x = Rand(DType::kF32, {2, 3, 4}, 2);
  EXPECT_EQ(Eval1(MakeNode(OpKind::kReshape, 2), {x, I64Vec({0, -1})}).dims(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kReshape, 2), {x, I64Vec({-1, 0, 2})}).dims(), (std::vector<int64_t>{4, 3, 2}));
  Tensor r = Eval1(MakeNode(OpKind::kReshape, 2), {x, I64Vec({24})});
  EXPECT_EQ(0, std::memcmp(r.raw(), x.raw(), x.num_bytes()));
  Tensor empty(DType::kF32, {0, 3});
  EXPECT_EQ(Eval1(MakeNode(OpKind::kReshape, 2, 1, A("allowzero", int64_t{1})), {empty, I64Vec({3, 0})}).dims(),
            (std::vector<int64_t>{3, 0}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kReshape, 2), {x, I64Vec({5, -1})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kReshape, 2), {x, I64Vec({-1, -1})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kReshape, 2), {x, I64Vec({2, 3, 5})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kReshape, 2), {x, I64Vec({0, 0, 0, 0})}).ok());
}

TEST(ShapeOps, FlattenSqueezeUnsqueeze) {
  Tensor x = Rand(DType::kF64, {2, 1, 3, 1}, 3);
  EXPECT_EQ(Eval1(MakeNode(OpKind::kFlatten, 1), {x}).dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kFlatten, 1, 1, A("axis", int64_t{0})), {x}).dims(), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kFlatten, 1, 1, A("axis", int64_t{4})), {x}).dims(), (std::vector<int64_t>{6, 1}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kFlatten, 1, 1, A("axis", int64_t{-2})), {x}).dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kSqueeze, 1), {x}).dims(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kSqueeze, 1, 1, A("axes", std::vector<int64_t>{-1})), {x}).dims(),
            (std::vector<int64_t>{2, 1, 3}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSqueeze, 1, 1, A("axes", std::vector<int64_t>{0})), {x}).ok());
  EXPECT_EQ(Eval1(MakeNode(OpKind::kUnsqueeze, 1, 1, A("axes", std::vector<int64_t>{0, -1})), {x}).dims(),
            (std::vector<int64_t>{1, 2, 1, 3, 1, 1}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kUnsqueeze, 1, 1, A("axes", std::vector<int64_t>{3, 1})), {Rand(DType::kF32, {2, 3}, 1)}).dims(),
            (std::vector<int64_t>{2, 1, 3, 1}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kUnsqueeze, 1), {x}).ok());
}

TEST(ShapeOps, ConcatAndSplitRoundTrip) {
  for (DType dt : {DType::kF32, DType::kI64, DType::kBool}) {
    Tensor a = RandInt(DType::kI64, {2, 3, 4}, 4, -9, 9).CastTo(dt);
    Tensor b = RandInt(DType::kI64, {2, 1, 4}, 5, -9, 9).CastTo(dt);
    Tensor e = Tensor(dt, {2, 0, 4});
    ir::Node cat = MakeNode(OpKind::kConcat, 3, 1, A("axis", int64_t{-2}));
    Tensor c = Eval1(cat, {a, e, b});
    auto ref = Numpy({{"a", a}, {"b", b}}, "out['c'] = np.concatenate([a['a'], a['b']], axis=1)\n");
    EXPECT_TRUE(c.BitwiseEquals(ref["c"])) << ir::DTypeName(dt);
    ir::Node split = MakeNode(OpKind::kSplit, 1, 2, A("axis", int64_t{1}));
    split.attrs.Set("split", std::vector<int64_t>{3, 1});
    auto parts = Eval(split, {c});
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_TRUE((*parts)[0].BitwiseEquals(a));
    EXPECT_TRUE((*parts)[1].BitwiseEquals(b));
  }
  // Equal split, uneven split with num_outputs, and errors.
  Tensor x = Rand(DType::kF32, {7, 2}, 6);
  auto three = Eval(MakeNode(OpKind::kSplit, 1, 3, A("num_outputs", int64_t{3})), {x});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ((*three)[0].dims(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ((*three)[2].dims(), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSplit, 1, 3), {x}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kConcat, 2, 1, A("axis", int64_t{0})), {x, Rand(DType::kF32, {7, 3}, 1)}).ok());
}

TEST(ShapeOps, SliceMatchesNumpyIncludingClampingAndNegativeSteps) {
  const int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;
    std::string numpy;
  };
  const std::vector<Case> cases = {
      {{1, 0}, {3, 10}, {0, 1}, {1, 1}, "x[1:3, 0:10]"},
      {{0}, {-1}, {1}, {1}, "x[:, 0:-1]"},
      {{-1}, {kMin}, {2}, {-1}, "x[:, :, ::-1]"},
      {{10}, {-100}, {0}, {-2}, "x[10:-100:-2]"},
      {{2, 1}, {kMax, kMax}, {-1, 0}, {2, 3}, "x[1::3, :, 2::2]"},
      {{3}, {1}, {1}, {1}, "x[:, 3:1]"},
      {{-100}, {100}, {0}, {1}, "x[-100:100]"},
      {{4}, {0}, {2}, {-3}, "x[:, :, 4:0:-3]"},
  };
  Tensor x = Rand(DType::kF32, {4, 5, 6}, 7);
  std::string code = "x = a['x']\n";
  std::vector<Tensor> got;
  for (size_t c = 0; c < cases.size(); ++c) {
    got.push_back(Eval1(MakeNode(OpKind::kSlice, 5),
                        {x, I64Vec(cases[c].starts), I64Vec(cases[c].ends), I64Vec(cases[c].axes), I64Vec(cases[c].steps)}));
    code += "out['" + std::to_string(c) + "'] = " + cases[c].numpy + "\n";
  }
  auto ref = Numpy({{"x", x}}, code);
  for (size_t c = 0; c < cases.size(); ++c) EXPECT_TRUE(got[c].BitwiseEquals(ref[std::to_string(c)])) << cases[c].numpy;
  // Axes and steps omitted; i32 operands.
  Tensor s = Eval1(MakeNode(OpKind::kSlice, 3), {x, Tensor::FromVector<int32_t>({1}, {2}), Tensor::FromVector<int32_t>({1}, {4})});
  EXPECT_EQ(s.dims(), (std::vector<int64_t>{2, 5, 6}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSlice, 5), {x, I64Vec({0}), I64Vec({1}), I64Vec({0}), I64Vec({0})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSlice, 4), {x, I64Vec({0, 0}), I64Vec({1, 1}), I64Vec({1, 1})}).ok());
  // A zero-size dim with a negative step.
  EXPECT_EQ(Eval1(MakeNode(OpKind::kSlice, 5), {Tensor(DType::kF32, {0, 2}), I64Vec({-1}), I64Vec({kMin}), I64Vec({0}), I64Vec({-1})})
                .dims(),
            (std::vector<int64_t>{0, 2}));
}

TEST(ShapeOps, ShapeWithStartEnd) {
  Tensor x(DType::kF32, {2, 3, 4, 5});
  EXPECT_EQ(Eval1(MakeNode(OpKind::kShape, 1), {x}).ToInt64Vector(), (std::vector<int64_t>{2, 3, 4, 5}));
  ir::Attrs a;
  a.Set("start", int64_t{1});
  a.Set("end", int64_t{-1});
  EXPECT_EQ(Eval1(MakeNode(OpKind::kShape, 1, 1, a), {x}).ToInt64Vector(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kShape, 1, 1, A("start", int64_t{-10})), {x}).ToInt64Vector().size(), 4u);
  EXPECT_EQ(Eval1(MakeNode(OpKind::kShape, 1, 1, A("start", int64_t{10})), {x}).num_elements(), 0);
}

TEST(ShapeOps, ExpandIsBidirectionalBroadcast) {
  Tensor x = Rand(DType::kF64, {3, 1}, 8);
  auto ref = Numpy({{"x", x}}, "out['a'] = x = a['x'] * np.ones((2, 1, 4))\nout['b'] = a['x'] * np.ones((1, 1))\n");
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kExpand, 2), {x, I64Vec({2, 1, 4})}).BitwiseEquals(ref["a"]));
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kExpand, 2), {x, I64Vec({1, 1})}).BitwiseEquals(ref["b"]));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kExpand, 2), {x, I64Vec({2, 2})}).ok());
  auto huge = Eval(MakeNode(OpKind::kExpand, 2), {x, I64Vec({3, int64_t{1} << 40})});
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("limit"), std::string::npos) << huge.status();
}

TEST(ShapeOps, GatherWithNegativeIndicesAndBadIndices) {
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64}) {
    Tensor data = RandInt(DType::kI64, {5, 4, 3}, 9, -9, 9).CastTo(dt);
    Tensor idx = I64({2, 3}, {0, -1, 2, 4, -5, 1});
    std::string code = "import numpy as np\n";
    std::vector<Tensor> got;
    for (int64_t axis : {0, 1, -1}) {
      Tensor id = axis == 0 ? idx : I64({2, 2}, {0, -1, 2, -3});
      got.push_back(Eval1(MakeNode(OpKind::kGather, 2, 1, A("axis", axis)), {data, id}));
    }
    auto ref = Numpy({{"d", data}, {"i", idx}, {"j", I64({2, 2}, {0, -1, 2, -3})}},
                     "out['0'] = np.take(a['d'], a['i'], axis=0)\nout['1'] = np.take(a['d'], a['j'], axis=1)\n"
                     "out['2'] = np.take(a['d'], a['j'], axis=-1)\n");
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(got[k].BitwiseEquals(ref[std::to_string(k)])) << k;
  }
  // Scalar index drops the axis; i32 indices.
  Tensor d = Rand(DType::kF32, {4, 3}, 10);
  Tensor row = Eval1(MakeNode(OpKind::kGather, 2), {d, Tensor::Scalar<int32_t>(-2)});
  EXPECT_EQ(row.dims(), std::vector<int64_t>{3});
  EXPECT_EQ(row.data<float>()[1], d.data<float>()[2 * 3 + 1]);
  auto bad = Eval(MakeNode(OpKind::kGather, 2, 1, {}, "/emb/Gather"), {d, I64Vec({0, 4})});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("index 4"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("/emb/Gather"), std::string::npos) << bad.status();
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGather, 2), {d, I64Vec({-5})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGather, 2), {d, Rand(DType::kF32, {1}, 1)}).ok());
}

TEST(ShapeOps, TriluMatchesNumpy) {
  Tensor x = Rand(DType::kF32, {2, 4, 5}, 11);
  std::string code;
  std::vector<Tensor> got;
  int c = 0;
  for (int64_t upper : {0, 1}) {
    for (int64_t k : {-5, -1, 0, 2, 6}) {
      got.push_back(Eval1(MakeNode(OpKind::kTrilu, 2, 1, A("upper", upper)), {x, Tensor::Scalar<int64_t>(k)}));
      code += "out['" + std::to_string(c++) + "'] = np." + (upper ? "triu" : "tril") + "(a['x'], " + std::to_string(k) + ")\n";
    }
  }
  got.push_back(Eval1(MakeNode(OpKind::kTrilu, 1), {x}));
  code += "out['" + std::to_string(c) + "'] = np.triu(a['x'])\n";
  auto ref = Numpy({{"x", x}}, code);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i].BitwiseEquals(ref[std::to_string(i)])) << i;
  EXPECT_FALSE(Eval(MakeNode(OpKind::kTrilu, 1), {Rand(DType::kF32, {3}, 1)}).ok());
}

TEST(ShapeOps, RangeMatchesNumpyArange) {
  auto r = Eval1(MakeNode(OpKind::kRange, 3), {Tensor::Scalar<float>(1.f), Tensor::Scalar<float>(2.f), Tensor::Scalar<float>(0.3f)});
  auto ref = Numpy({}, "out['f'] = np.float32(1) + np.arange(4, dtype=np.float32) * np.float32(0.3)\n"
                       "out['i'] = np.arange(10, -3, -4, dtype=np.int64)\nout['j'] = np.arange(5, 5, dtype=np.int32)\n");
  EXPECT_TRUE(AllClose(r, ref["f"], 1e-6, 0));
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kRange, 3), {Tensor::Scalar<int64_t>(10), Tensor::Scalar<int64_t>(-3), Tensor::Scalar<int64_t>(-4)})
                  .BitwiseEquals(ref["i"]));
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kRange, 3), {Tensor::Scalar<int32_t>(5), Tensor::Scalar<int32_t>(5), Tensor::Scalar<int32_t>(1)})
                  .BitwiseEquals(ref["j"]));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kRange, 3), {Tensor::Scalar<int64_t>(0), Tensor::Scalar<int64_t>(5), Tensor::Scalar<int64_t>(0)}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kRange, 3),
                    {Tensor::Scalar<double>(0), Tensor::Scalar<double>(1e300), Tensor::Scalar<double>(1e-300)}).ok());
}

TEST(ShapeOps, ConstantAndConstantOfShape) {
  Tensor v = Rand(DType::kF32, {2, 2}, 12);
  EXPECT_TRUE(Eval1(MakeNode(OpKind::kConstant, 0, 1, A("value", v)), {}).BitwiseEquals(v));
  EXPECT_EQ(Eval1(MakeNode(OpKind::kConstant, 0, 1, A("value_ints", std::vector<int64_t>{4, 5})), {}).ToInt64Vector(),
            (std::vector<int64_t>{4, 5}));
  EXPECT_FALSE(Eval(MakeNode(OpKind::kConstant, 0), {}).ok());
  Tensor c = Eval1(MakeNode(OpKind::kConstantOfShape, 1, 1, A("value", Tensor::FromVector<int64_t>({1}, {7}))), {I64Vec({2, 3})});
  EXPECT_EQ(c.dtype(), DType::kI64);
  EXPECT_EQ(c.ToInt64Vector(), std::vector<int64_t>(6, 7));
  Tensor z = Eval1(MakeNode(OpKind::kConstantOfShape, 1), {I64Vec({3})});
  EXPECT_EQ(z.dtype(), DType::kF32);
  EXPECT_EQ(z.num_elements(), 3);
  EXPECT_EQ(Eval1(MakeNode(OpKind::kConstantOfShape, 1), {I64Vec({})}).dims(), std::vector<int64_t>{});
  EXPECT_FALSE(Eval(MakeNode(OpKind::kConstantOfShape, 1), {I64Vec({-1})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kConstantOfShape, 1), {I64Vec({1 << 30, 1 << 30, 1 << 30})}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
