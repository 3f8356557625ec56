// AttentionLayout on the layout chains PyTorch's exporter writes for nn.MultiheadAttention: the
// copies disappear, the fused Attention reads and writes through views, and the forward, the
// gradients (autodiff's AttentionGrad through the same views) and the stage ONNX written from the
// rewritten graph all equal the graph with the copies on the CPU backend.

#include "frontend/ir/attention_views.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/attention_layout.h"
#include "frontend/passes/dead_code_elimination.h"
#include "frontend/passes/row_layout_motion.h"
#include "gtest/gtest.h"
#include "tests/passes/fusion_numeric_util.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

constexpr int64_t kS = 5, kB = 2, kH = 2, kDh = 4, kE = kH * kDh;

// x (S, B, E) -> packed projection (S, B, 3E) -> q, k, v through the exporter's chain
// (Reshape, Unsqueeze, Transpose, Squeeze, Split, Squeeze, Reshape, Transpose, Reshape) ->
// Attention -> Transpose, Reshape (S*B, E) -> output projection -> sum of squares (the loss).
// `pieces` < 3 feeds V from its own projection instead of the packed one. `batch_first`: as
// nn.MultiheadAttention(batch_first=True) exports, x is (B, S, E), transposed to (S, B, E) before the
// input projection, and the output projection's (S*B, E) rows go back to (B, S, E) through a
// Reshape and a Transpose.
ir::Graph Mha(int pieces = 3, bool batch_first = false) {
  GraphBuilder b;
  ValueId x = b.Input("x", batch_first ? ir::Shape{Dim(kB), Dim(kS), Dim(kE)} : ir::Shape{Dim(kS), Dim(kB), Dim(kE)});
  if (batch_first) {
    x = b.Op(OpKind::kTranspose, {x}, {Dim(kS), Dim(kB), Dim(kE)},
             MakeAttrs({{"perm", std::vector<int64_t>{1, 0, 2}}}));
  }
  const ValueId w = b.Param("w_in", {kE, 3 * kE});
  const ValueId packed = b.Op(OpKind::kMatMul, {x, w}, {Dim(kS), Dim(kB), Dim(3 * kE)});
  const ValueId r = b.Op(OpKind::kReshape, {packed, b.IntVec({kS, kB, 3, kE})}, {Dim(kS), Dim(kB), Dim(3), Dim(kE)});
  const ValueId u = b.Op(OpKind::kUnsqueeze, {r}, {Dim(1), Dim(kS), Dim(kB), Dim(3), Dim(kE)},
                         MakeAttrs({{"axes", std::vector<int64_t>{0}}}));
  const ValueId t = b.Op(OpKind::kTranspose, {u}, {Dim(3), Dim(kS), Dim(kB), Dim(1), Dim(kE)},
                         MakeAttrs({{"perm", std::vector<int64_t>{3, 1, 2, 0, 4}}}));
  const ValueId sq =
      b.Op(OpKind::kSqueeze, {t}, {Dim(3), Dim(kS), Dim(kB), Dim(kE)}, MakeAttrs({{"axes", std::vector<int64_t>{3}}}));
  ir::Graph& g = b.graph();
  std::vector<ValueId> parts;
  for (int i = 0; i < 3; ++i)
    parts.push_back(g.AddValue("part" + std::to_string(i), ir::DType::kF32, {Dim(1), Dim(kS), Dim(kB), Dim(kE)}));
  g.AddNode(OpKind::kSplit, "split", {sq}, parts, MakeAttrs({{"axis", int64_t{0}}}));
  std::vector<ValueId> heads;
  for (int i = 0; i < 3; ++i) {
    ValueId p =
        b.Op(OpKind::kSqueeze, {parts[i]}, {Dim(kS), Dim(kB), Dim(kE)}, MakeAttrs({{"axes", std::vector<int64_t>{0}}}));
    if (i >= pieces) p = b.Op(OpKind::kMatMul, {x, b.Param("w_v", {kE, kE})}, {Dim(kS), Dim(kB), Dim(kE)});
    const ValueId a = b.Op(OpKind::kReshape, {p, b.IntVec({kS, kB * kH, kDh})}, {Dim(kS), Dim(kB * kH), Dim(kDh)});
    const ValueId c = b.Op(OpKind::kTranspose, {a}, {Dim(kB * kH), Dim(kS), Dim(kDh)},
                           MakeAttrs({{"perm", std::vector<int64_t>{1, 0, 2}}}));
    heads.push_back(b.Op(OpKind::kReshape, {c, b.IntVec({kB, kH, kS, kDh})}, {Dim(kB), Dim(kH), Dim(kS), Dim(kDh)}));
  }
  const ValueId o = b.Op(OpKind::kAttention, heads, {Dim(kB), Dim(kH), Dim(kS), Dim(kDh)},
                         MakeAttrs({{"scale", 0.5}, {"causal", int64_t{1}}}));
  const ValueId ot = b.Op(OpKind::kTranspose, {o}, {Dim(kS), Dim(kB), Dim(kH), Dim(kDh)},
                          MakeAttrs({{"perm", std::vector<int64_t>{2, 0, 1, 3}}}));
  const ValueId flat = b.Op(OpKind::kReshape, {ot, b.IntVec({kS * kB, kE})}, {Dim(kS * kB), Dim(kE)});
  ValueId y = b.Op(OpKind::kMatMul, {flat, b.Param("w_out", {kE, kE})}, {Dim(kS * kB), Dim(kE)});
  if (batch_first) {
    y = b.Op(OpKind::kReshape, {y, b.IntVec({kS, kB, kE})}, {Dim(kS), Dim(kB), Dim(kE)});
    y = b.Op(OpKind::kTranspose, {y}, {Dim(kB), Dim(kS), Dim(kE)},
             MakeAttrs({{"perm", std::vector<int64_t>{1, 0, 2}}}));
  }
  // A position-dependent loss, so that a wrong row order shows.
  y = b.Op(OpKind::kMul, {y, b.Param("w_pos", ir::ToInts(b.graph().value(y).shape))}, b.graph().value(y).shape);
  const ValueId sq2 = b.Op(OpKind::kMul, {y, y}, b.graph().value(y).shape);
  b.Output(b.Op(OpKind::kReduceSum, {sq2}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  return g;
}

// The graph's outputs and every parameter's gradient on the same random input.
std::vector<ir::Tensor> LossAndGradients(const ir::Graph& g) {
  absl::StatusOr<std::vector<ir::Tensor>> out = testing::LossAndGradients(g, /*training=*/false);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::vector<ir::Tensor>{};
}

const ir::Node& OnlyAttention(const ir::Graph& g) {
  for (ir::NodeId id : g.LiveNodes())
    if (g.node(id).op == OpKind::kAttention) return g.node(id);
  ADD_FAILURE() << "no Attention node";
  return g.node(0);
}

TEST(AttentionLayoutTest, PackedProjectionIsReadAndWrittenInPlace) {
  const ir::Graph g = Mha();
  const ir::Graph after = testing::LaidOut(g);
  const std::map<std::string, int> hist = testing::Histogram(after);
  EXPECT_EQ(hist.count("Transpose"), 0u) << testing::HistogramString(after);
  EXPECT_EQ(hist.count("Split"), 0u) << testing::HistogramString(after);
  const ir::Node& att = OnlyAttention(after);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ir::HasAttentionView(att, i)) << i;
  EXPECT_EQ(att.inputs[0], att.inputs[1]);
  EXPECT_EQ(att.inputs[0], att.inputs[2]);
  // Q[b, h, s, d] = packed[s, b, h * Dh + d]: offset 0, strides (3E, Dh, B * 3E, 1); K one E further.
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("q_view"),
            (std::vector<int64_t>{0, kB, 3 * kE, kH, kDh, kS, kB * 3 * kE, kDh, 1}));
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("k_view")[0], kE);
  // O[b, h, s, d] lands at row s * B + b, column h * Dh + d of the (S*B, E) output.
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("o_view"),
            (std::vector<int64_t>{0, kB, kE, kH, kDh, kS, kB * kE, kDh, 1}));

  absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(g, {}, 3);
  ASSERT_TRUE(feeds.ok()) << feeds.status();
  absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(g, *feeds);
  absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(after, *feeds);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_EQ(*testing::MaxAbsDiff(*want, *got), 0.0);

  // One gradient for the packed value, written through the three views.
  const std::vector<ir::Tensor> grads_want = LossAndGradients(g), grads_got = LossAndGradients(after);
  ASSERT_EQ(grads_want.size(), 4u);  // the loss, dW_in, dW_out, dW_pos
  absl::StatusOr<double> diff = testing::MaxAbsDiff(grads_want, grads_got);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(*diff, 1e-5);
}

