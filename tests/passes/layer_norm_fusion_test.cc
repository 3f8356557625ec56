#include "frontend/passes/layer_norm_fusion.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::Histogram;
using testing::MakeAttrs;
using Hist = std::map<std::string, int>;

struct Variant {
  int64_t axis = -1;           // axes of both ReduceMeans
  bool swap_operands = false;  // Add(eps, v), Mul(scale, n), Add(bias, y)
  bool square_as_mul = false;  // Mul(d, d) instead of Pow(d, 2)
  bool casts = false;          // Cast(d) -> Pow -> Cast, as the exporter writes for half inputs
  bool reciprocal = false;     // Mul(d, Reciprocal(s)) instead of Div(d, s)
  bool bias = true;
  double pow_exponent = 2.0;
  bool extra_mean_use = false;  // negative: the mean has another consumer
};

struct Built {
  ValueId x, scale, bias, y;
};

// The opset < 17 export of nn.LayerNorm(16, eps=1e-5) on a (B, S, 16) input.
Built BuildDecomposedLayerNorm(GraphBuilder& b, const Variant& v) {
  const Dim B = Dim::Symbol("B"), S = Dim::Symbol("S");
  const ir::Shape full = {B, S, Dim(16)}, reduced = {B, S, Dim(1)};
  const ir::Attrs axes = MakeAttrs({{"axes", std::vector<int64_t>{v.axis}}});
  Built out;
  out.x = b.Input("x", full);
  ValueId m = b.Op(OpKind::kReduceMean, {out.x}, reduced, axes);
  ValueId d = b.Op(OpKind::kSub, {out.x, m}, full);
  if (v.extra_mean_use) b.Output(m);
  const ir::Attrs to_f32 = MakeAttrs({{"to", std::string("f32")}});
  ValueId d_sq = v.casts ? b.Op(OpKind::kCast, {d}, full, to_f32) : d;
  ValueId p = v.square_as_mul ? b.Op(OpKind::kMul, {d_sq, d_sq}, full)
                              : b.Op(OpKind::kPow, {d_sq, b.Scalar(static_cast<float>(v.pow_exponent))}, full);
  if (v.casts) p = b.Op(OpKind::kCast, {p}, full, to_f32);
  ValueId var = b.Op(OpKind::kReduceMean, {p}, reduced, axes);
  ValueId eps = b.Scalar(1e-5f);
  ValueId e = b.Op(OpKind::kAdd, v.swap_operands ? std::vector<ValueId>{eps, var} : std::vector<ValueId>{var, eps},
                   reduced);
  ValueId s = b.Op(OpKind::kSqrt, {e}, reduced);
  ValueId n = v.reciprocal ? b.Op(OpKind::kMul, {d, b.Op(OpKind::kReciprocal, {s}, reduced)}, full)
                           : b.Op(OpKind::kDiv, {d, s}, full);
  out.scale = b.Param("ln.weight", {16});
  ValueId y = b.Op(OpKind::kMul, v.swap_operands ? std::vector<ValueId>{out.scale, n} : std::vector<ValueId>{n, out.scale},
                   full);
  out.bias = ir::kNoValue;
  if (v.bias) {
    out.bias = b.Param("ln.bias", {16});
    y = b.Op(OpKind::kAdd, v.swap_operands ? std::vector<ValueId>{out.bias, y} : std::vector<ValueId>{y, out.bias},
             full);
  }
  out.y = b.Op(OpKind::kRelu, {y}, full);  // a consumer, so the LayerNorm output is internal
  b.Output(out.y);
  return out;
}

void ExpectFused(const Variant& v) {
  GraphBuilder b;
  Built built = BuildDecomposedLayerNorm(b, v);
  ir::Graph& g = b.graph();
  LayerNormFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r) << testing::HistogramString(g);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  EXPECT_EQ(Histogram(g), (Hist{{"LayerNorm", 1}, {"Relu", 1}}));
  const ir::Node* ln = testing::NodesOf(g, OpKind::kLayerNorm)[0];
  std::vector<ValueId> expected = {built.x, built.scale};
  if (v.bias) expected.push_back(built.bias);
  EXPECT_EQ(ln->inputs, expected);
  EXPECT_EQ(ln->attrs.Get<int64_t>("axis", 0), -1);
  EXPECT_FLOAT_EQ(ln->attrs.Get<float>("epsilon", 0), 1e-5f);
  EXPECT_EQ(g.node(g.value(built.y).producer).inputs[0], ln->outputs[0]);
}

TEST(LayerNormFusionTest, ExporterPattern) { ExpectFused({}); }
TEST(LayerNormFusionTest, PositiveLastAxis) { ExpectFused({.axis = 2}); }
TEST(LayerNormFusionTest, SwappedCommutativeOperands) { ExpectFused({.swap_operands = true}); }
TEST(LayerNormFusionTest, SquareAsMul) { ExpectFused({.square_as_mul = true}); }
TEST(LayerNormFusionTest, CastsAroundPow) { ExpectFused({.casts = true}); }
TEST(LayerNormFusionTest, Reciprocal) { ExpectFused({.reciprocal = true}); }
TEST(LayerNormFusionTest, NoBias) { ExpectFused({.bias = false}); }
TEST(LayerNormFusionTest, EverythingAtOnce) {
  ExpectFused({.axis = 2, .swap_operands = true, .casts = true, .reciprocal = true});
}

void ExpectNotFused(const Variant& v) {
  GraphBuilder b;
  BuildDecomposedLayerNorm(b, v);
  ir::Graph& g = b.graph();
  const Hist before = Histogram(g);
  LayerNormFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  EXPECT_EQ(Histogram(g), before);
}

TEST(LayerNormFusionTest, MeanWithAnotherConsumerIsNotFused) { ExpectNotFused({.extra_mean_use = true}); }
TEST(LayerNormFusionTest, OtherAxisIsNotFused) { ExpectNotFused({.axis = 1}); }
TEST(LayerNormFusionTest, OtherExponentIsNotFused) { ExpectNotFused({.pow_exponent = 3.0}); }

}  // namespace
}  // namespace onnxpipe::passes
