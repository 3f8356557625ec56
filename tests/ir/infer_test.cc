// Shape inference tests. Expected shapes are computed by hand from the ONNX spec (and, for the
// slicing and broadcasting cases, the numpy expressions in the comments, which follow the same
// rules); symbolic cases state the dims the algebra must produce.
#include "frontend/ir/infer.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "frontend/ir/verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::ir {
namespace {

using ::testing::HasSubstr;

const Dim B = Dim::Symbol("B");
const Dim S = Dim::Symbol("S");
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

// Builds small graphs by hand; node outputs start without a shape so inference fills them.
class Builder {
 public:
  ValueId Input(const std::string& name, Shape shape, DType dtype = DType::kF32) {
    ValueId v = g.AddValue(name, dtype, std::move(shape));
    g.inputs().push_back(v);
    return v;
  }
  ValueId Ints(const std::vector<int64_t>& v) {
    return g.AddConstant("c" + std::to_string(counter_++),
                         Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  ValueId Scalar(int64_t v) {
    return g.AddConstant("c" + std::to_string(counter_++), Tensor::Scalar<int64_t>(v));
  }
  std::vector<ValueId> Node(OpKind op, std::vector<ValueId> inputs, int num_outputs = 1,
                            Attrs attrs = {}, std::string name = "") {
    if (name.empty()) name = "/n" + std::to_string(counter_++) + "/" + std::string(OpName(op));
    std::vector<ValueId> outs;
    for (int i = 0; i < num_outputs; ++i)
      outs.push_back(g.AddValue(name + ":" + std::to_string(i), DType::kF32, {}, false));
    g.AddNode(op, name, std::move(inputs), outs, std::move(attrs));
    return outs;
  }
  ValueId Op(OpKind op, std::vector<ValueId> inputs, Attrs attrs = {}, std::string name = "") {
    return Node(op, std::move(inputs), 1, std::move(attrs), std::move(name))[0];
  }
  // Runs inference; returns the status.
  absl::Status Infer() {
    absl::Status st = Verify(g);
    if (!st.ok()) return st;
    return InferShapes(g);
  }
  std::string Str(ValueId v) const { return ShapeToString(g.value(v).shape); }
  const Shape& Shp(ValueId v) const { return g.value(v).shape; }
  DType Type(ValueId v) const { return g.value(v).dtype; }

  Graph g;

 private:
  int counter_ = 0;
};

Attrs A(std::initializer_list<std::pair<const std::string, AttrValue>> kv) {
  Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}
std::vector<int64_t> I(std::initializer_list<int64_t> v) { return v; }

TEST(InferTest, EveryOpHasARule) {
  for (int i = 0; i < static_cast<int>(OpKind::kNumOps); ++i) {
    EXPECT_TRUE(HasShapeRule(static_cast<OpKind>(i))) << OpName(static_cast<OpKind>(i));
  }
}

TEST(InferTest, GeluKeepBitsPackTheLastDimByEight) {
  Builder b;
  const ValueId x = b.Input("x", {B, S, Dim(64)});
  const std::vector<ValueId> y = b.Node(OpKind::kGelu, {x}, 2);
  const ValueId dy = b.Input("dy", {B, S, Dim(64)});
  b.Op(OpKind::kGeluGrad, {dy, x, y[1]});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Type(y[1]), DType::kU8);
  EXPECT_EQ(b.Shp(y[1]), (Shape{B, S, Dim(8)}));
  // A last dim no multiple of 8, and bits of another shape, are errors naming the node.
  Builder odd;
  odd.Node(OpKind::kGelu, {odd.Input("x", {B, Dim(12)})}, 2, {}, "/mlp/Gelu");
  EXPECT_THAT(odd.Infer().message(), HasSubstr("/mlp/Gelu"));
  Builder wrong;
  const ValueId wx = wrong.Input("x", {B, Dim(64)});
  wrong.Op(OpKind::kGeluGrad, {wrong.Input("dy", {B, Dim(64)}), wx, wrong.Input("bits", {B, Dim(4)}, DType::kU8)}, {},
           "/mlp/Gelu_grad");
  const absl::Status st = wrong.Infer();
  EXPECT_THAT(st.message(), HasSubstr("/mlp/Gelu_grad"));
  EXPECT_THAT(st.message(), HasSubstr("keep bits"));
}

TEST(InferTest, BroadcastingConcreteAndSymbolic) {
  Builder b;
  ValueId x = b.Input("x", {2, 1, 4}), y = b.Input("y", {3, 1});
  ValueId h = b.Input("h", {B, S, 64}), bias = b.Input("bias", {64});
  ValueId mask = b.Input("mask", {B, 1, 1, S}), scores = b.Input("scores", {B, 4, S, S});
  ValueId col = b.Input("col", {S, 1}), row = b.Input("row", {1, S});
  ValueId vb = b.Input("vb", {B}), vs = b.Input("vs", {S}), v5 = b.Input("v5", {5});
  ValueId cond = b.Input("cond", {1, S}, DType::kBool);
  ValueId add = b.Op(OpKind::kAdd, {x, y});  // numpy: (2,1,4)+(3,1) -> (2,3,4)
  ValueId add_bias = b.Op(OpKind::kAdd, {h, bias});
  ValueId masked = b.Op(OpKind::kAdd, {scores, mask});
  ValueId outer = b.Op(OpKind::kMul, {col, row});
  ValueId bs = b.Op(OpKind::kSub, {vb, vs});    // B vs S: either may be 1 -> unknown
  ValueId five = b.Op(OpKind::kDiv, {vs, v5});  // S must be 1 or 5 -> 5
  ValueId eq = b.Op(OpKind::kEqual, {x, y});
  ValueId where = b.Op(OpKind::kWhere, {cond, scores, b.Input("zero", {})});
  ValueId pw = b.Op(OpKind::kPow, {h, b.Input("two", {}, DType::kF64)});
  const Dim unknown = Dim::Unknown();
  ValueId named = b.Op(OpKind::kAdd, {vs, b.Input("vu", {unknown})});  // named beats unknown
  ValueId same_unknown =
      b.Op(OpKind::kAdd, {b.Input("u1", {unknown, 1}), b.Input("u2", {unknown})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(add), "(2, 3, 4)");
  EXPECT_EQ(b.Str(add_bias), "(B, S, 64)");
  EXPECT_EQ(b.Str(masked), "(B, 4, S, S)");
  EXPECT_EQ(b.Str(outer), "(S, S)");
  ASSERT_EQ(b.Shp(bs).size(), 1u);
  EXPECT_TRUE(b.Shp(bs)[0].is_unknown());
  EXPECT_EQ(b.Str(five), "(5)");
  EXPECT_EQ(b.Str(eq), "(2, 3, 4)");
  EXPECT_EQ(b.Type(eq), DType::kBool);
  EXPECT_EQ(b.Str(where), "(B, 4, S, S)");
  EXPECT_EQ(b.Type(pw), DType::kF32);
  EXPECT_EQ(b.Str(named), "(S)");
  EXPECT_EQ(b.Shp(same_unknown), (Shape{unknown, unknown}));
}

TEST(InferTest, BroadcastContradictionNamesNodeAndShapes) {
  Builder b;
  ValueId x = b.Input("x", {3, 4}), y = b.Input("y", {5, 4});
  b.Op(OpKind::kAdd, {x, y}, {}, "/layers.0/Add");
  absl::Status st = b.Infer();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'/layers.0/Add' (Add)"));
  EXPECT_THAT(st.message(), HasSubstr("(3, 4)"));
  EXPECT_THAT(st.message(), HasSubstr("(5, 4)"));

  Builder c;
  c.Op(OpKind::kAdd, {c.Input("f", {4}), c.Input("i", {4}, DType::kI64)}, {}, "/mixed");
  st = c.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/mixed' (Add)"));
  EXPECT_THAT(st.message(), HasSubstr("same element type"));
}

TEST(InferTest, MatMulBatchedBroadcastAndVectors) {
  Builder b;
  ValueId h = b.Input("h", {B, S, 64}), w = b.Input("w", {64, 128});
  ValueId a4 = b.Input("a4", {2, 1, 3, 4}), b3 = b.Input("b3", {5, 4, 6});
  ValueId v4 = b.Input("v4", {4}), m = b.Input("m", {2, 4, 6}), t = b.Input("t", {2, 3, 4});
  ValueId proj = b.Op(OpKind::kMatMul, {h, w});
  ValueId batched = b.Op(OpKind::kMatMul, {a4, b3});  // np.matmul: (2,1,3,4)@(5,4,6) -> (2,5,3,6)
  ValueId dot = b.Op(OpKind::kMatMul, {v4, v4});      // (4)@(4) -> ()
  ValueId row = b.Op(OpKind::kMatMul, {v4, m});       // (4)@(2,4,6) -> (2,6)
  ValueId col = b.Op(OpKind::kMatMul, {t, v4});       // (2,3,4)@(4) -> (2,3)
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(proj), "(B, S, 128)");
  EXPECT_EQ(b.Str(batched), "(2, 5, 3, 6)");
  EXPECT_EQ(b.Str(dot), "()");
  EXPECT_EQ(b.Str(row), "(2, 6)");
  EXPECT_EQ(b.Str(col), "(2, 3)");
}

TEST(InferTest, MatMulInnerDimContradiction) {
  Builder b;
  b.Op(OpKind::kMatMul, {b.Input("x", {B, 3, 4}), b.Input("w", {5, 6})}, {}, "/layers.0/MatMul");
  absl::Status st = b.Infer();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'/layers.0/MatMul' (MatMul)"));
  EXPECT_THAT(st.message(), HasSubstr("(B, 3, 4)"));
  EXPECT_THAT(st.message(), HasSubstr("(5, 6)"));
}

TEST(InferTest, GemmAndLinear) {
  Builder b;
  ValueId a = b.Input("a", {4, 3}), w = b.Input("w", {5, 4}), c = b.Input("c", {5});
  // transA: A^T is (3, 4); transB: B^T is (4, 5) -> (3, 5); C (5) broadcasts.
  ValueId gemm =
      b.Op(OpKind::kGemm, {a, w, c}, A({{"transA", int64_t{1}}, {"transB", int64_t{1}}}));
  ValueId x = b.Input("x", {B, S, 64}), wt = b.Input("wt", {128, 64}),
          bias = b.Input("bias", {128});
  ValueId lin = b.Op(OpKind::kLinear, {x, wt, bias}, A({{"trans_b", int64_t{1}}}));
  ValueId lin_kn = b.Op(OpKind::kLinear, {x, b.Input("wkn", {64, 32})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(gemm), "(3, 5)");
  EXPECT_EQ(b.Str(lin), "(B, S, 128)");
  EXPECT_EQ(b.Str(lin_kn), "(B, S, 32)");

  Builder bad;
  bad.Op(OpKind::kGemm, {bad.Input("a", {4, 3}), bad.Input("w", {3, 5}), bad.Input("c", {3})}, {},
         "/fc/Gemm");
  absl::Status st = bad.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/fc/Gemm' (Gemm)"));
  EXPECT_THAT(st.message(), HasSubstr("does not broadcast to (4, 5)"));
}

TEST(InferTest, ReshapeZeroAndMinusOneOnSymbolicDims) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64});
  ValueId flat = b.Op(OpKind::kReshape, {x, b.Ints({-1, 64})});
  ValueId heads = b.Op(OpKind::kReshape, {x, b.Ints({0, 0, 4, 16})});
  ValueId merged = b.Op(OpKind::kReshape, {x, b.Ints({-1, 4, 16})});  // 64*B*S / 64
  ValueId back = b.Op(OpKind::kReshape, {flat, b.Ints({-1, 8, 8})});
  ValueId odd = b.Op(OpKind::kReshape, {flat, b.Ints({-1, 128})});  // 64*B*S/128 not expressible
  // The exporters' chain: Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)),
  // [-1]) -> (B, S, -1); the -1 needs DivExact(64*B*S, B*S) = 64.
  ValueId shp = b.Op(OpKind::kShape, {x});
  ValueId d0 = b.Op(OpKind::kGather, {shp, b.Scalar(0)});
  ValueId d1 = b.Op(OpKind::kGather, {shp, b.Scalar(1)});
  ValueId u0 = b.Op(OpKind::kUnsqueeze, {d0}, A({{"axes", I({0})}}));
  ValueId u1 = b.Op(OpKind::kUnsqueeze, {d1}, A({{"axes", I({0})}}));
  ValueId target = b.Op(OpKind::kConcat, {u0, u1, b.Ints({-1})}, A({{"axis", int64_t{0}}}));
  ValueId restored = b.Op(OpKind::kReshape, {flat, target});
  // (B*S, 64) -> (B, S*64 / 16...): Mul of gathered dims computes B*S for a 2-D view.
  ValueId bs = b.Op(OpKind::kMul, {d0, d1});
  ValueId target2 = b.Op(OpKind::kConcat,
                         {b.Op(OpKind::kUnsqueeze, {bs}, A({{"axes", I({0})}})), b.Ints({4, 16})},
                         A({{"axis", int64_t{0}}}));
  ValueId view = b.Op(OpKind::kReshape, {x, target2});
  ValueId dynamic = b.Op(OpKind::kReshape, {x, b.Input("shape", {3}, DType::kI64)});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(flat), "(B*S, 64)");
  EXPECT_EQ(b.Str(heads), "(B, S, 4, 16)");
  EXPECT_EQ(b.Str(merged), "(B*S, 4, 16)");
  EXPECT_EQ(b.Str(back), "(B*S, 8, 8)");
  ASSERT_EQ(b.Shp(odd).size(), 2u);
  EXPECT_TRUE(b.Shp(odd)[0].is_unknown());
  EXPECT_EQ(b.Shp(odd)[1], Dim(128));
  EXPECT_EQ(b.Str(target), "(3)");
  EXPECT_EQ(b.Str(restored), "(B, S, 64)");
  EXPECT_EQ(b.Str(view), "(B*S, 4, 16)");
  ASSERT_EQ(b.Shp(dynamic).size(), 3u);
  for (const Dim& d : b.Shp(dynamic)) EXPECT_TRUE(d.is_unknown());
}

