#include "frontend/passes/attention_fusion.h"

#include <cmath>
#include <limits>

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
using ir::Tensor;
using ir::ValueId;
using testing::GraphBuilder;
using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::Histogram;
using testing::MakeAttrs;
using Hist = std::map<std::string, int>;

absl::StatusOr<bool> RunAttention(ir::Graph& g) {
  AttentionFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  if (r.ok()) {
    EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  }
  return r;
}

const ir::Node& OnlyAttention(const ir::Graph& g) {
  std::vector<const ir::Node*> nodes = testing::NodesOf(g, OpKind::kAttention);
  EXPECT_EQ(nodes.size(), 1u) << testing::HistogramString(g);
  return *nodes.at(0);
}

// The inserted K transpose turns (S, B*H, Dh) into (B*H, S, Dh).
void ExpectKIsTransposedFrom(const ir::Graph& g, ValueId k, ValueId source, std::vector<int64_t> perm) {
  const ir::Node* t = g.node(g.value(k).producer).op == OpKind::kTranspose ? &g.node(g.value(k).producer) : nullptr;
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->inputs[0], source);
  EXPECT_EQ(t->scope, "/l");  // the layer scope of the attention it feeds
  EXPECT_EQ(t->attrs.Get<std::vector<int64_t>>("perm"), perm);
}

TEST(AttentionFusionTest, MultiheadAttentionExport) {
  GraphBuilder b;
  MhaGraph m = BuildMha(b, {});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Transpose", 4}}));  // q, v, new k, output
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 3u);
  EXPECT_EQ(att.inputs[0], m.qh);
  ExpectKIsTransposedFrom(g, att.inputs[1], m.kr, {1, 0, 2});
  EXPECT_EQ(att.inputs[2], m.vh);
  EXPECT_EQ(att.outputs[0], m.out);
  EXPECT_NEAR(att.attrs.Get<double>("scale", 0), 1.0 / std::sqrt(8.0), 1e-6);
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
  EXPECT_NEAR(att.attrs.Get<double>("dropout", 0), 0.1, 1e-9);
  EXPECT_FALSE(att.attrs.Has("mask_kind"));
  EXPECT_EQ(g.value(att.inputs[1]).shape, (ir::Shape{Dim(4), Dim(kS), Dim(8)}));
}

TEST(AttentionFusionTest, ConstantCausalMaskBecomesCausal) {
  GraphBuilder b;
  BuildMha(b, {.mask = MhaOptions::kCausalConst});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Transpose", 4}}));
  const ir::Node& att = OnlyAttention(g);
  EXPECT_EQ(att.inputs.size(), 3u);
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 1);
}

TEST(AttentionFusionTest, InputMaskStaysAdditive) {
  GraphBuilder b;
  MhaGraph m = BuildMha(b, {.mask = MhaOptions::kInputMask});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_EQ(att.inputs[3], m.mask);  // the Mul by 1 is stripped
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Transpose", 4}}));
}

void ExpectMhaNotFused(const MhaOptions& o) {
  GraphBuilder b;
  BuildMha(b, o);
  testing::ExpectUnchanged(b.graph(), [](ir::Graph& g) { return RunAttention(g); });
}

TEST(AttentionFusionTest, SoftmaxWithAnotherConsumerIsNotFused) {
  ExpectMhaNotFused({.extra_softmax_use = true});
}
TEST(AttentionFusionTest, ScalingAfterTheMaskIsNotFused) {
  ExpectMhaNotFused({.mask = MhaOptions::kInputMask, .scale_after_mask = true});
}
TEST(AttentionFusionTest, UsedDropoutMaskIsNotFused) { ExpectMhaNotFused({.dropout_mask_used = true}); }

