#include "frontend/passes/rms_norm_fusion.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::Histogram;
using Hist = std::map<std::string, int>;

void ExpectFused(const RMSNormVariant& v) {
  GraphBuilder b;
  RMSNormGraph built = BuildDecomposedRMSNorm(b, v);
  ir::Graph& g = b.graph();
  RMSNormFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r) << testing::HistogramString(g);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  EXPECT_EQ(Histogram(g), (Hist{{"RMSNorm", 1}, {"Relu", 1}}));
  const ir::Node* rms = testing::NodesOf(g, OpKind::kRMSNorm)[0];
  EXPECT_EQ(rms->inputs, (std::vector<ValueId>{built.x, built.weight}));
  EXPECT_EQ(rms->attrs.Get<int64_t>("axis", 0), v.two_axes ? -2 : -1);
  EXPECT_FLOAT_EQ(rms->attrs.Get<float>("epsilon", 0), 1e-6f);
  EXPECT_EQ(g.node(g.value(built.y).producer).inputs[0], rms->outputs[0]);
}

TEST(RMSNormFusionTest, LlamaExport) { ExpectFused({}); }
TEST(RMSNormFusionTest, DivOneBySqrt) { ExpectFused({.rsqrt = RMSNormVariant::kDivOneBySqrt}); }
TEST(RMSNormFusionTest, PowMinusHalf) { ExpectFused({.rsqrt = RMSNormVariant::kPowMinusHalf}); }
TEST(RMSNormFusionTest, DivBySqrt) { ExpectFused({.rsqrt = RMSNormVariant::kDivBySqrt}); }
TEST(RMSNormFusionTest, SquareAsMul) { ExpectFused({.square_as_mul = true}); }
TEST(RMSNormFusionTest, CastToFloat32AndBack) { ExpectFused({.casts = true}); }
TEST(RMSNormFusionTest, WeightSecond) { ExpectFused({.weight_first = false}); }
TEST(RMSNormFusionTest, TwoTrailingAxes) { ExpectFused({.two_axes = true}); }
TEST(RMSNormFusionTest, EverythingAtOnce) {
  ExpectFused({.rsqrt = RMSNormVariant::kDivBySqrt, .square_as_mul = true, .casts = true, .weight_first = false,
               .two_axes = true});
}

void ExpectNotFused(const RMSNormVariant& v) {
  GraphBuilder b;
  BuildDecomposedRMSNorm(b, v);
  testing::ExpectUnchangedBy<RMSNormFusion>(b.graph());
}

TEST(RMSNormFusionTest, TrainableEpsIsNotFolded) { ExpectNotFused({.eps_parameter = true}); }
TEST(RMSNormFusionTest, MeanOfSquaresUsedElsewhere) { ExpectNotFused({.extra_mean_use = true}); }
TEST(RMSNormFusionTest, SquareOfAnotherValue) { ExpectNotFused({.other_square = true}); }
TEST(RMSNormFusionTest, MeanOverAMiddleAxis) { ExpectNotFused({.middle_axis = true}); }

}  // namespace
}  // namespace onnxpipe::passes