// Known data through a Concat of 2-D operands on axis 1 (Tile's lowering interleaves Shape(x) with
// ones so): Reshape(x, [1, B, 1, S, 1, 8]) and Expand to [3, B, 1, S, 2, 8] keep the symbolic dims.
TEST(InferTest, ConcatOfTwoDimensionalShapeDataOnTheLastAxis) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 8});
  ValueId dims = b.Op(OpKind::kShape, {x});
  ValueId ones = b.Ints({1, 1, 1});
  ValueId reps = b.Ints({3, 1, 2});
  auto column = [&](ValueId v) { return b.Op(OpKind::kUnsqueeze, {v}, A({{"axes", I({1})}})); };
  auto interleave = [&](ValueId u, ValueId v) {
    ValueId pairs = b.Op(OpKind::kConcat, {column(u), column(v)}, A({{"axis", int64_t{1}}}));
    return b.Op(OpKind::kReshape, {pairs, b.Ints({-1})});
  };
  ValueId spread = b.Op(OpKind::kReshape, {x, interleave(ones, dims)});
  ValueId copies = b.Op(OpKind::kExpand, {spread, interleave(reps, ones)});
  ValueId tiled = b.Op(OpKind::kReshape, {copies, b.Op(OpKind::kMul, {dims, reps})});
  // Axis 0 of 2-D operands: rows one after the other.
  ValueId rows = b.Op(OpKind::kConcat, {column(dims), column(reps)}, A({{"axis", int64_t{0}}}));
  ValueId rows_flat = b.Op(OpKind::kReshape, {rows, b.Ints({-1})});
  ValueId from_rows = b.Op(OpKind::kReshape, {b.Input("y", {B, S, 8, 3, 1, 2}), rows_flat});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(spread), "(1, B, 1, S, 1, 8)");
  EXPECT_EQ(b.Str(copies), "(3, B, 1, S, 2, 8)");
  EXPECT_EQ(b.Str(tiled), "(3*B, S, 16)");
  EXPECT_EQ(b.Str(from_rows), "(B, S, 8, 3, 1, 2)");
}