TEST(AttentionFusionTest, NanGuardOfSdpaDecompositionsIsAbsorbed) {
  GraphBuilder b;
  MhaGraph m = BuildMha(b, {.mask = MhaOptions::kInputMask, .nan_guard = MhaOptions::kZeroGuard});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  // The fused op yields zeros for a fully masked row, which is what the guard makes of its NaNs.
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Transpose", 4}}));
  EXPECT_EQ(OnlyAttention(g).inputs[3], m.mask);
}
TEST(AttentionFusionTest, NanGuardWithAnotherFillIsNotFused) {
  ExpectMhaNotFused({.nan_guard = MhaOptions::kOneGuard});
}
TEST(AttentionFusionTest, NanGuardWithAnotherSoftmaxUseIsNotFused) {
  ExpectMhaNotFused({.extra_softmax_use = true, .nan_guard = MhaOptions::kZeroGuard});
}

TEST(AttentionFusionTest, GptMaskedFillWithConstantTriangleIsCausal) {
  GraphBuilder b;
  GptGraph m = BuildGpt(b, {});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Transpose", 3}}));
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 3u);
  EXPECT_EQ(att.inputs[0], m.qh);
  ExpectKIsTransposedFrom(g, att.inputs[1], m.kr, {0, 2, 1, 3});
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 1);
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("scale", 0), 0.5);
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("dropout", -1), 0.0);
}

TEST(AttentionFusionTest, MaskedFillWithInputConditionIsNegatedToAKeepMask) {
  GraphBuilder b;
  GptGraph m = BuildGpt(b, {.cond = GptOptions::kInputCond});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Not", 1}, {"Transpose", 3}}));
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  const ir::Node& negation = g.node(g.value(att.inputs[3]).producer);
  EXPECT_EQ(negation.op, OpKind::kNot);
  EXPECT_EQ(negation.inputs[0], m.cond);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "bool");
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
}

TEST(AttentionFusionTest, WhereKeepConditionIsUsedAsIs) {
  GraphBuilder b;
  GptGraph m = BuildGpt(b, {.cond = GptOptions::kKeepCond});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_EQ(att.inputs[3], m.cond);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "bool");
}

// GPT-Neo's local layers: a banded masked_fill and the padding mask. The band joins the padding as a
// constant additive mask (0 inside, finfo.min outside), the two summed into the one mask input.
TEST(AttentionFusionTest, WindowConditionBesideAPaddingMaskBecomesAnAdditiveMask) {
  GraphBuilder b;
  GptGraph m = BuildGpt(b, {.cond = GptOptions::kWindowConst, .padding_mask = true});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Add", 1}, {"Transpose", 3}}));
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
  const ir::Node& sum = g.node(g.value(att.inputs[3]).producer);
  ASSERT_EQ(sum.op, OpKind::kAdd);
  EXPECT_EQ(sum.inputs[0], m.padding);
  const ir::Value& band = g.value(sum.inputs[1]);
  ASSERT_TRUE(band.constant.has_value());
  ASSERT_EQ(band.constant->dims(), (std::vector<int64_t>{1, 1, kS, kS}));
  for (int64_t i = 0; i < kS; ++i) {
    for (int64_t j = 0; j < kS; ++j) {
      const double want = j <= i && j >= i - 2 ? 0.0 : static_cast<double>(-3.4028234663852886e38f);
      EXPECT_EQ(band.constant->GetAsDouble(i * kS + j), want) << i << "," << j;
    }
  }
}

// A condition that is an input joins the padding mask through Where(condition, fill, 0).
TEST(AttentionFusionTest, InputConditionBesideAPaddingMaskBecomesAWhere) {
  GraphBuilder b;
  BuildGpt(b, {.cond = GptOptions::kInputCond, .padding_mask = true});  // fill -inf
  absl::StatusOr<bool> r = RunAttention(b.graph());
  ASSERT_TRUE(r.ok() && *r) << r.status();
  const ir::Node& att = OnlyAttention(b.graph());
  const ir::Node& sum = b.graph().node(b.graph().value(att.inputs[3]).producer);
  ASSERT_EQ(sum.op, OpKind::kAdd);
  EXPECT_EQ(b.graph().node(b.graph().value(sum.inputs[1]).producer).op, OpKind::kWhere);
}

