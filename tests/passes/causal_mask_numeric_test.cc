// The forward pipeline reads a causal mask that an export computes from the shapes (as torch.export writes a Hugging
// Face decoder's: Range, LessOrEqual, Expand to (B, 1, S, S)) as causal, also when the mask has more elements than
// constant folding takes (1M): the fused Attention is causal with no mask input, and computes what the graph did.

#include <limits>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/passes/attention_fusion.h"
#include "frontend/passes/pipeline.h"
#include "gtest/gtest.h"
#include "tests/passes/fusion_numeric_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

// Attention over q, k, v (B, 1, S, 4), the scores kept where Where's condition, key <= query, holds (Expand-ed to
// (B, 1, S, S)); `strict`: key < query instead, which is not causal (a row attends to no key on the diagonal).
ir::Graph MaskedAttention(int64_t batch, int64_t seq, bool strict) {
  GraphBuilder b;
  const ir::Shape heads = {Dim(batch), Dim(1), Dim(seq), Dim(4)};
  const ValueId q = b.Input("q", heads), k = b.Input("k", heads), v = b.Input("v", heads);
  constexpr ir::DType i64 = ir::DType::kI64, boolean = ir::DType::kBool;
  const ValueId shape = b.Op(OpKind::kShape, {q}, {Dim(4)}, {}, i64);
  const ValueId s = b.Op(OpKind::kGather, {shape, b.Const("two", ir::Tensor::Scalar<int64_t>(2))}, {},
                         MakeAttrs({{"axis", int64_t{0}}}), i64);
  const ValueId r = b.Op(OpKind::kRange,
                         {b.Const("zero", ir::Tensor::Scalar<int64_t>(0)), s, b.Const("one", ir::Tensor::Scalar<int64_t>(1))},
                         {Dim(seq)}, {}, i64);
  const ValueId query =
      b.Op(OpKind::kUnsqueeze, {r}, {Dim(seq), Dim(1)}, MakeAttrs({{"axes", std::vector<int64_t>{1}}}), i64);
  const ValueId key =
      b.Op(OpKind::kUnsqueeze, {r}, {Dim(1), Dim(seq)}, MakeAttrs({{"axes", std::vector<int64_t>{0}}}), i64);
  const ValueId keep =
      b.Op(strict ? OpKind::kLess : OpKind::kLessOrEqual, {key, query}, {Dim(seq), Dim(seq)}, {}, boolean);
  const ir::Shape scores = {Dim(batch), Dim(1), Dim(seq), Dim(seq)};
  const ValueId wide = b.Op(OpKind::kExpand, {keep, b.IntVec({batch, 1, seq, seq})}, scores, {}, boolean);
  const ValueId kt = b.Op(OpKind::kTranspose, {k}, {Dim(batch), Dim(1), Dim(4), Dim(seq)},
                          MakeAttrs({{"perm", std::vector<int64_t>{0, 1, 3, 2}}}));
  const ValueId raw = b.Op(OpKind::kMatMul, {q, kt}, scores);
  const ValueId scaled = b.Op(OpKind::kMul, {raw, b.Scalar(0.5f)}, scores);
  const ValueId masked =
      b.Op(OpKind::kWhere, {wide, scaled, b.Scalar(-std::numeric_limits<float>::infinity())}, scores);
  const ValueId p = b.Op(OpKind::kSoftmax, {masked}, scores, MakeAttrs({{"axis", int64_t{-1}}}));
  b.Output(b.Op(OpKind::kMatMul, {p, v}, heads));
  return b.graph();
}

std::vector<const ir::Node*> Fused(ir::Graph& g) {
  cpu::CpuEvaluator evaluator;
  const absl::Status st = RunForwardPipeline(&g, evaluator);
  EXPECT_TRUE(st.ok()) << st;
  return testing::NodesOf(g, OpKind::kAttention);
}

TEST(CausalMaskTest, AComputedMaskBeyondFoldingsLimitIsReadAsCausal) {
  // (2, 1, 768, 768): 1.18M elements, over constant folding's 1M.
  const ir::Graph g = MaskedAttention(2, 768, /*strict=*/false);
  ir::Graph fused = g;
  const std::vector<const ir::Node*> att = Fused(fused);
  ASSERT_EQ(att.size(), 1u) << testing::HistogramString(fused);
  EXPECT_EQ(att[0]->attrs.Get<int64_t>("causal", -1), 1);
  EXPECT_EQ(att[0]->inputs.size(), 3u);  // no mask input
  EXPECT_EQ(testing::Histogram(fused).count("Expand"), 0u) << testing::HistogramString(fused);
  testing::ExpectSameOutputs(g, fused, 1e-5);
}

TEST(CausalMaskTest, AComputedMaskThatIsNotCausalStaysTheMask) {
  const ir::Graph g = MaskedAttention(2, 40, /*strict=*/true);
  ir::Graph fused = g;
  const std::vector<const ir::Node*> att = Fused(fused);
  ASSERT_EQ(att.size(), 1u) << testing::HistogramString(fused);
  EXPECT_EQ(att[0]->attrs.Get<int64_t>("causal", -1), 0);
  EXPECT_EQ(att[0]->inputs.size(), 4u);
}

TEST(CausalMaskTest, AMaskOverTheProofsLimitStaysTheMask) {
  // Past kMaxProvenMaskElements the mask is not computed: the attention reads it, correct but slower.
  ir::Graph g = MaskedAttention(1, 64, /*strict=*/false);
  cpu::CpuEvaluator evaluator;
  absl::StatusOr<bool> changed = AttentionFusion(&evaluator, /*max_mask_elements=*/64 * 64 - 1).Run(&g);
  ASSERT_TRUE(changed.ok() && *changed) << changed.status();
  const std::vector<const ir::Node*> att = testing::NodesOf(g, OpKind::kAttention);
  ASSERT_EQ(att.size(), 1u);
  EXPECT_EQ(att[0]->attrs.Get<int64_t>("causal", -1), 0);
}

}  // namespace
}  // namespace onnxpipe::passes
