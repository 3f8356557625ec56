// Numerical equivalence of every fusion: the graph before and after the pass, evaluated on the
// CPU backend with the same random inputs, must agree to float rounding. The fused kernels
// (Linear, LayerNorm, RMSNorm, Gelu, Attention) are independent of the primitive ops they replace, so a
// wrong attribute (scale, epsilon, causal, mask polarity, K layout) shows up as a mismatch.

#include <functional>

#include "frontend/ir/verifier.h"
#include "frontend/passes/attention_fusion.h"
#include "frontend/passes/gelu_fusion.h"
#include "frontend/passes/layer_norm_fusion.h"
#include "frontend/passes/linear_fusion.h"
#include "frontend/passes/rms_norm_fusion.h"
#include "gtest/gtest.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_patterns.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using namespace testing::patterns;  // NOLINT: the shared pattern builders
using testing::GraphBuilder;
using testing::MakeAttrs;

const std::map<std::string, int64_t> kDims = {{"B", 3}, {"S", 7}};

// Runs `pass` on a copy of g, checks that it fused (`fused_op` appears), and compares outputs.
void ExpectEquivalent(const ir::Graph& g, Pass& pass, ir::OpKind fused_op,
                      const std::function<void(std::vector<ir::Tensor>&)>& adjust_feeds = nullptr,
                      double tol = 2e-5) {
  ir::Graph fused = g;
  absl::StatusOr<bool> changed = pass.Run(&fused);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_TRUE(*changed) << testing::HistogramString(fused);
  ASSERT_TRUE(ir::Verify(fused).ok()) << ir::Verify(fused);
  ASSERT_FALSE(testing::NodesOf(fused, fused_op).empty()) << testing::HistogramString(fused);
  for (uint32_t seed : {1u, 2u}) {
    absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(g, kDims, seed);
    ASSERT_TRUE(feeds.ok()) << feeds.status();
    if (adjust_feeds) adjust_feeds(*feeds);
    absl::StatusOr<std::vector<ir::Tensor>> before = testing::Evaluate(g, *feeds);
    ASSERT_TRUE(before.ok()) << before.status();
    absl::StatusOr<std::vector<ir::Tensor>> after = testing::Evaluate(fused, *feeds);
    ASSERT_TRUE(after.ok()) << after.status();
    absl::StatusOr<double> diff = testing::MaxAbsDiff(*before, *after);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, tol) << "seed " << seed;
  }
}

TEST(FusionNumericTest, Linear) {
  for (int variant = 0; variant < 3; ++variant) {
    GraphBuilder b;
    const Dim B = Dim::Symbol("B"), S = Dim::Symbol("S");
    ValueId x = b.Input("x", {B, S, Dim(16)});
    ValueId y;
    if (variant == 0) {  // MatMul(X, W) + b
      ValueId mm = b.Op(OpKind::kMatMul, {x, b.Param("w", {16, 24})}, {B, S, Dim(24)});
      y = b.Op(OpKind::kAdd, {mm, b.Param("b", {24})}, {B, S, Dim(24)});
    } else if (variant == 1) {  // b + MatMul(X, W^T)
      ValueId wt = b.Op(OpKind::kTranspose, {b.Param("w", {24, 16})}, {Dim(16), Dim(24)}, Perm({1, 0}));
      y = b.Op(OpKind::kAdd, {b.Param("b", {24}), b.Op(OpKind::kMatMul, {x, wt}, {B, S, Dim(24)})}, {B, S, Dim(24)});
    } else {  // Gemm on the flattened activations
      ValueId flat = b.Op(OpKind::kReshape, {x, b.IntVec({-1, 16})}, {B * S, Dim(16)});
      y = b.Op(OpKind::kGemm, {flat, b.Param("w", {24, 16}), b.Param("b", {24})}, {B * S, Dim(24)},
               MakeAttrs({{"alpha", 1.0}, {"beta", 1.0}, {"transB", int64_t{1}}}));
    }
    b.Output(y);
    LinearFusion pass;
    SCOPED_TRACE(variant);
    ExpectEquivalent(b.graph(), pass, OpKind::kLinear);
  }
}

TEST(FusionNumericTest, LayerNorm) {
  for (const LayerNormVariant& v : {LayerNormVariant{}, LayerNormVariant{.axis = 2, .swap_operands = true, .casts = true},
                                    LayerNormVariant{.square_as_mul = true, .reciprocal = true, .bias = false}}) {
    GraphBuilder b;
    BuildDecomposedLayerNorm(b, v);
    LayerNormFusion pass;
    ExpectEquivalent(b.graph(), pass, OpKind::kLayerNorm);
  }
}

