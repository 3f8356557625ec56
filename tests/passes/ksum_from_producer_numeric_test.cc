// KSumFromProducer: the bias gradient of a Linear after a Gelu moves from the weight-gradient GEMM's
// KSum output to GeluGrad's dXSums. On the gradients autodiff writes for Linear -> Gelu -> Linear
// (both Gelu forms, rank-2 and rank-3 activations, W stored either way), the rewritten graph must
// compute the same loss and gradients bit for bit on the CPU backend (both sum the stored dX in
// double in row order); a bias gradient whose dY does not come from a GeluGrad stays on its GEMM.

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/ksum_from_producer.h"
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

// x (lead..., 8) -> Linear(8 -> 16) -> Gelu -> Linear(16 -> 8) -> sum of squares, differentiated.
ir::Graph Differentiated(const ir::Shape& lead, bool tanh_form, bool trans_b) {
  GraphBuilder b;
  ir::Shape xs = lead, hs = lead;
  xs.push_back(Dim(8));
  hs.push_back(Dim(16));
  const ir::Attrs lin = MakeAttrs({{"trans_b", int64_t{trans_b ? 1 : 0}}});
  const ValueId x = b.Input("x", xs);
  const ValueId w1 = b.Param("w1", trans_b ? std::vector<int64_t>{16, 8} : std::vector<int64_t>{8, 16});
  const ValueId w2 = b.Param("w2", trans_b ? std::vector<int64_t>{8, 16} : std::vector<int64_t>{16, 8});
  const ValueId h = b.Op(OpKind::kLinear, {x, w1, b.Param("b1", {16})}, hs, lin);
  const ValueId a =
      b.Op(OpKind::kGelu, {h}, hs, MakeAttrs({{"approximate", std::string(tanh_form ? "tanh" : "none")}}));
  const ValueId y = b.Op(OpKind::kLinear, {a, w2, b.Param("b2", {8})}, xs, lin);
  const ValueId sq = b.Op(OpKind::kMul, {y, y}, xs);
  b.Output(b.Op(OpKind::kReduceSum, {sq}, {}, MakeAttrs({{"keepdims", int64_t{0}}})));
  ir::Graph g = b.graph();
  EXPECT_TRUE(autodiff::BuildGradients(&g, g.outputs()[0], {}).ok());
  return g;
}

// FusedMatMul nodes that still have a KSum output.
size_t GemmsWithKSum(const ir::Graph& g) {
  size_t n = 0;
  for (const ir::Node* m : testing::NodesOf(g, OpKind::kFusedMatMul))
    n += m->outputs.size() > 1 && m->outputs[1] != ir::kNoValue;
  return n;
}

TEST(KSumFromProducerTest, SameLossAndGradientsBitForBit) {
  for (const bool rank3 : {false, true})
    for (const bool tanh_form : {false, true})
      for (const bool trans_b : {false, true}) {
        SCOPED_TRACE(std::string(rank3 ? "rank 3" : "rank 2") + (tanh_form ? ", tanh" : ", erf") +
                     (trans_b ? ", W (N, K)" : ", W (K, N)"));
        const ir::Graph plain =
            Differentiated(rank3 ? ir::Shape{Dim(3), Dim(5)} : ir::Shape{Dim(15)}, tanh_form, trans_b);
        ASSERT_EQ(GemmsWithKSum(plain), 2u) << testing::HistogramString(plain);
        ir::Graph moved = plain;
        absl::StatusOr<bool> changed = KSumFromProducer().Run(&moved);
        ASSERT_TRUE(changed.ok()) << changed.status();
        ASSERT_TRUE(ir::Verify(moved).ok()) << ir::Verify(moved);
        EXPECT_TRUE(*changed);
        // b1's gradient now comes from GeluGrad; b2's (dY from the loss's Mul) stays on its GEMM.
        EXPECT_EQ(GemmsWithKSum(moved), 1u);
        const std::vector<const ir::Node*> gg = testing::NodesOf(moved, OpKind::kGeluGrad);
        ASSERT_EQ(gg.size(), 1u);
        ASSERT_EQ(gg[0]->outputs.size(), 2u);
        EXPECT_EQ(moved.value(gg[0]->outputs[1]).shape, ir::Shape{Dim(16)});
        absl::StatusOr<double> diff = testing::MaxAbsDiffOnRandomFeeds(plain, moved, 11);
        ASSERT_TRUE(diff.ok()) << diff.status();
        EXPECT_EQ(*diff, 0.0);
        absl::StatusOr<bool> again = KSumFromProducer().Run(&moved);
        ASSERT_TRUE(again.ok());
        EXPECT_FALSE(*again) << "a second run changes nothing";
      }
}

}  // namespace
}  // namespace onnxpipe::passes
