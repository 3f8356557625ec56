#include "frontend/passes/tie_transposed_initializers.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::OpKind;
using ir::Tensor;
using ir::ValueId;
using testing::GraphBuilder;
using testing::Histogram;

// An initializer holding a's transpose (what the dynamo exporter writes for a tied lm head).
ValueId TransposedCopy(GraphBuilder& b, ValueId a, const std::string& name) {
  const Tensor& t = *b.graph().value(a).constant;
  const int64_t r = t.dims()[0], c = t.dims()[1];
  Tensor out(ir::DType::kF32, {c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out.mutable_data<float>()[j * r + i] = t.data<float>()[i * c + j];
  return b.graph().AddConstant(name, out, /*is_initializer=*/true);
}

TEST(TieTransposedInitializersTest, TiesAnExactTransposeAndKeepsOneParameter) {
  GraphBuilder b;
  ValueId ids = b.Input("ids", {Dim(2)}, ir::DType::kI64);
  ValueId emb = b.Param("wte", {5, 3});
  ValueId head = TransposedCopy(b, emb, "val_196");
  ValueId h = b.Op(OpKind::kGather, {emb, ids}, {Dim(2), Dim(3)});
  b.Output(b.Op(OpKind::kMatMul, {h, head}, {Dim(2), Dim(5)}));
  ir::Graph& g = b.graph();
  TieTransposedInitializers pass;
  absl::StatusOr<bool> changed = pass.Run(&g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_EQ(pass.ties().size(), 1u);
  EXPECT_EQ(pass.ties()[0], "val_196 = wte^T");
  EXPECT_FALSE(g.value(head).is_initializer);
  EXPECT_TRUE(g.value(emb).is_initializer);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Gather", 1}, {"Transpose", 1}, {"MatMul", 1}}));
  for (ir::NodeId n : g.LiveNodes()) {
    if (g.node(n).op == OpKind::kTranspose) {
      EXPECT_EQ(g.node(n).inputs[0], emb);
    }
    if (g.node(n).op == OpKind::kMatMul) {
      EXPECT_NE(g.node(n).inputs[1], head);
    }
  }
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  changed = pass.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

TEST(TieTransposedInitializersTest, LeavesEqualOrConstantValuedOrDifferentMatricesAlone) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4), Dim(4)});
  ValueId w0 = b.Param("layer0.w", {4, 4});
  ir::Graph& g = b.graph();
  // An equal (not transposed) copy: deep-copied layers start like this and are independent.
  ValueId w1 = g.AddConstant("layer1.w", g.value(w0).constant->Clone(), /*is_initializer=*/true);
  // Two constant-valued matrices are transposes of each other, yet independent parameters.
  Tensor ones(ir::DType::kF32, {4, 4});
  for (int64_t i = 0; i < 16; ++i) ones.mutable_data<float>()[i] = 1.f;
  ValueId o0 = g.AddConstant("o0", ones, true);
  ValueId o1 = g.AddConstant("o1", ones.Clone(), true);
  ValueId other = b.Param("other", {4, 4});
  ValueId y = x;
  for (ValueId w : {w0, w1, o0, o1, other}) y = b.Op(OpKind::kMatMul, {y, w}, {Dim(4), Dim(4)});
  b.Output(y);
  TieTransposedInitializers pass;
  absl::StatusOr<bool> changed = pass.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_TRUE(pass.ties().empty());
}

}  // namespace
}  // namespace onnxpipe::passes
