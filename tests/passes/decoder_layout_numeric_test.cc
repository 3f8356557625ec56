// RowLayoutMotion and AttentionLayout on a Hugging Face decoder's attention (Llama, Qwen2, Mistral):
// each projection is reshaped to (B, S, H, D) and transposed to (B, H, S, D), Q and K are rotated there
// (Rotary, Llama's (B, 1, S, D) tables), K and V have fewer heads than Q (grouped-query), and the output
// goes back through a Transpose and a Reshape. After the passes no Transpose is left: Rotary runs on
// the (B, S, H, D) rows and the fused Attention reads Q, K, V and writes O through views. The forward
// and every gradient equal the graph with the copies on the CPU backend.

#include "frontend/ir/attention_views.h"
#include "frontend/passes/pattern.h"
#include "gtest/gtest.h"
#include "tests/passes/fusion_numeric_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

constexpr int64_t kB = 2, kS = 5, kH = 4, kHkv = 2, kD = 4, kE = kH * kD;

// A projection of x (B, S, E) to `heads` heads of kD, as (B, heads, S, D); rotated by cos and sin when
// given.
ValueId Heads(GraphBuilder& b, ValueId x, const std::string& name, int64_t heads, ValueId cos, ValueId sin) {
  const ValueId p = b.Op(OpKind::kMatMul, {x, b.Param(name, {kE, heads * kD})}, {Dim(kB), Dim(kS), Dim(heads * kD)});
  const ValueId r = b.Op(OpKind::kReshape, {p, b.IntVec({kB, kS, heads, kD})}, {Dim(kB), Dim(kS), Dim(heads), Dim(kD)});
  const ir::Shape bhsd = {Dim(kB), Dim(heads), Dim(kS), Dim(kD)};
  const ValueId t = b.Op(OpKind::kTranspose, {r}, bhsd, MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  if (cos == ir::kNoValue) return t;
  return b.Op(OpKind::kRotary, {t, cos, sin}, bhsd, MakeAttrs({{"rotary_dim", kD}}));
}

ir::Graph Decoder(const std::vector<int64_t>& table_dims) {
  GraphBuilder b;
  const ValueId x = b.Input("x", {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId cos = b.Input("cos", ir::FromInts(table_dims)), sin = b.Input("sin", ir::FromInts(table_dims));
  const ValueId q = Heads(b, x, "w_q", kH, cos, sin), k = Heads(b, x, "w_k", kHkv, cos, sin);
  const ValueId v = Heads(b, x, "w_v", kHkv, ir::kNoValue, ir::kNoValue);
  const ValueId o = b.Op(OpKind::kAttention, {q, k, v}, {Dim(kB), Dim(kH), Dim(kS), Dim(kD)},
                         MakeAttrs({{"scale", 0.5}, {"causal", int64_t{1}}}));
  const ValueId ot = b.Op(OpKind::kTranspose, {o}, {Dim(kB), Dim(kS), Dim(kH), Dim(kD)},
                          MakeAttrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  const ValueId flat = b.Op(OpKind::kReshape, {ot, b.IntVec({kB, kS, kE})}, {Dim(kB), Dim(kS), Dim(kE)});
  ValueId y = b.Op(OpKind::kMatMul, {flat, b.Param("w_o", {kE, kE})}, {Dim(kB), Dim(kS), Dim(kE)});
  // A position-dependent loss, so that a wrong row order shows.
  y = b.Op(OpKind::kMul, {y, b.Param("w_pos", {kB, kS, kE})}, {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId sq = b.Op(OpKind::kMul, {y, y}, {Dim(kB), Dim(kS), Dim(kE)});
  b.Output(b.Op(OpKind::kReduceSum, {sq}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  return b.graph();
}

// The forward on random inputs, and the loss with every parameter's gradient, before and after.
void ExpectSameResults(const ir::Graph& g, const ir::Graph& after) {
  testing::ExpectSameOutputs(g, after, 1e-6);
  absl::StatusOr<std::vector<ir::Tensor>> grads_want = testing::LossAndGradients(g, /*training=*/false);
  absl::StatusOr<std::vector<ir::Tensor>> grads_got = testing::LossAndGradients(after, /*training=*/false);
  ASSERT_TRUE(grads_want.ok() && grads_got.ok()) << grads_want.status() << grads_got.status();
  ASSERT_EQ(grads_want->size(), 6u);  // the loss, dW_q, dW_k, dW_v, dW_o, dW_pos
  absl::StatusOr<double> diff = testing::MaxAbsDiff(*grads_want, *grads_got);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(*diff, 1e-5);
}

TEST(DecoderLayoutTest, RotatedGroupedHeadsAreReadThroughViews) {
  // Llama's tables (B, 1, S, D), and the (S, D) tables some exports broadcast from.
  for (const std::vector<int64_t>& table : {std::vector<int64_t>{kB, 1, kS, kD}, std::vector<int64_t>{kS, kD}}) {
    SCOPED_TRACE(::testing::PrintToString(table));
    const ir::Graph g = Decoder(table);
    const ir::Graph after = testing::LaidOut(g);
    const std::map<std::string, int> hist = testing::Histogram(after);
    EXPECT_EQ(hist.count("Transpose"), 0u) << testing::HistogramString(after);
    EXPECT_EQ(hist.at("Rotary"), 2);
    for (ir::NodeId id : after.LiveNodes()) {
      const ir::Node& n = after.node(id);
      if (n.op == OpKind::kRotary) {  // on the projection's rows, (B, S, H, D)
        EXPECT_EQ(after.value(n.inputs[0]).shape[1], Dim(kS)) << n.name;
      }
      if (n.op != OpKind::kAttention) continue;
      for (int i = 0; i < 4; ++i) EXPECT_TRUE(ir::HasAttentionView(n, i)) << i;
      // K[b, h, s, d] = k_rows[b, s, h, d] of the grouped (B, S, Hkv, D) rows.
      EXPECT_EQ(n.attrs.Get<std::vector<int64_t>>("k_view"),
                (std::vector<int64_t>{0, kB, kS * kHkv * kD, kHkv, kD, kS, kHkv * kD, kD, 1}));
    }
    ExpectSameResults(g, after);
  }
}

TEST(DecoderLayoutTest, PerHeadTablesAreTransposedWithTheRows) {
  // Tables (1, H, S, D) vary over two dims the Transpose swaps: they follow the rows by a Transpose of
  // their own (tiny), and Q's copy is still absorbed.
  GraphBuilder b;
  const ValueId x = b.Input("x", {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId cos = b.Input("cos", {Dim(1), Dim(kH), Dim(kS), Dim(kD)});
  const ValueId sin = b.Input("sin", {Dim(1), Dim(kH), Dim(kS), Dim(kD)});
  const ValueId q = Heads(b, x, "w_q", kH, cos, sin), k = Heads(b, x, "w_k", kH, ir::kNoValue, ir::kNoValue);
  const ValueId v = Heads(b, x, "w_v", kH, ir::kNoValue, ir::kNoValue);
  const ValueId o = b.Op(OpKind::kAttention, {q, k, v}, {Dim(kB), Dim(kH), Dim(kS), Dim(kD)},
                         MakeAttrs({{"scale", 0.5}}));
  const ValueId w = b.Param("w_out", {kB, kH, kS, kD});
  const ValueId y = b.Op(OpKind::kMul, {o, w}, {Dim(kB), Dim(kH), Dim(kS), Dim(kD)});
  b.Output(b.Op(OpKind::kReduceSum, {b.Op(OpKind::kMul, {y, y}, {Dim(kB), Dim(kH), Dim(kS), Dim(kD)})}, {},
                MakeAttrs({{"keepdims", int64_t{0}}})));
  const ir::Graph per_head = b.graph();
  const ir::Graph after = testing::LaidOut(per_head);
  const ir::Node* rotary = nullptr;
  for (ir::NodeId id : after.LiveNodes())
    if (after.node(id).op == OpKind::kRotary) rotary = &after.node(id);
  ASSERT_NE(rotary, nullptr);
  const ir::Node* table = ProducerOf(after, rotary->inputs[1]);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->op, OpKind::kTranspose);
  EXPECT_EQ(after.value(rotary->inputs[1]).shape, ir::Shape({Dim(1), Dim(kS), Dim(kH), Dim(kD)}));
  testing::ExpectSameOutputs(per_head, after, 1e-6);
}

TEST(DecoderLayoutTest, RotaryOutsideAttentionKeepsItsTranspose) {
  // The rotated value is also a graph output: moving the Transpose would not remove a copy.
  GraphBuilder b;
  const ValueId x = b.Input("x", {Dim(kB), Dim(kS), Dim(kE)});
  const ValueId cos = b.Input("cos", {Dim(kS), Dim(kD)}), sin = b.Input("sin", {Dim(kS), Dim(kD)});
  b.Output(Heads(b, x, "w_q", kH, cos, sin));
  ir::Graph g = b.graph();
  testing::ExpectUnchangedBy<RowLayoutMotion>(g);
}

}  // namespace
}  // namespace onnxpipe::passes