// KnownInts through multi-axis Slice and Transpose of small integer tensors (numpy:
// a = arange(12).reshape(3, 4); a[2::-2, 1:4:2] = [[9, 11], [1, 3]]; a.T.reshape(-1) =
// [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]), and a symbolic element keeps the value unknown.
TEST(InferTest, KnownIntsThroughSliceAndTranspose) {
  Builder b;
  ValueId a = b.Op(OpKind::kReshape, {b.Ints({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}), b.Ints({3, 4})});
  ValueId sliced = b.Op(OpKind::kSlice, {a, b.Ints({2, 1}), b.Ints({kMin, 4}), b.Ints({0, -1}), b.Ints({-2, 2})});
  ValueId flat = b.Op(OpKind::kReshape, {sliced, b.Ints({-1})});
  ValueId t = b.Op(OpKind::kReshape, {b.Op(OpKind::kTranspose, {a}, A({{"perm", I({1, 0})}})), b.Ints({-1})});
  ValueId cube = b.Op(OpKind::kReshape, {a, b.Ints({2, 3, 2})});  // cube[i][j][k] = 6i + 2j + k
  ValueId moved = b.Op(OpKind::kTranspose, {cube}, A({{"perm", I({2, 0, 1})}}));
  ValueId dims = b.Op(OpKind::kShape, {b.Input("x", {B, 3})});
  ValueId with_b = b.Op(OpKind::kSlice, {dims, b.Ints({-1}), b.Ints({kMin}), b.Ints({0}), b.Ints({-1})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(KnownInts(b.g, flat), std::optional(I({9, 11, 1, 3})));
  EXPECT_EQ(KnownInts(b.g, t), std::optional(I({0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11})));
  EXPECT_EQ(b.Str(moved), "(2, 2, 3)");  // moved[k][i][j] = cube[i][j][k]
  EXPECT_EQ(KnownInts(b.g, moved), std::optional(I({0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11})));
  EXPECT_EQ(KnownInts(b.g, with_b), std::nullopt);  // (3, B)
}

// MPT's ALiBi: slice_start = max(0, 1 - S) is unknown while S is a symbol (it is 0 for S >= 1, but
// only a named symbol against a constant <= 1 is decided), and the Slice's shape follows once S is bound.
TEST(InferTest, KnownIntsThroughMaxAndMin) {
  Builder b;
  ValueId dims = b.Op(OpKind::kShape, {b.Input("ids", {B, S})});
  ValueId s = b.Op(OpKind::kGather, {dims, b.Ints({1})});
  ValueId start = b.Op(OpKind::kMax, {b.Ints({0}), b.Op(OpKind::kSub, {b.Ints({1}), s})});
  ValueId at_least_one = b.Op(OpKind::kMax, {s, b.Ints({1})});
  ValueId zero = b.Op(OpKind::kMin, {b.Ints({0}), s});
  ValueId both = b.Op(OpKind::kMin, {b.Ints({7, -3}), b.Ints({5, 2})});
  ValueId sliced = b.Op(OpKind::kSlice, {b.Input("table", {4, 32}), start, b.Ints({kMax}), b.Ints({1})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(KnownInts(b.g, start), std::nullopt);
  EXPECT_EQ(b.Str(at_least_one), "(1)");
  EXPECT_EQ(KnownInts(b.g, zero), std::optional(I({0})));
  EXPECT_EQ(KnownInts(b.g, both), std::optional(I({5, -3})));
  ASSERT_TRUE(BindSymbols(b.g, {{"B", 2}, {"S", 6}}).ok());
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(KnownInts(b.g, start), std::optional(I({0})));
  EXPECT_EQ(b.Str(sliced), "(4, 32)");
}

TEST(InferTest, ReshapeContradictions) {
  Builder b;
  b.Op(OpKind::kReshape, {b.Input("x", {6, 4}), b.Ints({-1, 5})}, {}, "/r/Reshape");
  absl::Status st = b.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/r/Reshape' (Reshape)"));
  EXPECT_THAT(st.message(), HasSubstr("(6, 4)"));

  Builder c;  // 64*B*S elements cannot fill (B, S, 32)
  c.Op(OpKind::kReshape, {c.Input("x", {B, S, 64}), c.Ints({0, 0, 32})}, {}, "/r2");
  st = c.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/r2' (Reshape)"));
  EXPECT_THAT(st.message(), HasSubstr("(B, S, 32)"));

  Builder d;
  d.Op(OpKind::kReshape, {d.Input("x", {4}), d.Ints({-1, -1})}, {}, "/r3");
  EXPECT_THAT(d.Infer().message(), HasSubstr("more than one -1"));
}

TEST(InferTest, SliceClampingAndNegativeSteps) {
  Builder b;
  ValueId x = b.Input("x", {10, 20});
  // x[:, -3:] -> (10, 3)
  ValueId tail = b.Op(OpKind::kSlice, {x, b.Ints({-3}), b.Ints({kMax}), b.Ints({1})});
  // x[:, ::-1] -> (10, 20)
  ValueId rev = b.Op(OpKind::kSlice, {x, b.Ints({-1}), b.Ints({kMin}), b.Ints({1}), b.Ints({-1})});
  // x[8:2:-2] -> rows 8, 6, 4 -> (3, 20)
  ValueId stepped = b.Op(OpKind::kSlice, {x, b.Ints({8}), b.Ints({2}), b.Ints({0}), b.Ints({-2})});
  // x[100:, -100:5] -> start clamps to 10 (empty), start -100 clamps to 0 -> (0, 5)
  ValueId clamped = b.Op(OpKind::kSlice, {x, b.Ints({100, -100}), b.Ints({kMax, 5})});
  // x[1:-1, 3:19:4] -> 8 rows; cols 3, 7, 11, 15 -> (8, 4)
  ValueId both =
      b.Op(OpKind::kSlice, {x, b.Ints({1, 3}), b.Ints({-1, 19}), b.Ints({0, -1}), b.Ints({1, 4})});
  // x[-1:-12:-3, :] -> rows 9, 6, 3, 0 -> (4, 20)  (end -12 + 10 = -2 clamps to -1)
  ValueId neg = b.Op(OpKind::kSlice, {x, b.Ints({-1}), b.Ints({-12}), b.Ints({0}), b.Ints({-3})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(tail), "(10, 3)");
  EXPECT_EQ(b.Str(rev), "(10, 20)");
  EXPECT_EQ(b.Str(stepped), "(3, 20)");
  EXPECT_EQ(b.Str(clamped), "(0, 5)");
  EXPECT_EQ(b.Str(both), "(8, 4)");
  EXPECT_EQ(b.Str(neg), "(4, 20)");
}

TEST(InferTest, SliceOnSymbolicDims) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64});
  ValueId full = b.Op(OpKind::kSlice, {x, b.Ints({0}), b.Ints({kMax}), b.Ints({1})});
  ValueId rev = b.Op(OpKind::kSlice, {x, b.Ints({-1}), b.Ints({kMin}), b.Ints({1}), b.Ints({-1})});
  ValueId drop_first = b.Op(OpKind::kSlice, {x, b.Ints({1}), b.Ints({kMax}), b.Ints({1})});
  ValueId last_dim = b.Op(OpKind::kSlice, {x, b.Ints({0}), b.Ints({32}), b.Ints({2})});
  // The causal-mask slice of a GPT export: bias[:, :, :S, :S] with S from Shape(x).
  ValueId bias = b.Input("bias", {1, 1, 1024, 1024});
  ValueId s =
      b.Op(OpKind::kUnsqueeze, {b.Op(OpKind::kGather, {b.Op(OpKind::kShape, {x}), b.Scalar(1)})},
           A({{"axes", I({0})}}));
  ValueId ends = b.Op(OpKind::kConcat, {s, s}, A({{"axis", int64_t{0}}}));
  ValueId mask = b.Op(OpKind::kSlice, {bias, b.Ints({0, 0}), ends, b.Ints({2, 3})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(full), "(B, S, 64)");
  EXPECT_EQ(b.Str(rev), "(B, S, 64)");
  EXPECT_TRUE(b.Shp(drop_first)[1].is_unknown());  // S - 1 is not expressible
  EXPECT_EQ(b.Str(last_dim), "(B, S, 32)");
  EXPECT_EQ(b.Str(mask), "(1, 1, S, S)");
}

// PyTorch 2's TorchScript export of unflatten(-1, (3, E)) in nn.MultiheadAttention: the shape is
// Concat(Slice(Shape(x), 0, (-1 + r) % r), [3, E], Slice(Shape(x), (-1 + r) % r + 1, max)), the
// slice bounds computed with Add and Mod of constants.
TEST(InferTest, UnflattenWithModComputedSliceBounds) {
  Builder b;
  ValueId x = b.Input("x", {S, B, 48});
  ValueId shp = b.Op(OpKind::kShape, {x});
  ValueId dim = b.Op(OpKind::kMod, {b.Op(OpKind::kAdd, {b.Ints({-1}), b.Ints({3})}), b.Ints({3})});
  ValueId head = b.Op(OpKind::kSlice, {shp, b.Ints({0}), dim});
  ValueId tail = b.Op(OpKind::kSlice, {shp, b.Op(OpKind::kAdd, {dim, b.Ints({1})}), b.Ints({kMax})});
  ValueId target = b.Op(OpKind::kConcat, {head, b.Ints({3, 16}), tail}, A({{"axis", int64_t{0}}}));
  ValueId y = b.Op(OpKind::kReshape, {x, target});
  // Python's % (fmod = 0) takes the divisor's sign; C's (fmod = 1) the dividend's.
  ValueId py = b.Op(OpKind::kMod, {b.Ints({-7, 7}), b.Ints({3, -3})});
  ValueId c = b.Op(OpKind::kMod, {b.Ints({-7, 7}), b.Ints({3, -3})}, A({{"fmod", int64_t{1}}}));
  ValueId sliced_py = b.Op(OpKind::kSlice, {b.Input("v", {10}), b.Op(OpKind::kGather, {py, b.Ints({0})}),
                                            b.Ints({kMax})});
  ValueId sliced_c = b.Op(OpKind::kSlice, {b.Input("w", {10}), b.Ints({0}),
                                           b.Op(OpKind::kGather, {c, b.Ints({1})})});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(target), "(4)");
  EXPECT_EQ(b.Str(y), "(S, B, 3, 16)");
  EXPECT_EQ(b.Str(sliced_py), "(8)");  // -7 % 3 = 2 -> [2:]
  EXPECT_EQ(b.Str(sliced_c), "(1)");   // fmod(7, -3) = 1 -> [:1]
}

TEST(InferTest, SplitVariants) {
  Builder b;
  ValueId x = b.Input("x", {B, 12});
  std::vector<ValueId> sized =
      b.Node(OpKind::kSplit, {x}, 2, A({{"axis", int64_t{1}}, {"split", I({4, 8})}}));
  std::vector<ValueId> equal = b.Node(OpKind::kSplit, {x}, 3, A({{"axis", int64_t{-1}}}));
  // opset 18 num_outputs: ceil(10/3) = 4 -> 4, 4, 2
  std::vector<ValueId> ceil =
      b.Node(OpKind::kSplit, {b.Input("y", {10})}, 3, A({{"num_outputs", int64_t{3}}}));
  ValueId qkv = b.Input("qkv", {B, S, Dim(3) * S});
  std::vector<ValueId> sym = b.Node(OpKind::kSplit, {qkv}, 3, A({{"axis", int64_t{2}}}));
  std::vector<ValueId> unk = b.Node(OpKind::kSplit, {x}, 2, A({{"axis", int64_t{0}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(sized[0]), "(B, 4)");
  EXPECT_EQ(b.Str(sized[1]), "(B, 8)");
  for (ValueId v : equal) EXPECT_EQ(b.Str(v), "(B, 4)");
  EXPECT_EQ(b.Str(ceil[0]), "(4)");
  EXPECT_EQ(b.Str(ceil[1]), "(4)");
  EXPECT_EQ(b.Str(ceil[2]), "(2)");
  for (ValueId v : sym) EXPECT_EQ(b.Str(v), "(B, S, S)");
  EXPECT_TRUE(b.Shp(unk[0])[0].is_unknown());  // B / 2

  Builder bad;
  bad.Node(OpKind::kSplit, {bad.Input("y", {10})}, 3, {}, "/split_uneven");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("does not split evenly"));
  Builder bad2;
  bad2.Node(OpKind::kSplit, {bad2.Input("y", {10})}, 2, A({{"split", I({3, 4})}}), "/split_sum");
  absl::Status st = bad2.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/split_sum' (Split)"));
  EXPECT_THAT(st.message(), HasSubstr("sum to 7"));
}

TEST(InferTest, GatherInsertsIndicesShape) {
  Builder b;
  ValueId emb = b.Input("emb", {100, 64}), ids = b.Input("ids", {B, S}, DType::kI64);
  ValueId looked = b.Op(OpKind::kGather, {emb, ids});
  // np.take(x, idx, axis=1) with x (2,3,4), idx (5,6) -> (2,5,6,4)
  ValueId mid =
      b.Op(OpKind::kGather, {b.Input("x", {2, 3, 4}), b.Input("idx", {5, 6}, DType::kI32)},
           A({{"axis", int64_t{1}}}));
  ValueId scalar =
      b.Op(OpKind::kGather, {b.Input("h", {B, S, 64}), b.Scalar(-1)}, A({{"axis", int64_t{1}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(looked), "(B, S, 64)");
  EXPECT_EQ(b.Str(mid), "(2, 5, 6, 4)");
  EXPECT_EQ(b.Str(scalar), "(B, 64)");

  Builder bad;
  bad.Op(OpKind::kGather, {bad.Input("x", {3, 4}), bad.Scalar(3)}, {}, "/g");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("index 3 is out of range"));
}

TEST(InferTest, ReductionsKeepdims) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64});
  ValueId keep = b.Op(OpKind::kReduceMean, {x}, A({{"axes", I({-1})}}));
  ValueId drop = b.Op(OpKind::kReduceSum, {x}, A({{"axes", I({0, 2})}, {"keepdims", int64_t{0}}}));
  ValueId all = b.Op(OpKind::kReduceMax, {x}, A({{"keepdims", int64_t{0}}}));
  ValueId all_keep = b.Op(OpKind::kReduceSum, {x});
  ValueId noop = b.Op(OpKind::kReduceSum, {x}, A({{"noop_with_empty_axes", int64_t{1}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(keep), "(B, S, 1)");
  EXPECT_EQ(b.Str(drop), "(S)");
  EXPECT_EQ(b.Str(all), "()");
  EXPECT_EQ(b.Str(all_keep), "(1, 1, 1)");
  EXPECT_EQ(b.Str(noop), "(B, S, 64)");

  Builder bad;
  bad.Op(OpKind::kReduceMean, {bad.Input("x", {2, 3})}, A({{"axes", I({2})}}), "/rm");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("axes 2 is out of range"));
}

TEST(InferTest, LayerNormOutputs) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64}), scale = b.Input("scale", {64}),
          bias = b.Input("bias", {64});
  std::vector<ValueId> ln = b.Node(OpKind::kLayerNorm, {x, scale, bias}, 3);
  ValueId x16 = b.Input("x16", {B, S, 4, 16}, DType::kBF16);
  std::vector<ValueId> ln2 = b.Node(OpKind::kLayerNorm, {x16, b.Input("s2", {4, 16}, DType::kBF16)},
                                    3, A({{"axis", int64_t{2}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(ln[0]), "(B, S, 64)");
  EXPECT_EQ(b.Str(ln[1]), "(B, S, 1)");
  EXPECT_EQ(b.Str(ln[2]), "(B, S, 1)");
  EXPECT_EQ(b.Str(ln2[0]), "(B, S, 4, 16)");
  EXPECT_EQ(b.Type(ln2[0]), DType::kBF16);
  EXPECT_EQ(b.Str(ln2[1]), "(B, S, 1, 1)");
  EXPECT_EQ(b.Type(ln2[1]), DType::kF32);  // stash_type defaults to float

  Builder bad;
  bad.Node(OpKind::kLayerNorm, {bad.Input("x", {B, 64}), bad.Input("scale", {32})}, 1, {}, "/ln");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("does not broadcast to (64)"));
}

TEST(InferTest, RMSNormAndItsGradient) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 4, 16}), scale = b.Input("scale", {4, 16});
  std::vector<ValueId> rms = b.Node(OpKind::kRMSNorm, {x, scale}, 2, A({{"axis", int64_t{-2}}}));
  std::vector<ValueId> grad = b.Node(OpKind::kRMSNormGrad, {b.Input("dy", {B, S, 4, 16}), x, scale, rms[1]}, 2,
                                     A({{"axis", int64_t{-2}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(rms[0]), "(B, S, 4, 16)");
  EXPECT_EQ(b.Str(rms[1]), "(B, S, 1, 1)");
  EXPECT_EQ(b.Type(rms[1]), DType::kF32);
  EXPECT_EQ(b.Str(grad[0]), "(B, S, 4, 16)");
  EXPECT_EQ(b.Str(grad[1]), "(4, 16)");

  Builder bad;
  bad.Node(OpKind::kRMSNorm, {bad.Input("x", {B, 64}), bad.Input("scale", {32})}, 1, {}, "/rms");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("does not broadcast to (64)"));
  EXPECT_THAT(bad.Infer().message(), HasSubstr("/rms"));
}

TEST(InferTest, RotaryAndItsGradient) {
  Builder b;
  // Llama's (B, 1, S, 8) tables against (B, H, S, 16): a partial rotary over 8 of 16 features.
  ValueId x = b.Input("x", {B, 4, S, 16}), cos = b.Input("cos", {B, 1, S, 8}), sin = b.Input("sin", {B, 1, S, 8});
  const Attrs partial = A({{"rotary_dim", int64_t{8}}, {"interleaved", int64_t{1}}});
  ValueId y = b.Op(OpKind::kRotary, {x, cos, sin}, partial);
  ValueId dx = b.Op(OpKind::kRotaryGrad, {b.Input("dy", {B, 4, S, 16}), cos, sin}, partial);
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(y), "(B, 4, S, 16)");
  EXPECT_EQ(b.Str(dx), "(B, 4, S, 16)");

  auto error = [](Shape table, int64_t rotary_dim) {
    Builder bad;
    bad.Op(OpKind::kRotary, {bad.Input("x", {B, 4, S, 16}), bad.Input("cos", table), bad.Input("sin", table)},
           A({{"rotary_dim", rotary_dim}}), "/rot");
    return std::string(bad.Infer().message());
  };
  EXPECT_THAT(error({B, 1, S, 8}, 6), HasSubstr("rotary_dim 6"));  // the tables' width
  EXPECT_THAT(error({B, 1, S, 7}, 7), HasSubstr("must be even"));
  EXPECT_THAT(error({B, 1, S, 32}, 32), HasSubstr("at most"));
  EXPECT_THAT(error({B, 3, S, 8}, 8), HasSubstr("does not broadcast"));
  EXPECT_THAT(error({B, 1, S, 8}, 6), HasSubstr("/rot"));
}

TEST(InferTest, GatedActivationAndItsGradient) {
  Builder b;
  ValueId gate = b.Input("gate", {B, S, 32}), up = b.Input("up", {B, S, 32});
  const Attrs silu = A({{"activation", std::string("silu")}});
  ValueId y = b.Op(OpKind::kGatedActivation, {gate, up}, silu);
  std::vector<ValueId> d = b.Node(OpKind::kGatedActivationGrad, {b.Input("dy", {B, S, 32}), gate, up}, 2, silu);
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(y), "(B, S, 32)");
  EXPECT_EQ(b.Str(d[0]), "(B, S, 32)");
  EXPECT_EQ(b.Str(d[1]), "(B, S, 32)");

  auto error = [](Shape up, Attrs attrs, DType up_dtype = DType::kF32) {
    Builder bad;
    bad.Op(OpKind::kGatedActivation, {bad.Input("gate", {B, S, 32}), bad.Input("up", up, up_dtype)}, attrs, "/act");
    return std::string(bad.Infer().message());
  };
  EXPECT_THAT(error({B, S, 1}, silu), HasSubstr("same shape"));  // no broadcast
  EXPECT_THAT(error({B, S, 32}, silu, DType::kF64), HasSubstr("same element type"));
  EXPECT_THAT(error({B, S, 32}, A({{"activation", std::string("relu")}})), HasSubstr("no gated activation"));
  EXPECT_THAT(error({B, S, 32}, A({{"activation", std::string("gelu")}, {"approximate", std::string("fast")}})),
              HasSubstr("/act"));
}

TEST(InferTest, SoftmaxCrossEntropyLossShapes) {
  Builder b;
  ValueId scores = b.Input("scores", {B, 10}), labels = b.Input("labels", {B}, DType::kI64);
  std::vector<ValueId> mean = b.Node(OpKind::kSoftmaxCrossEntropyLoss, {scores, labels}, 2);
  ValueId none = b.Op(OpKind::kSoftmaxCrossEntropyLoss, {scores, labels},
                      A({{"reduction", std::string("none")}}));
  ValueId sum = b.Op(OpKind::kSoftmaxCrossEntropyLoss, {scores, labels, b.Input("w", {10})},
                     A({{"reduction", std::string("sum")}}));
  // Token-level loss: scores (N, C, D1) with labels (N, D1).
  std::vector<ValueId> lm =
      b.Node(OpKind::kSoftmaxCrossEntropyLoss,
             {b.Input("logits", {B, 50, S}), b.Input("tok", {B, S}, DType::kI64)}, 2,
             A({{"reduction", std::string("none")}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(mean[0]), "()");
  EXPECT_EQ(b.Str(mean[1]), "(B, 10)");
  EXPECT_EQ(b.Str(none), "(B)");
  EXPECT_EQ(b.Str(sum), "()");
  EXPECT_EQ(b.Str(lm[0]), "(B, S)");
  EXPECT_EQ(b.Str(lm[1]), "(B, 50, S)");

  Builder bad;
  bad.Op(OpKind::kSoftmaxCrossEntropyLoss,
         {bad.Input("s", {4, 10, 7}), bad.Input("l", {4, 6}, DType::kI64)},
         A({{"reduction", std::string("none")}}), "/loss");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("'/loss' (SoftmaxCrossEntropyLoss)"));
}

TEST(InferTest, AttentionShapes) {
  Builder b;
  ValueId q = b.Input("q", {B, 4, S, 16}), k = b.Input("k", {B, 4, Dim::Symbol("T"), 16});
  ValueId v = b.Input("v", {B, 4, Dim::Symbol("T"), 8});
  ValueId mask = b.Input("mask", {B, 1, 1, Dim::Symbol("T")});
  ValueId o = b.Op(OpKind::kAttention, {q, k, v, mask}, A({{"scale", 0.25}}));
  ValueId bm = b.Input("bm", {S, S}, DType::kBool);
  ValueId o2 = b.Op(OpKind::kAttention, {q, q, q, bm}, A({{"mask_kind", std::string("bool")}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(o), "(B, 4, S, 8)");
  EXPECT_EQ(b.Str(o2), "(B, 4, S, 16)");

  Builder bad;
  bad.Op(OpKind::kAttention,
         {bad.Input("q", {2, 5, 16}), bad.Input("k", {2, 5, 8}), bad.Input("v", {2, 5, 8})}, {},
         "/attn");
  absl::Status st = bad.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/attn' (Attention)"));
  EXPECT_THAT(st.message(), HasSubstr("head dims"));
}

TEST(InferTest, LayoutOps) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 4, 16});
  ValueId t = b.Op(OpKind::kTranspose, {x}, A({{"perm", I({0, 2, 1, 3})}}));
  ValueId rev = b.Op(OpKind::kTranspose, {x});
  ValueId fl = b.Op(OpKind::kFlatten, {x}, A({{"axis", int64_t{2}}}));
  ValueId fl0 = b.Op(OpKind::kFlatten, {x}, A({{"axis", int64_t{0}}}));
  ValueId fl_neg = b.Op(OpKind::kFlatten, {x}, A({{"axis", int64_t{-1}}}));  // ONNX: -1 -> r - 1
  ValueId fl_r = b.Op(OpKind::kFlatten, {x}, A({{"axis", int64_t{4}}}));
  ValueId un = b.Op(OpKind::kUnsqueeze, {b.Input("m", {B, S})}, A({{"axes", I({1, -1})}}));
  ValueId sq = b.Op(OpKind::kSqueeze, {b.Input("one", {B, 1, S, 1})}, A({{"axes", I({-1, 1})}}));
  ValueId sq_all = b.Op(OpKind::kSqueeze, {b.Input("one2", {1, S, 1})});
  ValueId cat = b.Op(OpKind::kConcat, {b.Input("a", {B, S, 3}), b.Input("c", {B, S, 5})},
                     A({{"axis", int64_t{-1}}}));
  ValueId cat_s = b.Op(OpKind::kConcat, {x, x}, A({{"axis", int64_t{1}}}));
  ValueId cat_u =
      b.Op(OpKind::kConcat, {b.Input("p", {S}), b.Input("r", {4})}, A({{"axis", int64_t{0}}}));
  ValueId shp = b.Op(OpKind::kShape, {x}, A({{"start", int64_t{-3}}, {"end", int64_t{-1}}}));
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(t), "(B, 4, S, 16)");
  EXPECT_EQ(b.Str(rev), "(16, 4, S, B)");
  EXPECT_EQ(b.Str(fl), "(B*S, 64)");
  EXPECT_EQ(b.Str(fl0), "(1, 64*B*S)");
  EXPECT_EQ(b.Str(fl_neg), "(4*B*S, 16)");
  EXPECT_EQ(b.Str(fl_r), "(64*B*S, 1)");
  EXPECT_EQ(b.Str(un), "(B, 1, S, 1)");
  EXPECT_EQ(b.Str(sq), "(B, S)");
  EXPECT_EQ(b.Str(sq_all), "(S)");
  EXPECT_EQ(b.Str(cat), "(B, S, 8)");
  EXPECT_EQ(b.Str(cat_s), "(B, 2*S, 4, 16)");
  EXPECT_TRUE(b.Shp(cat_u)[0].is_unknown());
  EXPECT_EQ(b.Str(shp), "(2)");
  EXPECT_EQ(b.Type(shp), DType::kI64);

  Builder bad;
  bad.Op(OpKind::kConcat, {bad.Input("a", {2, 3}), bad.Input("c", {2, 3, 1})},
         A({{"axis", int64_t{0}}}), "/cat");
  EXPECT_THAT(bad.Infer().message(), HasSubstr("same rank"));
  Builder bad2;
  bad2.Op(OpKind::kTranspose, {bad2.Input("a", {2, 3})}, A({{"perm", I({0, 0})}}), "/tr");
  EXPECT_THAT(bad2.Infer().message(), HasSubstr("not a permutation"));
  Builder bad3;
  bad3.Op(OpKind::kSqueeze, {bad3.Input("a", {2, 3})}, A({{"axes", I({0})}}), "/sq");
  EXPECT_THAT(bad3.Infer().message(), HasSubstr("not 1"));
}

