#include "frontend/passes/layer_norm_fusion.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::Histogram;
using testing::MakeAttrs;
using Hist = std::map<std::string, int>;

void ExpectFused(const LayerNormVariant& v) {
  GraphBuilder b;
  LayerNormGraph built = BuildDecomposedLayerNorm(b, v);
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

void ExpectNotFused(const LayerNormVariant& v) {
  GraphBuilder b;
  BuildDecomposedLayerNorm(b, v);
  testing::ExpectUnchangedBy<LayerNormFusion>(b.graph());
}

TEST(LayerNormFusionTest, MeanWithAnotherConsumerIsNotFused) { ExpectNotFused({.extra_mean_use = true}); }
TEST(LayerNormFusionTest, OtherAxisIsNotFused) { ExpectNotFused({.axis = 1}); }
TEST(LayerNormFusionTest, OtherExponentIsNotFused) { ExpectNotFused({.pow_exponent = 3.0}); }

}  // namespace
}  // namespace onnxpipe::passes