// BLOOM: Q K^T and P V on merged heads, softmax and padding mask on split heads. The fused op runs
// on split heads: Q, K, V and the ALiBi bias are reshaped to (B, H, ., .), O back to (B*H, S, Dh).
TEST(AttentionFusionTest, RegroupedHeadsRunSplitWithTheFlatBiasReshaped) {
  GraphBuilder b;
  BloomGraph m = BuildBloom(b);
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Add", 1}, {"Reshape", 5}, {"Transpose", 1}}));
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("scale", 0), 0.5);
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
  const std::vector<int64_t> split = {2, 2, kS, 4};
  for (int i = 0; i < 3; ++i) {
    const ir::Node& reshape = g.node(g.value(att.inputs[i]).producer);
    EXPECT_EQ(reshape.op, OpKind::kReshape) << i;
    EXPECT_EQ(ir::ToInts(g.value(att.inputs[i]).shape), split) << i;
  }
  EXPECT_EQ(g.node(g.value(att.inputs[0]).producer).inputs[0], m.q);
  EXPECT_EQ(g.node(g.value(att.inputs[2]).producer).inputs[0], m.v);
  const ir::Node& sum = g.node(g.value(att.inputs[3]).producer);
  ASSERT_EQ(sum.op, OpKind::kAdd);
  EXPECT_EQ(sum.inputs[0], m.mask);
  const ir::Node& bias = g.node(g.value(sum.inputs[1]).producer);
  EXPECT_EQ(bias.op, OpKind::kReshape);
  EXPECT_EQ(bias.inputs[0], m.alibi);
  EXPECT_EQ(ir::ToInts(g.value(sum.inputs[1]).shape), (std::vector<int64_t>{2, 2, 1, kS}));
  const ir::Node& merge = g.node(g.value(m.out).producer);
  EXPECT_EQ(merge.op, OpKind::kReshape);
  EXPECT_EQ(merge.inputs[0], att.outputs[0]);
}

// DeBERTa: the disentangled bias added on merged heads and a masked_fill on split heads. Both end in
// the mask input: the reshaped bias plus Where(mask, finfo.min, 0) (neither may be dropped).
TEST(AttentionFusionTest, RegroupedHeadsWithAMaskedFillKeepTheFlatBias) {
  GraphBuilder b;
  BloomGraph m = BuildBloom(b, /*masked_fill=*/true);
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
  const ir::Node& sum = g.node(g.value(att.inputs[3]).producer);
  ASSERT_EQ(sum.op, OpKind::kAdd);
  const ir::Node& bias = g.node(g.value(sum.inputs[0]).producer);
  EXPECT_EQ(bias.op, OpKind::kReshape);
  EXPECT_EQ(bias.inputs[0], m.alibi);
  const ir::Node& fill = g.node(g.value(sum.inputs[1]).producer);
  EXPECT_EQ(fill.op, OpKind::kWhere);
  EXPECT_EQ(fill.inputs[0], m.mask);
}

// The regrouped form needs concrete dims for its Reshapes: with a symbolic batch it stays unfused.
TEST(AttentionFusionTest, RegroupedHeadsWithSymbolicDimsAreNotFused) {
  GraphBuilder b;
  BloomGraph m = BuildBloom(b);
  ir::Graph& g = b.graph();
  g.value(m.q).shape[0] = Dim::Symbol("B") * Dim(2);
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(*r);
  EXPECT_TRUE(testing::NodesOf(g, OpKind::kAttention).empty());
}

TEST(AttentionFusionTest, ScoresWithAnotherConsumerAreNotFused) {
  GraphBuilder b;
  BuildGpt(b, {.extra_scores_use = true});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(*r);
  EXPECT_EQ(Histogram(g)["Attention"], 0);
}