TEST(InferTest, ShapeCreatingOps) {
  Builder b;
  ValueId x = b.Input("x", {B, 1, S});
  ValueId ex = b.Op(OpKind::kExpand, {x, b.Ints({1, 4, 1})});
  ValueId ex_rank = b.Op(OpKind::kExpand, {b.Input("v", {S}), b.Ints({2, 1, 1})});
  ValueId cos = b.Op(OpKind::kConstantOfShape, {b.Op(OpKind::kShape, {x})},
                     A({{"value", Tensor::Scalar<int64_t>(1)}}));
  // arange(S): Range(0, Gather(Shape(x), 2), 1)
  ValueId s = b.Op(OpKind::kGather, {b.Op(OpKind::kShape, {x}), b.Scalar(2)});
  ValueId pos = b.Op(OpKind::kRange, {b.Scalar(0), s, b.Scalar(1)});
  ValueId r = b.Op(OpKind::kRange, {b.Scalar(0), b.Scalar(10), b.Scalar(3)});      // 0,3,6,9
  ValueId down = b.Op(OpKind::kRange, {b.Scalar(10), b.Scalar(0), b.Scalar(-4)});  // 10,6,2
  ValueId fr = b.Op(OpKind::kRange, {b.g.AddConstant("f0", Tensor::Scalar<float>(0.f)),
                                     b.g.AddConstant("f1", Tensor::Scalar<float>(1.f)),
                                     b.g.AddConstant("f2", Tensor::Scalar<float>(0.3f))});  // 4
  Attrs ca;
  ca.Set("value", Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6}));
  ValueId c = b.Op(OpKind::kConstant, {}, ca);
  ValueId cast = b.Op(OpKind::kCast, {x}, A({{"to", std::string("bf16")}}));
  std::vector<ValueId> drop = b.Node(OpKind::kDropout, {x}, 2, A({{"ratio", 0.1}}));
  ValueId tri = b.Op(OpKind::kTrilu, {b.Input("sq", {S, S}), b.Scalar(1)});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(ex), "(B, 4, S)");
  EXPECT_EQ(b.Str(ex_rank), "(2, 1, S)");
  EXPECT_EQ(b.Str(cos), "(B, 1, S)");
  EXPECT_EQ(b.Type(cos), DType::kI64);
  EXPECT_EQ(b.Str(pos), "(S)");
  EXPECT_EQ(b.Str(r), "(4)");
  EXPECT_EQ(b.Str(down), "(3)");
  EXPECT_EQ(b.Str(fr), "(4)");
  EXPECT_EQ(b.Type(fr), DType::kF32);
  EXPECT_EQ(b.Str(c), "(2, 3)");
  EXPECT_EQ(b.Type(cast), DType::kBF16);
  EXPECT_EQ(b.Str(drop[0]), "(B, 1, S)");
  EXPECT_EQ(b.Type(drop[1]), DType::kBool);
  EXPECT_EQ(b.Str(tri), "(S, S)");
}

