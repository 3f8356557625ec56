// The gated activation fusion against the arithmetic it replaces, on the CPU backend: forward
// outputs, the loss's gradients through autodiff (the fused graph's GatedActivationGrad against the
// primitive ops' rules: Mul, Sigmoid, Gelu), and the stage ONNX file of the fused graph (written back
// as the exporters' arithmetic), which evaluates alike and fuses again on import.
#include "frontend/ir/verifier.h"
#include "frontend/passes/gated_activation_fusion.h"
#include "frontend/passes/gelu_fusion.h"
#include "gtest/gtest.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::GraphBuilder;

const GatedMlpVariant kVariants[] = {
    {.symbolic = false},
    {.symbolic = false, .sigmoid_first = true, .up_first = true},
    {.act = GatedMlpVariant::kGeluErf, .symbolic = false},
    {.act = GatedMlpVariant::kGeluTanh, .symbolic = false, .up_first = true},
    {.symbolic = false, .up_is_gate = true},
};

std::string Describe(const GatedMlpVariant& v) {
  return std::string(v.act == GatedMlpVariant::kSilu      ? "silu"
                     : v.act == GatedMlpVariant::kGeluErf ? "gelu"
                                                          : "tanh") +
         (v.up_first ? " up first" : "") + (v.up_is_gate ? " up = gate" : "");
}

ir::Graph Fused(const ir::Graph& g) { return testing::FusedOnce<GatedActivationFusion>(g, OpKind::kGatedActivation); }

TEST(GatedActivationFusionNumericTest, ForwardEqualsTheExportersArithmetic) {
  for (const GatedMlpVariant& v : kVariants) {
    SCOPED_TRACE(Describe(v));
    GraphBuilder b;
    BuildGatedMlp(b, v);
    // act(gate) as the unfused kernels compute it, then the product: the same f32 operations.
    testing::ExpectSameOutputs(b.graph(), Fused(b.graph()), 1e-6);
  }
}

TEST(GatedActivationFusionNumericTest, GradientsEqualThoseOfThePrimitiveOps) {
  for (const GatedMlpVariant& v : kVariants) {
    SCOPED_TRACE(Describe(v));
    GraphBuilder b;
    const GatedMlpGraph built = BuildGatedMlp(b, v);
    // Loss sum(y^2): dy = 2y reaches every projection's weight through the activation.
    const ir::Shape& ys = b.graph().value(built.y).shape;
    const ValueId sq = b.Op(OpKind::kMul, {built.y, built.y}, ys);
    b.graph().outputs() = {b.Op(OpKind::kReduceSum, {sq}, {}, testing::MakeAttrs({{"keepdims", int64_t{0}}}))};
    absl::StatusOr<std::vector<ir::Tensor>> plain = testing::LossAndGradients(b.graph(), /*training=*/true);
    absl::StatusOr<std::vector<ir::Tensor>> fused = testing::LossAndGradients(Fused(b.graph()), /*training=*/true);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(fused.ok()) << fused.status();
    ASSERT_EQ(plain->size(), v.up_is_gate ? 3u : 4u);  // the loss and each projection's gradient
    absl::StatusOr<double> diff = testing::MaxAbsDiff(*plain, *fused);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, 1e-5);
  }
}

TEST(GatedActivationFusionNumericTest, StageFileHoldsTheArithmeticAndFusesAgain) {
  for (const GatedMlpVariant& v : kVariants) {
    SCOPED_TRACE(Describe(v));
    GraphBuilder b;
    BuildGatedMlp(b, v);
    const ir::Graph fused = Fused(b.graph());
    absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(fused, "gated_activation_stage.onnx");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(testing::NodesOf(*back, OpKind::kGatedActivation).empty()) << testing::HistogramString(*back);
    testing::ExpectSameOutputs(b.graph(), *back, 1e-6);
    // The import sees the exporters' arithmetic: GELU's fusion first, then this one's.
    ir::Graph refused = *back;
    GeluFusion gelu;
    GatedActivationFusion gated;
    for (Pass* pass : {static_cast<Pass*>(&gelu), static_cast<Pass*>(&gated)}) {
      absl::StatusOr<bool> changed = pass->Run(&refused);
      ASSERT_TRUE(changed.ok()) << changed.status();
    }
    ASSERT_EQ(testing::NodesOf(refused, OpKind::kGatedActivation).size(), 1u) << testing::HistogramString(refused);
    EXPECT_EQ(testing::NodesOf(refused, OpKind::kGatedActivation)[0]->attrs,
              testing::NodesOf(fused, OpKind::kGatedActivation)[0]->attrs);
    testing::ExpectSameOutputs(b.graph(), refused, 1e-6);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
