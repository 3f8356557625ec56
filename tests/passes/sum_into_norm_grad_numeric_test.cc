// SumIntoNormGrad: the gradient Sum in front of a LayerNormGrad or RMSNormGrad becomes the norm's
// dY2 input. On the gradients autodiff writes for a LayerNorm or RMSNorm read by one, two and three
// projections, the rewritten graph must compute the same loss and gradients bit for bit on the CPU
// backend (the kernel adds dY2 last, as the Sum's left-to-right order does); Sums it must not touch
// (another reader, a broadcast addend) stay.

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/sum_into_norm_grad.h"
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

const ir::Shape kShape = {Dim(4), Dim(6), Dim(8)};
const ir::Attrs kNormAttrs = MakeAttrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}});

// x -> LayerNorm or RMSNorm -> `readers` MatMuls, added -> sum of squares, differentiated.
ir::Graph Differentiated(bool rms, int readers) {
  GraphBuilder b;
  const ValueId x = b.Input("x", kShape);
  const ValueId n = rms ? b.Op(OpKind::kRMSNorm, {x, b.Param("gamma", {8})}, kShape, kNormAttrs)
                        : b.Op(OpKind::kLayerNorm, {x, b.Param("gamma", {8}), b.Param("beta", {8})}, kShape, kNormAttrs);
  ValueId y = ir::kNoValue;
  for (int k = 0; k < readers; ++k) {
    const ValueId p = b.Op(OpKind::kMatMul, {n, b.Param("w" + std::to_string(k), {8, 8})}, kShape);
    y = y == ir::kNoValue ? p : b.Op(OpKind::kAdd, {y, p}, kShape);
  }
  const ValueId sq = b.Op(OpKind::kMul, {y, y}, kShape);
  b.Output(b.Op(OpKind::kReduceSum, {sq}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  ir::Graph g = b.graph();
  EXPECT_TRUE(autodiff::BuildGradients(&g, g.outputs()[0], {}).ok());
  return g;
}

TEST(SumIntoNormGradTest, SameLossAndGradientsBitForBit) {
  for (const bool rms : {false, true})
  for (const int readers : {1, 2, 3}) {
    SCOPED_TRACE(std::string(rms ? "RMSNorm, " : "LayerNorm, ") + std::to_string(readers) + " readers");
    const OpKind grad_op = rms ? OpKind::kRMSNormGrad : OpKind::kLayerNormGrad;
    const int dy2 = ir::NormGradDy2Input(grad_op);
    const ir::Graph plain = Differentiated(rms, readers);
    ir::Graph fused = plain;
    absl::StatusOr<bool> changed = SumIntoNormGrad().Run(&fused);
    ASSERT_TRUE(changed.ok()) << changed.status();
    ASSERT_TRUE(ir::Verify(fused).ok()) << ir::Verify(fused);
    EXPECT_EQ(*changed, readers > 1);
    const std::vector<const ir::Node*> norms = testing::NodesOf(fused, grad_op);
    ASSERT_EQ(norms.size(), 1u);
    const bool has_dy2 = static_cast<int>(norms[0]->inputs.size()) > dy2 && norms[0]->inputs[dy2] != ir::kNoValue;
    EXPECT_EQ(has_dy2, readers > 1);
    // Two readers: the Sum is gone; three: a Sum of the first two is left.
    EXPECT_EQ(testing::NodesOf(fused, OpKind::kSum).size() + (readers == 2 ? 1 : 0),
              testing::NodesOf(plain, OpKind::kSum).size())
        << testing::HistogramString(fused);
    absl::StatusOr<double> diff = testing::MaxAbsDiffOnRandomFeeds(plain, fused, 7);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_EQ(*diff, 0.0);
    absl::StatusOr<bool> again = SumIntoNormGrad().Run(&fused);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(*again) << "a second run changes nothing";
  }
}

TEST(SumIntoNormGradTest, LeavesSumsWithAnotherReaderOrABroadcastAddend) {
  for (const bool broadcast : {false, true}) {
    GraphBuilder b;
    const ValueId x = b.Input("x", kShape), a = b.Input("a", kShape);
    const ValueId other = broadcast ? b.Input("row", {Dim(8)}) : b.Input("b", kShape);
    const ValueId sum = b.Op(OpKind::kSum, {a, other}, kShape);
    b.Output(b.Op(OpKind::kLayerNormGrad, {sum, x, b.Param("gamma", {8})}, kShape, kNormAttrs));
    if (!broadcast) b.Output(sum);  // read twice
    ir::Graph& g = b.graph();
    absl::StatusOr<bool> changed = SumIntoNormGrad().Run(&g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_FALSE(*changed) << (broadcast ? "broadcast addend" : "Sum read twice");
    EXPECT_EQ(testing::NodesOf(g, OpKind::kSum).size(), 1u);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