// PyTorch exports x.expand(B, -1, -1) as Expand(x, Where(Equal(shape, -1), ones, shape)).
TEST(InferTest, TorchExpandPatternIsFollowed) {
  Builder b;
  ValueId h = b.Input("h", {B, S, 64}), cls = b.Input("cls", {1, 1, 64});
  ValueId bdim =
      b.Op(OpKind::kUnsqueeze, {b.Op(OpKind::kGather, {b.Op(OpKind::kShape, {h}), b.Scalar(0)})},
           A({{"axes", I({0})}}));
  ValueId shape = b.Op(OpKind::kConcat, {bdim, b.Ints({-1, -1})}, A({{"axis", int64_t{0}}}));
  ValueId ones =
      b.Op(OpKind::kConstantOfShape, {b.Ints({3})}, A({{"value", Tensor::Scalar<int64_t>(1)}}));
  ValueId is_neg = b.Op(OpKind::kEqual, {shape, b.Op(OpKind::kMul, {ones, b.Scalar(-1)})});
  ValueId fixed = b.Op(OpKind::kWhere, {is_neg, ones, shape});
  ValueId out = b.Op(OpKind::kExpand, {cls, fixed});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(out), "(B, 1, 64)");
}

TEST(InferTest, DeclaredShapesAreVerifiedAndRefined) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64}), w = b.Input("w", {64, 32});
  ValueId y = b.g.AddValue("y", DType::kF32, {Dim::Symbol("batch"), Dim::Unknown(), Dim(32)});
  b.g.AddNode(OpKind::kMatMul, "/mm", {x, w}, {y});
  ValueId z = b.g.AddValue("z", DType::kF32, {Dim(2), S, Dim::Unknown()});
  b.g.AddNode(OpKind::kRelu, "/relu", {y}, {z});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(y), "(B, S, 32)");  // inferred names win over the file's; named over unknown
  EXPECT_EQ(b.Str(z), "(2, S, 32)");  // a concrete declared dim is kept

  Builder bad;
  ValueId o = bad.g.AddValue("o", DType::kF32, {B, 128});
  bad.g.AddNode(OpKind::kMatMul, "/layers.1/MatMul",
                {bad.Input("x", {B, 64}), bad.Input("w", {64, 32})}, {o});
  absl::Status st = bad.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/layers.1/MatMul' (MatMul)"));
  EXPECT_THAT(st.message(), HasSubstr("'o' is declared f32(B, 128) but inferred f32(B, 32)"));

  Builder rank;
  ValueId r = rank.g.AddValue("r", DType::kF32, {Dim(4)});
  rank.g.AddNode(OpKind::kNeg, "/neg", {rank.Input("x", {2, 2})}, {r});
  EXPECT_THAT(rank.Infer().message(), HasSubstr("declared f32(4) but inferred f32(2, 2)"));
}