// BERT-style: heads already (B, H, S, Dh); K^T = Transpose(K, [0,1,3,2]) so K is used directly;
// scores / sqrt(Dh) + extended mask from an input; both Q and K pre-scaled by Dh^-1/4 here.
TEST(AttentionFusionTest, BertStyleWithPreScaledQAndK) {
  const Dim B = Dim(2), H = Dim(2), S = Dim(kS), Dh = Dim(16);
  GraphBuilder b;
  ValueId q = b.Input("q", {B, H, S, Dh});
  ValueId k = b.Input("k", {B, H, S, Dh});
  ValueId v = b.Input("v", {B, H, S, Dh});
  ValueId ext = b.Input("ext_mask", {B, Dim(1), Dim(1), S});
  ValueId qs = b.Op(OpKind::kMul, {q, b.Scalar(0.5f)}, {B, H, S, Dh});
  ValueId ks = b.Op(OpKind::kMul, {b.Scalar(0.5f), k}, {B, H, S, Dh});
  ValueId kt = b.Op(OpKind::kTranspose, {ks}, {B, H, Dh, S}, Perm({0, 1, 3, 2}));
  ValueId s = b.Op(OpKind::kMatMul, {qs, kt}, {B, H, S, S});
  s = b.Op(OpKind::kDiv, {s, b.Scalar(2.0f)}, {B, H, S, S});
  s = b.Op(OpKind::kAdd, {ext, s}, {B, H, S, S});
  ValueId p = b.Op(OpKind::kSoftmax, {s}, {B, H, S, S});
  b.Output(b.Op(OpKind::kMatMul, {p, v}, {B, H, S, Dh}));
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}}));
  const ir::Node& att = OnlyAttention(g);
  EXPECT_EQ(att.inputs, (std::vector<ValueId>{q, k, v, ext}));
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("scale", 0), 0.5 * 0.5 / 2.0);
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
}

TEST(AttentionFusionTest, PreScaleWithOtherUsesIsKept) {
  const Dim S = Dim(kS), Dh = Dim(4);
  GraphBuilder b;
  ValueId q = b.Input("q", {S, Dh});
  ValueId k = b.Input("k", {S, Dh});
  ValueId v = b.Input("v", {S, Dh});
  ValueId qs = b.Op(OpKind::kMul, {q, b.Scalar(0.5f)}, {S, Dh});
  b.Output(qs);  // another use: stays, and Attention reads it unscaled
  ValueId kt = b.Op(OpKind::kTranspose, {k}, {Dh, S}, Perm({1, 0}));
  ValueId p = b.Op(OpKind::kSoftmax, {b.Op(OpKind::kMatMul, {qs, kt}, {S, S})}, {S, S});
  b.Output(b.Op(OpKind::kMatMul, {p, v}, {S, Dh}));
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Mul", 1}}));
  const ir::Node& att = OnlyAttention(g);
  EXPECT_EQ(att.inputs, (std::vector<ValueId>{qs, k, v}));
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("scale", 0), 1.0);
}

TEST(AttentionFusionTest, KeyWithoutTransposeGetsOne) {
  const Dim S = Dim(kS), Dh = Dim(4);
  GraphBuilder b;
  ValueId q = b.Input("q", {Dim(3), S, Dh});
  ValueId kt = b.Input("k_t", {Dim(3), Dh, S});
  ValueId v = b.Input("v", {Dim(3), S, Dh});
  ValueId p = b.Op(OpKind::kSoftmax, {b.Op(OpKind::kMatMul, {q, kt}, {Dim(3), S, S})}, {Dim(3), S, S});
  b.Output(b.Op(OpKind::kMatMul, {p, v}, {Dim(3), S, Dh}));
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  ExpectKIsTransposedFrom(g, att.inputs[1], kt, {0, 2, 1});
}

TEST(AttentionFusionTest, NonTriangularConstantMaskIsKept) {
  GraphBuilder b;
  const Dim S = Dim(kS), Dh = Dim(4);
  ValueId q = b.Input("q", {S, Dh});
  ValueId k = b.Input("k", {S, Dh});
  ValueId v = b.Input("v", {S, Dh});
  Tensor band = AdditiveCausal({kS, kS}, -1e9f);
  band.mutable_data<float>()[kS * 2 + 0] = -1e9f;  // also hides key 0 from query 2
  ValueId mask = b.Const("band", band);
  ValueId kt = b.Op(OpKind::kTranspose, {k}, {Dh, S}, Perm({1, 0}));
  ValueId s = b.Op(OpKind::kAdd, {b.Op(OpKind::kMatMul, {q, kt}, {S, S}), mask}, {S, S});
  b.Output(b.Op(OpKind::kMatMul, {b.Op(OpKind::kSoftmax, {s}, {S, S}), v}, {S, Dh}));
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status();
  const ir::Node& att = OnlyAttention(g);
  ASSERT_EQ(att.inputs.size(), 4u);
  EXPECT_EQ(att.inputs[3], mask);
  EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
}

