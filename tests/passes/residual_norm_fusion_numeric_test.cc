// ResidualNormFusion: Dropout -> Add -> LayerNorm becomes one LayerNorm with a fused residual, Add -> RMSNorm one
// RMSNorm with a fused residual. The
// fused graph must compute what the unfused one does while training (the same mask: the LayerNorm
// carries the Dropout's random-stream key), forward and gradients, bit for bit on the CPU backend,
// post-LN (the sum read by the norm only) and pre-LN (the sum also read by the next residual add);
// its stage ONNX (Dropout, Add, LayerNormalization again) must too.

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/residual_norm_fusion.h"
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

constexpr int64_t kB = 4, kS = 6, kE = 8;
const ir::Shape kShape = {Dim(kB), Dim(kS), Dim(kE)};

struct Block {
  bool pre_ln = false;         // the sum is also added to the block's output (read twice)
  bool dropout = true;         // a Dropout between the projection and the add
  bool read_mask = false;      // the Dropout's mask is a graph output
  bool broadcast = false;      // the residual is a (kE) row: no fusion
  bool dropped_first = false;  // Add(dropped, x) instead of Add(x, dropped)
  bool rms = false;            // RMSNorm(s, gamma) instead of LayerNorm(s, gamma, beta)
};

// x -> MatMul -> [Dropout] -> Add(x, .) -> LayerNorm -> MatMul [+ sum] -> sum of squares.
ir::Graph Encoder(const Block& c) {
  GraphBuilder b;
  const ValueId x = b.Input("x", kShape);
  ValueId h = b.Op(OpKind::kMatMul, {x, b.Param("w1", {kE, kE})}, kShape);
  ir::Graph& g = b.graph();
  ValueId mask = ir::kNoValue;
  if (c.dropout) {
    const ValueId d = g.AddValue("dropped", ir::DType::kF32, kShape);
    std::vector<ValueId> outs = {d};
    if (c.read_mask) outs.push_back(mask = g.AddValue("mask", ir::DType::kBool, kShape));
    g.AddNode(OpKind::kDropout, "/layer/dropout1/Dropout", {h}, outs, MakeAttrs({{"ratio", 0.25}}));
    h = d;
  }
  const ValueId r = c.broadcast ? b.Param("row", {kE}) : x;
  const ValueId s =
      b.Op(OpKind::kAdd, c.dropped_first ? std::vector<ValueId>{h, r} : std::vector<ValueId>{r, h}, kShape);
  const ValueId n = c.rms ? b.Op(OpKind::kRMSNorm, {s, b.Param("gamma", {kE})}, kShape,
                                 MakeAttrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}}))
                          : b.Op(OpKind::kLayerNorm, {s, b.Param("gamma", {kE}), b.Param("beta", {kE})}, kShape,
                                 MakeAttrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}}));
  ValueId y = b.Op(OpKind::kMatMul, {n, b.Param("w2", {kE, kE})}, kShape);
  if (c.pre_ln) y = b.Op(OpKind::kAdd, {s, y}, kShape);
  const ValueId sq = b.Op(OpKind::kMul, {y, y}, kShape);
  b.Output(b.Op(OpKind::kReduceSum, {sq}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  if (c.read_mask) b.Output(mask);
  return g;
}

bool Fused(ir::Graph* g) {
  absl::StatusOr<bool> changed = ResidualNormFusion().Run(g);
  EXPECT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(ir::Verify(*g).ok()) << ir::Verify(*g);
  EXPECT_TRUE(ir::InferShapes(*g).ok()) << ir::InferShapes(*g);
  return changed.ok() && *changed;
}

// The loss and every parameter's gradient while training, on fixed inputs.
std::vector<ir::Tensor> LossAndGradients(const ir::Graph& g) {
  absl::StatusOr<std::vector<ir::Tensor>> out = testing::LossAndGradients(g, /*training=*/true);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<ir::Tensor>{};
}

TEST(ResidualNormFusionTest, LayerNormTakesTheAddAndDropoutAndComputesTheSameBitForBit) {
  for (const bool pre_ln : {false, true}) {
    for (const bool dropped_first : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "pre_ln " << pre_ln << " dropped_first " << dropped_first);
      const ir::Graph g = Encoder({.pre_ln = pre_ln, .dropped_first = dropped_first});
      ir::Graph fused = g;
      ASSERT_TRUE(Fused(&fused));
      EXPECT_TRUE(testing::NodesOf(fused, OpKind::kDropout).empty()) << testing::HistogramString(fused);
      EXPECT_EQ(testing::NodesOf(fused, OpKind::kAdd).size(), pre_ln ? 1u : 0u) << testing::HistogramString(fused);
      const std::vector<const ir::Node*> ln = testing::NodesOf(fused, OpKind::kLayerNorm);
      ASSERT_EQ(ln.size(), 1u);
      EXPECT_EQ(ln[0]->attrs.Get<double>("dropout", 0.0), 0.25);
      EXPECT_EQ(ln[0]->attrs.Get<std::string>("rng_key", ""), "/layer/dropout1/Dropout");
      ASSERT_EQ(ln[0]->inputs.size(), 4u);
      EXPECT_EQ(fused.value(ln[0]->inputs[3]).name, "x");                                 // the residual stream
      EXPECT_EQ(ln[0]->outputs.size() > 3 && ln[0]->outputs[3] != ir::kNoValue, pre_ln);  // Sum for the next add

      const std::vector<ir::Tensor> want = LossAndGradients(g), got = LossAndGradients(fused);
      ASSERT_EQ(want.size(), 5u);  // the loss, dW1, dGamma, dBeta, dW2
      EXPECT_EQ(*testing::MaxAbsDiff(want, got), 0.0);

      // Pre-LN: the sum's other gradient (the next add's) is LayerNormGrad's dresidual, not an Add after it.
      ir::Graph trained = fused;
      ASSERT_TRUE(autodiff::BuildGradients(&trained, trained.outputs()[0], {}).ok());
      const std::vector<const ir::Node*> lng = testing::NodesOf(trained, OpKind::kLayerNormGrad);
      ASSERT_EQ(lng.size(), 1u);
      EXPECT_EQ(lng[0]->inputs.size() > 5 && lng[0]->inputs[5] != ir::kNoValue, pre_ln);
      // The dropped operand's gradient is the LayerNormGrad's dXDropped: no DropoutGrad reads its dX again.
      EXPECT_TRUE(testing::NodesOf(trained, OpKind::kDropoutGrad).empty()) << testing::HistogramString(trained);
      ASSERT_EQ(lng[0]->outputs.size(), 4u);
      EXPECT_NE(lng[0]->outputs[3], ir::kNoValue);
      EXPECT_EQ(lng[0]->attrs.Get<double>("dropout", 0.0), 0.25);
    }
  }
}