TEST(InferTest, AttributeErrorsNameNodeAndInput) {
  Builder b;
  b.Op(OpKind::kSoftmax, {b.Input("x", {B, S, 64})}, A({{"axis", int64_t{3}}}), "/sm");
  absl::Status st = b.Infer();
  EXPECT_THAT(st.message(), HasSubstr("'/sm' (Softmax): axis 3 is out of range [-3, 2]"));
  EXPECT_THAT(st.message(), HasSubstr("f32(B, S, 64)"));

  Builder c;
  c.Op(OpKind::kCast, {c.Input("x", {2})}, A({{"to", std::string("complex64")}}), "/cast");
  EXPECT_THAT(c.Infer().message(), HasSubstr("'/cast' (Cast): attribute 'to'"));

  Builder d;
  d.Op(OpKind::kUnsqueeze, {d.Input("x", {2})}, {}, "/unsq");
  EXPECT_THAT(d.Infer().message(), HasSubstr("'axes' is missing"));

  Builder e;
  e.Op(OpKind::kDropout, {e.Input("x", {2})}, A({{"ratio", 1.0}}), "/drop");
  EXPECT_THAT(e.Infer().message(), HasSubstr("ratio 1 must be in [0, 1)"));

  Builder f;  // Expand (3) to (2): 3 and 2 do not broadcast
  f.Op(OpKind::kExpand, {f.Input("x", {3}), f.Ints({2})}, {}, "/expand");
  EXPECT_THAT(f.Infer().message(),
              HasSubstr("'/expand' (Expand): shapes (3) (2) do not broadcast"));
}