TEST(FusionNumericTest, RMSNorm) {
  for (const RMSNormVariant& v :
       {RMSNormVariant{}, RMSNormVariant{.rsqrt = RMSNormVariant::kPowMinusHalf, .casts = true},
        RMSNormVariant{.rsqrt = RMSNormVariant::kDivBySqrt, .square_as_mul = true, .two_axes = true}}) {
    GraphBuilder b;
    BuildDecomposedRMSNorm(b, v);
    RMSNormFusion pass;
    ExpectEquivalent(b.graph(), pass, OpKind::kRMSNorm);
  }
}

TEST(FusionNumericTest, DynamoSdpaAttention) {
  GraphBuilder b;
  BuildDynamoSdpa(b);
  AttentionFusion pass;
  ExpectEquivalent(b.graph(), pass, OpKind::kAttention);
}

TEST(FusionNumericTest, Gelu) {
  for (GeluForm form : {GeluForm::kErfExporter, GeluForm::kErfHalfFirst, GeluForm::kErfMulRsqrt2,
                        GeluForm::kTanhExporter, GeluForm::kTanhPow}) {
    GraphBuilder b;
    BuildGelu(b, {.form = form, .x_from_add = true});
    GeluFusion pass;
    SCOPED_TRACE(static_cast<int>(form));
    ExpectEquivalent(b.graph(), pass, OpKind::kGelu);
  }
}

TEST(FusionNumericTest, MultiheadAttention) {
  for (auto mask : {MhaOptions::kNone, MhaOptions::kCausalConst, MhaOptions::kInputMask}) {
    GraphBuilder b;
    BuildMha(b, {.mask = mask});
    AttentionFusion pass;
    SCOPED_TRACE(static_cast<int>(mask));
    ExpectEquivalent(b.graph(), pass, OpKind::kAttention);
  }
}

// The GPT attention of `options` fused equals it evaluated as written. A masked_fill condition fed as
// an input marks masked keys: it is kept mostly false so that no row is fully masked (there the
// unfused softmax gives NaN and the fused kernel zeros).
void ExpectGptFusesEquivalently(const GptOptions& options) {
  GraphBuilder b;
  GptGraph m = BuildGpt(b, options);
  const ir::Graph& g = b.graph();
  size_t cond_index = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    if (g.inputs()[i] == m.cond) cond_index = i;
  auto adjust = [&](std::vector<ir::Tensor>& feeds) {
    if (options.cond != GptOptions::kInputCond) return;
    ir::Tensor& t = feeds[cond_index];
    for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<bool>()[i] = !t.data<bool>()[i];
  };
  AttentionFusion pass;
  SCOPED_TRACE(static_cast<int>(options.cond));
  ExpectEquivalent(g, pass, OpKind::kAttention, adjust);
}

TEST(FusionNumericTest, GptMaskedFill) {
  for (auto cond : {GptOptions::kCausalConst, GptOptions::kInputCond, GptOptions::kKeepCond})
    ExpectGptFusesEquivalently({.cond = cond});
}

// The banded condition turned into an additive mask and summed with the padding mask (GPT-Neo's
// local layers): the fused result equals Where-then-Add evaluated as written.
TEST(FusionNumericTest, GptWindowConditionWithPaddingMask) {
  for (auto cond : {GptOptions::kWindowConst, GptOptions::kInputCond})
    ExpectGptFusesEquivalently({.cond = cond, .padding_mask = true});
}

// BLOOM's regrouped heads with an ALiBi bias on the merged heads and a padding mask on the split ones.
TEST(FusionNumericTest, RegroupedHeadsWithAlibi) {
  GraphBuilder b;
  BuildBloom(b);
  AttentionFusion pass;
  ExpectEquivalent(b.graph(), pass, OpKind::kAttention);
}

// DeBERTa's form: the bias on merged heads and a masked_fill (true = masked) on split heads.
TEST(FusionNumericTest, RegroupedHeadsWithABiasAndAMaskedFill) {
  GraphBuilder b;
  BloomGraph m = BuildBloom(b, /*masked_fill=*/true);
  const ir::Graph& g = b.graph();
  size_t mask_index = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    if (g.inputs()[i] == m.mask) mask_index = i;
  auto adjust = [&](std::vector<ir::Tensor>& feeds) {  // mask the last key only: no row fully masked
    ir::Tensor& t = feeds[mask_index];
    for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<bool>()[i] = (i % kS) == kS - 1;
  };
  AttentionFusion pass;
  ExpectEquivalent(g, pass, OpKind::kAttention, adjust);
}

}  // namespace
}  // namespace onnxpipe::passes
