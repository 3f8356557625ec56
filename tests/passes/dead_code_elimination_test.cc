#include "frontend/passes/dead_code_elimination.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::Histogram;

TEST(DeadCodeEliminationTest, RemovesNodesThatReachNoOutput) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4)});
  ValueId w = b.Param("w", {4});
  ValueId used = b.Op(OpKind::kMul, {x, w}, {Dim(4)});
  ValueId dead1 = b.Op(OpKind::kExp, {used}, {Dim(4)});      // consumer of a live value
  ValueId dead2 = b.Op(OpKind::kDropout, {dead1}, {Dim(4)});  // chain of dead nodes
  (void)dead2;
  ValueId unused_param = b.Param("unused", {4});
  b.Op(OpKind::kNeg, {unused_param}, {Dim(4)});
  b.Output(b.Op(OpKind::kRelu, {used}, {Dim(4)}));
  ir::Graph& g = b.graph();
  const int32_t values_before = g.num_values();
  DeadCodeElimination dce;
  absl::StatusOr<bool> changed = dce.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(*changed);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Mul", 1}, {"Relu", 1}}));
  EXPECT_EQ(g.num_values(), values_before);  // values are never deleted
  EXPECT_TRUE(g.value(unused_param).constant.has_value());
  EXPECT_TRUE(ir::Verify(g).ok());
  // A second run finds nothing more.
  changed = dce.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

TEST(DeadCodeEliminationTest, KeepsMultiOutputNodeWhenOneOutputIsLive) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4)});
  ir::Graph& g = b.graph();
  ValueId out = g.AddValue("drop_out", ir::DType::kF32, {Dim(4)});
  ValueId mask = g.AddValue("drop_mask", ir::DType::kBool, {Dim(4)});
  g.AddNode(OpKind::kDropout, "/l/Dropout", {x}, {out, mask});
  g.outputs().push_back(mask);
  DeadCodeElimination dce;
  absl::StatusOr<bool> changed = dce.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(Histogram(g)["Dropout"], 1);
}

}  // namespace
}  // namespace onnxpipe::passes