TEST(InferTest, MissingInputShapeIsReported) {
  Builder b;
  ValueId x = b.g.AddValue("untyped", DType::kF32, {}, /*shape_known=*/false);
  b.g.inputs().push_back(x);
  b.Op(OpKind::kRelu, {x}, {}, "/relu");
  absl::Status st = b.Infer();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("'untyped'"));
}

TEST(InferTest, BindSymbols) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64});
  ValueId flat = b.Op(OpKind::kReshape, {x, b.Ints({-1, 64})});
  ValueId odd = b.Op(OpKind::kReshape, {x, b.Ints({-1, 128})});
  ASSERT_TRUE(b.Infer().ok());
  EXPECT_EQ(CollectSymbols(b.g), (std::set<std::string>{"B", "S"}));

  absl::Status st = BindSymbols(b.g, {{"T", 4}});
  EXPECT_THAT(st.message(), HasSubstr("'T' is not used"));
  EXPECT_THAT(st.message(), HasSubstr("B, S"));
  st = BindSymbols(b.g, {{"B", 0}});
  EXPECT_THAT(st.message(), HasSubstr("graph input 'x'"));
  EXPECT_EQ(b.Str(x), "(B, S, 64)");  // a failed bind changes nothing

  ASSERT_TRUE(BindSymbols(b.g, {{"B", 2}, {"S", 8}}).ok());
  EXPECT_EQ(b.Str(x), "(2, 8, 64)");
  EXPECT_EQ(b.Str(flat), "(16, 64)");
  EXPECT_TRUE(b.Shp(odd)[0].is_unknown());
  EXPECT_EQ(b.g.symbol_bindings.at("B"), 2);
  EXPECT_EQ(b.g.symbol_bindings.at("S"), 8);
  ASSERT_TRUE(InferShapes(b.g).ok());  // re-inference makes the rest concrete
  EXPECT_EQ(b.Str(odd), "(8, 128)");
  EXPECT_TRUE(BindSymbols(b.g, {{"B", 2}}).ok());  // binding again to the same size is harmless
  EXPECT_THAT(BindSymbols(b.g, {{"B", 3}}).message(), HasSubstr("already bound to 2"));
}