TEST(AttentionLayoutTest, BatchFirstTransposesMoveAcrossTheProjectionsIntoTheViews) {
  const ir::Graph g = Mha(3, /*batch_first=*/true);
  const ir::Graph after = testing::LaidOut(g);
  const std::map<std::string, int> hist = testing::Histogram(after);
  EXPECT_EQ(hist.count("Transpose"), 0u) << testing::HistogramString(after);
  EXPECT_EQ(hist.count("Split"), 0u) << testing::HistogramString(after);
  const ir::Node& att = OnlyAttention(after);
  // Q[b, h, s, d] = packed[b, s, h * Dh + d] of the (B, S, 3E) projection of x as given.
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("q_view"),
            (std::vector<int64_t>{0, kB, kS * 3 * kE, kH, kDh, kS, 3 * kE, kDh, 1}));
  // O[b, h, s, d] lands at (b, s, h * Dh + d) of the (B, S, E) value the output projection reads.
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("o_view"),
            (std::vector<int64_t>{0, kB, kS * kE, kH, kDh, kS, kE, kDh, 1}));
  EXPECT_EQ(att.attrs.Get<std::vector<int64_t>>("o_shape"), (std::vector<int64_t>{kB, kS, kE}));

  absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(g, {}, 3);
  ASSERT_TRUE(feeds.ok()) << feeds.status();
  absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(g, *feeds);
  absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(after, *feeds);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_LE(*testing::MaxAbsDiff(*want, *got), 1e-6);
  const std::vector<ir::Tensor> grads_want = LossAndGradients(g), grads_got = LossAndGradients(after);
  ASSERT_EQ(grads_want.size(), 4u);
  absl::StatusOr<double> diff = testing::MaxAbsDiff(grads_want, grads_got);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(*diff, 1e-5);
}

