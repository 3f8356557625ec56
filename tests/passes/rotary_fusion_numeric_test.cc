// The rotary fusion against the arithmetic it replaces, on the CPU backend: forward outputs, the
// loss's gradients through autodiff (the fused graph's RotaryGrad against the primitive ops' rules),
// and the stage ONNX file of the fused graph (written back as the exporters' arithmetic), which
// evaluates alike and fuses again on import.
#include "frontend/ir/verifier.h"
#include "frontend/passes/rotary_fusion.h"
#include "gtest/gtest.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::GraphBuilder;

const RotaryVariant kVariants[] = {
    {},
    {.width = 16, .rotary_dim = 8, .swap_add = true},
    {.interleaved = true, .swap_muls = true},
    {.interleaved = true, .width = 12, .rotary_dim = 8, .gptj_layout = true},
};

ir::Graph Fused(const ir::Graph& g) { return testing::FusedOnce<RotaryFusion>(g, OpKind::kRotary); }

TEST(RotaryFusionNumericTest, ForwardEqualsTheExportersArithmetic) {
  for (const RotaryVariant& v : kVariants) {
    GraphBuilder b;
    BuildRotary(b, v);
    testing::ExpectSameOutputs(b.graph(), Fused(b.graph()), 1e-6);
  }
}

TEST(RotaryFusionNumericTest, GradientsEqualThoseOfThePrimitiveOps) {
  for (const RotaryVariant& v : kVariants) {
    GraphBuilder b;
    const RotaryGraph built = BuildRotary(b, v);
    // Loss sum(y^2): dy = 2y reaches the parameter w through the rotation.
    const ir::Shape& ys = b.graph().value(built.y).shape;
    const ValueId sq = b.Op(OpKind::kMul, {built.y, built.y}, ys);
    b.graph().outputs() = {b.Op(OpKind::kReduceSum, {sq}, {}, testing::MakeAttrs({{"keepdims", int64_t{0}}}))};
    absl::StatusOr<std::vector<ir::Tensor>> plain = testing::LossAndGradients(b.graph(), /*training=*/true);
    absl::StatusOr<std::vector<ir::Tensor>> fused = testing::LossAndGradients(Fused(b.graph()), /*training=*/true);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(fused.ok()) << fused.status();
    absl::StatusOr<double> diff = testing::MaxAbsDiff(*plain, *fused);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, 1e-5) << "rotary_dim " << v.rotary_dim << " interleaved " << v.interleaved;
  }
}

TEST(RotaryFusionNumericTest, StageFileHoldsTheArithmeticAndFusesAgain) {
  for (const RotaryVariant& v : kVariants) {
    GraphBuilder b;
    BuildRotary(b, v);
    const ir::Graph fused = Fused(b.graph());
    absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(fused, "rotary_stage.onnx");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(testing::NodesOf(*back, OpKind::kRotary).empty()) << testing::HistogramString(*back);
    testing::ExpectSameOutputs(b.graph(), *back, 1e-6);
    ir::Graph refused = *back;
    RotaryFusion pass;
    absl::StatusOr<bool> changed = pass.Run(&refused);
    ASSERT_TRUE(changed.ok()) << changed.status();
    ASSERT_EQ(testing::NodesOf(refused, OpKind::kRotary).size(), 1u) << testing::HistogramString(refused);
    const ir::Node* rot = testing::NodesOf(refused, OpKind::kRotary)[0];
    EXPECT_EQ(rot->attrs.Get<int64_t>("rotary_dim", 0), v.rotary_dim);
    EXPECT_EQ(rot->attrs.Get<int64_t>("interleaved", -1), v.interleaved ? 1 : 0);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