// A GPT-style causal mask buffer sliced to S: fine symbolically, and contradicted after binding S
// beyond the buffer, which the message attributes to the binding.
TEST(InferTest, BindingBeyondABufferIsReported) {
  Builder b;
  ValueId x = b.Input("x", {B, S});
  ValueId s =
      b.Op(OpKind::kUnsqueeze, {b.Op(OpKind::kGather, {b.Op(OpKind::kShape, {x}), b.Scalar(1)})},
           A({{"axes", I({0})}}));
  ValueId mask = b.Op(OpKind::kSlice, {b.Input("buf", {8, 8}), b.Ints({0}), s, b.Ints({0})}, {},
                      "/attn/Slice");
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(mask), "(S, 8)");
  ASSERT_TRUE(BindSymbols(b.g, {{"B", 2}, {"S", 6}}).ok());
  ASSERT_TRUE(InferShapes(b.g).ok());
  EXPECT_EQ(b.Str(mask), "(6, 8)");

  Builder c;
  ValueId y = c.Input("x", {B, S});
  ValueId t =
      c.Op(OpKind::kUnsqueeze, {c.Op(OpKind::kGather, {c.Op(OpKind::kShape, {y}), c.Scalar(1)})},
           A({{"axes", I({0})}}));
  c.Op(OpKind::kSlice, {c.Input("buf", {8, 8}), c.Ints({0}), t, c.Ints({0})}, {}, "/attn/Slice");
  ASSERT_TRUE(c.Infer().ok());
  ASSERT_TRUE(BindSymbols(c.g, {{"S", 16}}).ok());
  absl::Status st = InferShapes(c.g);
  EXPECT_THAT(st.message(), HasSubstr("'/attn/Slice' (Slice)"));
  EXPECT_THAT(st.message(), HasSubstr("declared f32(16, 8) but inferred f32(8, 8)"));
  EXPECT_THAT(st.message(), HasSubstr("S=16 bound"));
}

TEST(InferTest, TrainingOps) {
  Builder b;
  ValueId x = b.Input("x", {B, S, 64}), w = b.Input("w", {128, 64});
  ValueId dy = b.Input("dy", {B, S, 128});
  // dX = dY @ W: (B,S,128)@(128,64); dW = dY^T @ X summed over the batch via trans_a.
  ValueId dx = b.Op(OpKind::kFusedMatMul, {dy, w});
  ValueId dw = b.Op(OpKind::kFusedMatMul, {dy, x}, A({{"trans_a", int64_t{1}}}));
  ValueId red = b.Op(OpKind::kReduceToShapeOf, {dy, b.Input("bias", {128})});
  ValueId sum = b.Op(OpKind::kSum, {dx, x, b.Input("one", {64})});
  std::vector<ValueId> parts =
      b.Node(OpKind::kConcatGrad, {dx, b.Input("l0", {B, S, 16}), b.Input("l1", {B, S, 48})}, 2,
             A({{"axis", int64_t{2}}}));
  ValueId lr = b.Input("lr", {}, DType::kF64), step = b.Input("step", {}, DType::kI64);
  std::vector<ValueId> adam = b.Node(
      OpKind::kAdamWUpdate, {w, w, b.Input("m", {128, 64}), b.Input("v", {128, 64}), lr, step}, 3);
  ValueId norm = b.Op(OpKind::kSumSquares, {w, x});
  ASSERT_TRUE(b.Infer().ok()) << b.Infer();
  EXPECT_EQ(b.Str(dx), "(B, S, 64)");
  EXPECT_EQ(b.Str(dw), "(B, 128, 64)");
  EXPECT_EQ(b.Str(red), "(128)");
  EXPECT_EQ(b.Str(sum), "(B, S, 64)");
  EXPECT_EQ(b.Str(parts[0]), "(B, S, 16)");
  EXPECT_EQ(b.Str(parts[1]), "(B, S, 48)");
  for (ValueId v : adam) EXPECT_EQ(b.Str(v), "(128, 64)");
  EXPECT_EQ(b.Str(norm), "()");
}

}  // namespace
}  // namespace onnxpipe::ir