TEST(AttentionLayoutTest, RowTransposesAwayFromAttentionStay) {
  // x (B, S, E) -> Transpose -> MatMul -> loss: moving the Transpose below the MatMul saves nothing.
  GraphBuilder b;
  const ValueId x = b.Input("x", {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId t =
      b.Op(OpKind::kTranspose, {x}, {Dim(kS), Dim(kB), Dim(kE)}, MakeAttrs({{"perm", std::vector<int64_t>{1, 0, 2}}}));
  const ValueId y = b.Op(OpKind::kMatMul, {t, b.Param("w", {kE, 3 * kE})}, {Dim(kS), Dim(kB), Dim(3 * kE)});
  b.Output(b.Op(OpKind::kReduceSum, {y}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  ir::Graph g = b.graph();
  absl::StatusOr<bool> changed = RowLayoutMotion().Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

TEST(AttentionLayoutTest, StageOnnxOfTheViewsComputesTheSame) {
  for (bool batch_first : {false, true}) {
    SCOPED_TRACE(batch_first);
    const ir::Graph g = Mha(3, batch_first);
    const ir::Graph after = testing::LaidOut(g);
    absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(after, "attention_layout_stage.onnx");
    ASSERT_TRUE(back.ok()) << back.status();
    absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(g, {}, 5);
    absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(g, *feeds);
    absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(*back, *feeds);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_LE(*testing::MaxAbsDiff(*want, *got), 1e-5);
  }
}

TEST(AttentionLayoutTest, StageOnnxWritesTheStatsOutput) {
  // Attention's optional Stats (each row's log-sum-exp, f32) written with standard ops: the stage
  // file computes what the CPU kernel does, for f32 and bf16 operands.
  std::vector<ir::Tensor> f32_feeds;
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kBF16}) {
    GraphBuilder b;
    const ir::Shape qs = {Dim(kB), Dim(kH), Dim(kS), Dim(kDh)};
    const ValueId q = b.Input("q", qs, dt), k = b.Input("k", qs, dt), v = b.Input("v", qs, dt);
    ir::Graph& g = b.graph();
    const ValueId o = g.AddValue("o", dt, qs);
    const ValueId stats = g.AddValue("stats", ir::DType::kF32, {Dim(kB), Dim(kH), Dim(kS)});
    g.AddNode(OpKind::kAttention, "attn", {q, k, v}, {o, stats}, MakeAttrs({{"scale", 0.5}, {"causal", int64_t{1}}}));
    b.Output(o);
    b.Output(stats);
    absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(g, "attention_stats_stage.onnx");
    ASSERT_TRUE(back.ok()) << back.status();
    if (f32_feeds.empty()) f32_feeds = *testing::RandomFeeds(g, {}, 9);
    std::vector<ir::Tensor> feeds;
    for (const ir::Tensor& t : f32_feeds) feeds.push_back(t.CastTo(dt));
    absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(g, feeds);
    absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(*back, feeds);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[1].dtype(), ir::DType::kF32);
    EXPECT_LE(*testing::MaxAbsDiff(*want, *got), dt == ir::DType::kF32 ? 1e-5 : 2e-2) << ir::DTypeName(dt);
  }
}

TEST(AttentionLayoutTest, StageOnnxRepeatsGroupedKAndVOverTheQueryHeads) {
  // Grouped-query attention (K and V with 2 heads for Q's 6) written with standard ops: K and V
  // repeated as transformers' repeat_kv (Unsqueeze, Expand, Reshape), then the plain attention; the
  // file computes what the CPU kernel does, with the batch and key length symbolic in the file.
  GraphBuilder b;
  const Dim batch = Dim::Symbol("B"), keys = Dim::Symbol("S");
  const ValueId q = b.Input("q", {batch, Dim(6), Dim(4), Dim(8)});
  const ValueId k = b.Input("k", {batch, Dim(2), keys, Dim(8)}), v = b.Input("v", {batch, Dim(2), keys, Dim(3)});
  const ValueId o = b.Op(OpKind::kAttention, {q, k, v}, {batch, Dim(6), Dim(4), Dim(3)}, MakeAttrs({{"scale", 0.5}}));
  b.Output(o);
  ir::Graph& g = b.graph();
  absl::StatusOr<ir::Graph> back = testing::StageOnnxRoundTrip(g, "attention_gqa_stage.onnx");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(ir::BindSymbols(g, {{"B", 2}, {"S", 5}}).ok());
  ASSERT_TRUE(ir::InferShapes(g).ok());
  ASSERT_TRUE(ir::BindSymbols(*back, {{"B", 2}, {"S", 5}}).ok());
  ASSERT_TRUE(ir::InferShapes(*back).ok());
  const std::vector<ir::Tensor> feeds = *testing::RandomFeeds(g, {}, 3);
  absl::StatusOr<std::vector<ir::Tensor>> want = testing::Evaluate(g, feeds);
  absl::StatusOr<std::vector<ir::Tensor>> got = testing::Evaluate(*back, feeds);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_LE(*testing::MaxAbsDiff(*want, *got), 1e-5);
}

TEST(AttentionLayoutTest, ViewsThatLeaveAPieceUnreadAreNotTaken) {
  // V comes from elsewhere: the packed value's third part is read by no view, so Q's and K's views
  // do not cover it and AttentionGrad could not write its whole gradient: Q and K keep their inputs.
  const ir::Graph after = testing::LaidOut(Mha(/*pieces=*/2));
  const ir::Node& att = OnlyAttention(after);
  EXPECT_FALSE(ir::HasAttentionView(att, 0));
  EXPECT_FALSE(ir::HasAttentionView(att, 1));
  EXPECT_TRUE(ir::HasAttentionView(att, 2));  // V's own projection, viewed whole
  EXPECT_TRUE(ir::HasAttentionView(att, 3));
  const std::vector<ir::Tensor> want = LossAndGradients(Mha(2)), got = LossAndGradients(after);
  EXPECT_LE(*testing::MaxAbsDiff(want, got), 1e-5);
}

TEST(AttentionLayoutTest, SymbolicShapesAreLeftAlone) {
  GraphBuilder b;
  const Dim B = Dim::Symbol("B");
  const ValueId x = b.Input("x", {B, Dim(kS), Dim(kE)});
  const ValueId t = b.Op(OpKind::kTranspose,
                         {b.Op(OpKind::kReshape, {x, b.IntVec({0, kS, kH, kDh})}, {B, Dim(kS), Dim(kH), Dim(kDh)})},
                         {B, Dim(kH), Dim(kS), Dim(kDh)}, MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  b.Output(b.Op(OpKind::kAttention, {t, t, t}, {B, Dim(kH), Dim(kS), Dim(kDh)}));
  ir::Graph g = b.graph();
  absl::StatusOr<bool> changed = AttentionLayout().Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

}  // namespace
}  // namespace onnxpipe::passes