// T5's relative position bias is a Gather of a learned table added to the scores: it becomes the
// Attention's additive mask, which AttentionGrad's dMask trains (a constant table the same way).
TEST(AttentionFusionTest, LearnedAdditiveBiasIsTheMask) {
  for (bool learned : {true, false}) {
    GraphBuilder b;
    const Dim S = Dim(kS), Dh = Dim(4);
    ValueId q = b.Input("q", {S, Dh});
    ValueId k = b.Input("k", {S, Dh});
    ValueId v = b.Input("v", {S, Dh});
    ValueId buckets = b.Input("buckets", {S, S}, DType::kI64);
    ValueId table = learned ? b.Param("relative_attention_bias.weight", {8})
                            : b.Const("table", Tensor(DType::kF32, {8}));
    ValueId bias = b.Op(OpKind::kGather, {table, buckets}, {S, S});
    ValueId kt = b.Op(OpKind::kTranspose, {k}, {Dh, S}, Perm({1, 0}));
    ValueId s = b.Op(OpKind::kAdd, {b.Op(OpKind::kMatMul, {q, kt}, {S, S}), bias}, {S, S});
    b.Output(b.Op(OpKind::kMatMul, {b.Op(OpKind::kSoftmax, {s}, {S, S}), v}, {S, Dh}));
    ir::Graph& g = b.graph();
    absl::StatusOr<bool> r = RunAttention(g);
    ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
    const ir::Node& att = OnlyAttention(g);
    EXPECT_EQ(att.inputs, (std::vector<ValueId>{q, k, v, bias}));
    EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
    EXPECT_EQ(att.attrs.Get<int64_t>("causal", -1), 0);
  }
}

// torch's dynamo exporter: frozen rank-0 scale on Q and on K^T spelled through a flattening, GQA's
// expanded K/V, a Where mask of frozen initializers and the NaN guard -> one Attention reading K
// itself (no transpose left) with scale (sqrt scale)^2.
TEST(AttentionFusionTest, DynamoSdpaWithFlattenedKTransposeAndGqa) {
  GraphBuilder b;
  const DynamoSdpaGraph built = BuildDynamoSdpa(b);
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  EXPECT_EQ(att.inputs, (std::vector<ValueId>{built.q, built.k_heads, built.v_heads, built.mask}));
  EXPECT_DOUBLE_EQ(att.attrs.Get<double>("scale", 0),
                   static_cast<double>(built.sqrt_scale) * static_cast<double>(built.sqrt_scale));
  EXPECT_EQ(att.attrs.Get<std::string>("mask_kind"), "additive");
  // Left: GQA's repeat of K and V (Unsqueeze, Expand, Reshape each) and the mask's Where.
  EXPECT_EQ(Histogram(g), (Hist{{"Attention", 1}, {"Unsqueeze", 2}, {"Expand", 2}, {"Reshape", 2}, {"Where", 1}}));
}

// The same export with the scale initializer still a parameter: it cannot become an attribute, so
// Q stays scaled in the graph and K^T is transposed back explicitly.
TEST(AttentionFusionTest, DynamoSdpaWithATrainableScaleKeepsTheScalings) {
  GraphBuilder b;
  const DynamoSdpaGraph built = BuildDynamoSdpa(b, /*trainable_scale=*/true);
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> r = RunAttention(g);
  ASSERT_TRUE(r.ok() && *r) << r.status() << testing::HistogramString(g);
  const ir::Node& att = OnlyAttention(g);
  EXPECT_EQ(att.attrs.Get<double>("scale", 0), 1.0);
  EXPECT_NE(att.inputs[0], built.q);
  EXPECT_EQ(g.node(g.value(att.inputs[0]).producer).op, OpKind::kMul);
  EXPECT_EQ(g.node(g.value(att.inputs[1]).producer).op, OpKind::kTranspose);
}

}  // namespace
}  // namespace onnxpipe::passes
