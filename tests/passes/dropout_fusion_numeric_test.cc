// DropoutFusion: a Dropout after a Gelu becomes the Gelu's fused dropout. The fused graph must
// compute what the unfused one does while training (the same mask: the Gelu carries the Dropout's
// random-stream key), forward and gradients (GeluGrad regenerates the mask DropoutGrad read), bit
// for bit on the CPU backend; its stage ONNX (Gelu then Dropout again) must too.

#include "frontend/ir/verifier.h"
#include "frontend/passes/dropout_fusion.h"
#include "gtest/gtest.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

constexpr int64_t kB = 4, kS = 6, kE = 8, kH = 16;

// x -> MatMul -> Gelu -> Dropout -> MatMul -> sum of squares. `read_mask`: the Dropout's mask is a
// graph output too; `gelu_reused`: the Gelu's output is also added to the result.
ir::Graph Mlp(const std::string& approximate, bool read_mask = false, bool gelu_reused = false) {
  GraphBuilder b;
  const ValueId x = b.Input("x", {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId h = b.Op(OpKind::kMatMul, {x, b.Param("w1", {kE, kH})}, {Dim(kB), Dim(kS), Dim(kH)});
  const ValueId a = b.Op(OpKind::kGelu, {h}, {Dim(kB), Dim(kS), Dim(kH)}, MakeAttrs({{"approximate", approximate}}));
  ir::Graph& g = b.graph();
  const ValueId d = g.AddValue("dropped", ir::DType::kF32, {Dim(kB), Dim(kS), Dim(kH)});
  std::vector<ValueId> outs = {d};
  if (read_mask) outs.push_back(g.AddValue("mask", ir::DType::kBool, {Dim(kB), Dim(kS), Dim(kH)}));
  g.AddNode(OpKind::kDropout, "/mlp/dropout/Dropout", {a}, outs, MakeAttrs({{"ratio", 0.3}}));
  ValueId y = b.Op(OpKind::kMatMul, {d, b.Param("w2", {kH, kE})}, {Dim(kB), Dim(kS), Dim(kE)});
  if (gelu_reused) {
    const ValueId r = b.Op(OpKind::kReduceSum, {a}, {Dim(kB), Dim(kS), Dim(1)},
                           MakeAttrs({{"axes", std::vector<int64_t>{2}}, {"keepdims", int64_t{1}}}));
    y = b.Op(OpKind::kAdd, {y, r}, {Dim(kB), Dim(kS), Dim(kE)});
  }
  const ValueId sq = b.Op(OpKind::kMul, {y, y}, {Dim(kB), Dim(kS), Dim(kE)});
  b.Output(b.Op(OpKind::kReduceSum, {sq}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  if (read_mask) b.Output(outs[1]);
  return g;
}

bool Fused(ir::Graph* g) {
  absl::StatusOr<bool> changed = DropoutFusion().Run(g);
  EXPECT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(ir::Verify(*g).ok()) << ir::Verify(*g);
  return changed.ok() && *changed;
}

// The loss and every parameter's gradient while training, on fixed inputs.
std::vector<ir::Tensor> LossAndGradients(const ir::Graph& g) {
  absl::StatusOr<std::vector<ir::Tensor>> out = testing::LossAndGradients(g, /*training=*/true);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<ir::Tensor>{};
}

TEST(DropoutFusionTest, GeluCarriesTheDropoutAndComputesTheSameBitForBit) {
  for (const char* approximate : {"none", "tanh"}) {
    SCOPED_TRACE(approximate);
    const ir::Graph g = Mlp(approximate);
    ir::Graph fused = g;
    ASSERT_TRUE(Fused(&fused));
    EXPECT_TRUE(testing::NodesOf(fused, OpKind::kDropout).empty()) << testing::HistogramString(fused);
    const std::vector<const ir::Node*> gelu = testing::NodesOf(fused, OpKind::kGelu);
    ASSERT_EQ(gelu.size(), 1u);
    EXPECT_EQ(gelu[0]->attrs.Get<double>("dropout", 0.0), 0.3);
    EXPECT_EQ(gelu[0]->attrs.Get<std::string>("rng_key", ""), "/mlp/dropout/Dropout");

    const std::vector<ir::Tensor> want = LossAndGradients(g), got = LossAndGradients(fused);
    ASSERT_EQ(want.size(), 3u);  // the loss, dW1, dW2
    EXPECT_EQ(*testing::MaxAbsDiff(want, got), 0.0);
    // The dropout is active: training differs from inference.
    absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(g, {}, 7);
    ASSERT_TRUE(feeds.ok());
    absl::StatusOr<std::vector<ir::Tensor>> inference = testing::Evaluate(fused, *feeds);
    ASSERT_TRUE(inference.ok()) << inference.status();
    EXPECT_NE((*inference)[0].GetAsDouble(0), want[0].GetAsDouble(0));
  }
}

TEST(DropoutFusionTest, DropoutsWhoseMaskOrInputIsReadElsewhereStay) {
  for (bool read_mask : {false, true}) {
    ir::Graph g = Mlp("none", read_mask, /*gelu_reused=*/!read_mask);
    EXPECT_FALSE(Fused(&g)) << read_mask;
    EXPECT_EQ(testing::NodesOf(g, OpKind::kDropout).size(), 1u);
  }
}

TEST(DropoutFusionTest, StageOnnxDrawsTheSameMask) {
  ir::Graph fused = Mlp("none");
  ASSERT_TRUE(Fused(&fused));
  // The Gelu's keep bits (which a training graph's forward keeps for the backward) are an output too.
  ir::NodeId gelu = ir::kNoNode;
  for (ir::NodeId id : fused.LiveNodes())
    if (fused.node(id).op == OpKind::kGelu) gelu = id;
  ASSERT_NE(gelu, ir::kNoNode);
  const ValueId bits = fused.AddValue("keep_bits", ir::DType::kU8, {Dim(kB), Dim(kS), Dim(kH / 8)});
  fused.node(gelu).outputs.push_back(bits);
  fused.value(bits).producer = gelu;
  fused.value(bits).producer_output = 1;
  fused.outputs().push_back(bits);
  absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(fused, "dropout_fusion_stage.onnx");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(testing::NodesOf(*back, OpKind::kDropout).size(), 1u);
  absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(fused, {}, 5);
  absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(fused, *feeds, /*training=*/true);
  absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(*back, *feeds, /*training=*/true);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_LE(*testing::MaxAbsDiff(*want, *got), 1e-5);
  ASSERT_EQ(want->size(), 2u);
  EXPECT_EQ((*got)[1].dtype(), ir::DType::kU8);
  EXPECT_TRUE((*got)[1].BitwiseEquals((*want)[1]));
}

}  // namespace
}  // namespace onnxpipe::passes