TEST(ResidualNormFusionTest, AnAddWithoutDropoutFusesAlone) {
  const ir::Graph g = Encoder({.dropout = false});
  ir::Graph fused = g;
  ASSERT_TRUE(Fused(&fused));
  EXPECT_TRUE(testing::NodesOf(fused, OpKind::kAdd).empty()) << testing::HistogramString(fused);
  EXPECT_FALSE(testing::NodesOf(fused, OpKind::kLayerNorm)[0]->attrs.Has("dropout"));
  EXPECT_EQ(*testing::MaxAbsDiff(LossAndGradients(g), LossAndGradients(fused)), 0.0);
}

TEST(ResidualNormFusionTest, AReadMaskKeepsItsDropoutAndABroadcastAddStays) {
  ir::Graph masked = Encoder({.read_mask = true});
  ASSERT_TRUE(Fused(&masked));  // the Add still fuses, the Dropout stays
  EXPECT_EQ(testing::NodesOf(masked, OpKind::kDropout).size(), 1u);
  EXPECT_FALSE(testing::NodesOf(masked, OpKind::kLayerNorm)[0]->attrs.Has("dropout"));
  ir::Graph row = Encoder({.broadcast = true});
  EXPECT_FALSE(Fused(&row));
  EXPECT_EQ(testing::NodesOf(row, OpKind::kAdd).size(), 1u);
}

// Pre-norm (Llama) blocks: RMSNorm takes the Add (residual input 2, Sum output 2 for the next add) and computes the
// same bit for bit, forward and gradients; a Dropout before the Add stays a node.
TEST(ResidualNormFusionTest, RMSNormTakesTheAddAndComputesTheSameBitForBit) {
  for (const bool pre_ln : {false, true}) {
    for (const bool dropout : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "pre_ln " << pre_ln << " dropout " << dropout);
      const ir::Graph g = Encoder({.pre_ln = pre_ln, .dropout = dropout, .rms = true});
      ir::Graph fused = g;
      ASSERT_TRUE(Fused(&fused));
      EXPECT_EQ(testing::NodesOf(fused, OpKind::kDropout).size(), dropout ? 1u : 0u);
      EXPECT_EQ(testing::NodesOf(fused, OpKind::kAdd).size(), pre_ln ? 1u : 0u) << testing::HistogramString(fused);
      const std::vector<const ir::Node*> rms = testing::NodesOf(fused, OpKind::kRMSNorm);
      ASSERT_EQ(rms.size(), 1u);
      EXPECT_FALSE(rms[0]->attrs.Has("dropout"));
      ASSERT_EQ(rms[0]->inputs.size(), 3u);
      EXPECT_EQ(fused.value(rms[0]->inputs[2]).name, "x");
      EXPECT_EQ(rms[0]->outputs.size() > 2 && rms[0]->outputs[2] != ir::kNoValue, pre_ln);

      const std::vector<ir::Tensor> want = LossAndGradients(g), got = LossAndGradients(fused);
      ASSERT_EQ(want.size(), 4u);  // the loss, dW1, dGamma, dW2
      EXPECT_EQ(*testing::MaxAbsDiff(want, got), 0.0);

      ir::Graph trained = fused;
      ASSERT_TRUE(autodiff::BuildGradients(&trained, trained.outputs()[0], {}).ok());
      const std::vector<const ir::Node*> grad = testing::NodesOf(trained, OpKind::kRMSNormGrad);
      ASSERT_EQ(grad.size(), 1u);
      const int dres = ir::NormGradResidualInput(OpKind::kRMSNormGrad);
      EXPECT_EQ(static_cast<int>(grad[0]->inputs.size()) > dres && grad[0]->inputs[dres] != ir::kNoValue, pre_ln);
    }
  }
}

TEST(ResidualNormFusionTest, StageOnnxDrawsTheSameMask) {
  for (const bool pre_ln : {false, true}) {
    for (const bool rms : {false, true}) {
      ir::Graph fused = Encoder({.pre_ln = pre_ln, .rms = rms});
      ASSERT_TRUE(Fused(&fused));
      absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(fused, "residual_norm_fusion_stage.onnx");
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(testing::NodesOf(*back, OpKind::kDropout).size(), 1u) << pre_ln;
      absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(fused, {}, 5);
      absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(fused, *feeds, /*training=*/true);
      absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(*back, *feeds, /*training=*/true);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
      EXPECT_LE(*testing::MaxAbsDiff(*want, *got), 1e-5) << pre_ln << " rms " << rms;
    }
  }
}

}  // namespace
}  // namespace onnxpipe::passes
