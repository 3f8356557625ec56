#include "frontend/passes/gated_activation_fusion.h"

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

void ExpectFused(const GatedMlpVariant& v, const std::string& activation, const std::string& approximate) {
  GraphBuilder b;
  const GatedMlpGraph built = BuildGatedMlp(b, v);
  ir::Graph& g = b.graph();
  GatedActivationFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r) << testing::HistogramString(g);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  // What is left: the three projections and the fused activation.
  EXPECT_EQ(Histogram(g), (Hist{{"MatMul", v.up_is_gate ? 2 : 3}, {"GatedActivation", 1}}))
      << testing::HistogramString(g);
  const ir::Node* fused = testing::NodesOf(g, OpKind::kGatedActivation)[0];
  EXPECT_EQ(fused->inputs, (std::vector<ValueId>{built.gate, built.up}));
  EXPECT_EQ(fused->outputs[0], built.h);
  EXPECT_EQ(fused->attrs.Get<std::string>("activation", ""), activation);
  EXPECT_EQ(fused->attrs.Get<std::string>("approximate", "(absent)"), approximate);
}

TEST(GatedActivationFusionTest, SiluBothExporters) { ExpectFused({}, "silu", "(absent)"); }
TEST(GatedActivationFusionTest, SiluOperandsSwapped) {
  ExpectFused({.sigmoid_first = true}, "silu", "(absent)");
  ExpectFused({.up_first = true}, "silu", "(absent)");
  ExpectFused({.sigmoid_first = true, .up_first = true}, "silu", "(absent)");
}
TEST(GatedActivationFusionTest, GeluErfAndTanh) {
  ExpectFused({.act = GatedMlpVariant::kGeluErf}, "gelu", "none");
  ExpectFused({.act = GatedMlpVariant::kGeluTanh, .up_first = true}, "gelu", "tanh");
}
TEST(GatedActivationFusionTest, ConcreteShapes) { ExpectFused({.symbolic = false}, "silu", "(absent)"); }
TEST(GatedActivationFusionTest, GateAsUp) { ExpectFused({.up_is_gate = true}, "silu", "(absent)"); }

void ExpectNotFused(const GatedMlpVariant& v) {
  GraphBuilder b;
  BuildGatedMlp(b, v);
  testing::ExpectUnchangedBy<GatedActivationFusion>(b.graph());
}

TEST(GatedActivationFusionTest, ActivationWithAnotherConsumerIsNotFused) {
  ExpectNotFused({.act_used = true});
  ExpectNotFused({.sigmoid_used = true});
  ExpectNotFused({.act = GatedMlpVariant::kGeluTanh, .act_used = true});
}
TEST(GatedActivationFusionTest, BroadcastUpIsNotFused) {
  ExpectNotFused({.broadcast_up = true});
  ExpectNotFused({.act = GatedMlpVariant::kGeluErf, .up_first = true, .broadcast_up = true});
}
TEST(GatedActivationFusionTest, OtherActivationsAreNotFused) {
  ExpectNotFused({.sigmoid_of_other = true});
  ExpectNotFused({.tanh_not_sigmoid = true});
  ExpectNotFused({.act = GatedMlpVariant::kGeluErf, .gelu_dropout = true});
}

// Symbolic dims equal only to themselves: up with another batch symbol may broadcast at run time.
TEST(GatedActivationFusionTest, OtherSymbolIsNotFused) {
  GraphBuilder b;
  const ir::Shape gate_shape = {ir::Dim::Symbol("B"), ir::Dim(16)}, up_shape = {ir::Dim::Symbol("N"), ir::Dim(16)};
  const ValueId gate = b.Input("gate", gate_shape), up = b.Input("up", up_shape);
  const ValueId s = b.Op(OpKind::kSigmoid, {gate}, gate_shape);
  const ValueId act = b.Op(OpKind::kMul, {gate, s}, gate_shape);
  b.Output(b.Op(OpKind::kMul, {act, up}, gate_shape));
  GatedActivationFusion pass;
  absl::StatusOr<bool> r = pass.Run(&b.graph());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r) << testing::HistogramString(b.graph());
}

}  // namespace
}  // namespace onnxpipe::passes
