#include "frontend/passes/rotary_fusion.h"

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

void ExpectFused(const RotaryVariant& v) {
  GraphBuilder b;
  const RotaryGraph built = BuildRotary(b, v);
  ir::Graph& g = b.graph();
  RotaryFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(*r) << testing::HistogramString(g);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  // What is left: the Mul making x, and the Rotary.
  EXPECT_EQ(Histogram(g), (Hist{{"Mul", 1}, {"Rotary", 1}})) << testing::HistogramString(g);
  const ir::Node* rot = testing::NodesOf(g, OpKind::kRotary)[0];
  EXPECT_EQ(rot->inputs, (std::vector<ValueId>{built.x, built.cos, built.sin}));
  EXPECT_EQ(rot->outputs[0], built.y);
  EXPECT_EQ(rot->attrs.Get<int64_t>("rotary_dim", 0), v.rotary_dim);
  EXPECT_EQ(rot->attrs.Get<int64_t>("interleaved", -1), v.interleaved ? 1 : 0);
}

TEST(RotaryFusionTest, RotateHalf) { ExpectFused({}); }
TEST(RotaryFusionTest, RotateHalfOperandsSwapped) { ExpectFused({.swap_add = true, .swap_muls = true}); }
TEST(RotaryFusionTest, RotateHalfEndsAsWidth) { ExpectFused({.end_as_width = true}); }
TEST(RotaryFusionTest, PartialRotateHalf) { ExpectFused({.width = 16, .rotary_dim = 8}); }
TEST(RotaryFusionTest, Interleaved) { ExpectFused({.interleaved = true}); }
TEST(RotaryFusionTest, InterleavedPartialGptJLayout) {
  ExpectFused({.interleaved = true, .width = 12, .rotary_dim = 8, .gptj_layout = true, .swap_add = true});
}
TEST(RotaryFusionTest, InterleavedEndsAsWidth) { ExpectFused({.interleaved = true, .end_as_width = true}); }

void ExpectNotFused(const RotaryVariant& v) {
  GraphBuilder b;
  BuildRotary(b, v);
  testing::ExpectUnchangedBy<RotaryFusion>(b.graph());
}

TEST(RotaryFusionTest, OtherSignIsNotFused) {
  ExpectNotFused({.neg_first_half = true});
  ExpectNotFused({.interleaved = true, .neg_first_half = true});
}
TEST(RotaryFusionTest, WrongSliceIsNotFused) {
  ExpectNotFused({.same_half_twice = true});
  ExpectNotFused({.interleaved = true, .same_half_twice = true});
}
TEST(RotaryFusionTest, OtherAxisIsNotFused) { ExpectNotFused({.seq_axis = true}); }
TEST(RotaryFusionTest, TrainableTableIsNotFused) { ExpectNotFused({.table_parameter = true}); }
TEST(RotaryFusionTest, ProductOfAnotherValueIsNotFused) { ExpectNotFused({.other_x = true}); }

TEST(RotaryFusionTest, PassThroughFirstKeepsTheConcat) {
  // The rotation of the slice fuses, but Concat(rest, rotated) is not a partial rotary.
  GraphBuilder b;
  BuildRotary(b, {.width = 16, .rotary_dim = 8, .pass_first = true});
  ir::Graph& g = b.graph();
  RotaryFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  EXPECT_EQ(Histogram(g), (Hist{{"Mul", 1}, {"Rotary", 1}, {"Slice", 2}, {"Concat", 1}}))
      << testing::HistogramString(g);
  EXPECT_EQ(testing::NodesOf(g, OpKind::kRotary)[0]->attrs.Get<int64_t>("rotary_dim", 0), 8);
}

}  // namespace
}  // namespace onnxpipe::passes
