#include "frontend/passes/cast_into_gemm.h"

#include "frontend/ir/infer.h"
#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::DType;
using ir::OpKind;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

// dW (4, 5) = X^T dY over operands of `dtype`, with the KSum output (dY's column sums) when `ksum`; each
// output goes through a Cast to f32 unless `cast` says otherwise. Returns the f32 values.
struct Gradients {
  ValueId dw = ir::kNoValue, db = ir::kNoValue, dw_bf16 = ir::kNoValue;
};
Gradients Build(GraphBuilder& b, DType dtype, bool ksum, bool cast_db, bool dw_read_twice) {
  ir::Graph& g = b.graph();
  ValueId x = b.Input("x", {6, 4}, dtype), dy = b.Input("dy", {6, 5}, dtype);
  Gradients r;
  r.dw_bf16 = g.AddValue("dw_c", dtype, {4, 5}, true);
  std::vector<ValueId> outs = {r.dw_bf16};
  if (ksum) outs.push_back(g.AddValue("db_c", dtype, {5}, true));
  g.AddNode(
      OpKind::kFusedMatMul, "dw", {x, dy}, outs,
      ksum ? MakeAttrs({{"trans_a", int64_t{1}}, {"k_sum", std::string("b")}}) : MakeAttrs({{"trans_a", int64_t{1}}}));
  const ir::Attrs to_f32 = MakeAttrs({{"to", std::string("f32")}});
  r.dw = b.Op(OpKind::kCast, {r.dw_bf16}, {4, 5}, to_f32, DType::kF32);
  b.Output(r.dw);
  if (dw_read_twice) b.Output(b.Op(OpKind::kNeg, {r.dw_bf16}, {4, 5}, {}, dtype));
  if (ksum) {
    r.db = cast_db ? b.Op(OpKind::kCast, {outs[1]}, {5}, to_f32, DType::kF32)
                   : b.Op(OpKind::kNeg, {outs[1]}, {5}, {}, dtype);
    b.Output(r.db);
  }
  return r;
}

absl::StatusOr<bool> RunPass(ir::Graph& g) {
  absl::StatusOr<bool> r = CastIntoGemm().Run(&g);
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  return r;
}

TEST(CastIntoGemmTest, Bf16GradientGemmWritesF32) {
  for (const bool ksum : {false, true}) {
    GraphBuilder b;
    const Gradients r = Build(b, DType::kBF16, ksum, /*cast_db=*/true, /*dw_read_twice=*/false);
    ir::Graph& g = b.graph();
    absl::StatusOr<bool> changed = RunPass(g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(*changed);
    EXPECT_TRUE(testing::NodesOf(g, OpKind::kCast).empty());
    const std::vector<const ir::Node*> mm = testing::NodesOf(g, OpKind::kFusedMatMul);
    ASSERT_EQ(mm.size(), 1u);
    EXPECT_EQ(mm[0]->attrs.Get<std::string>("to", ""), "f32");
    EXPECT_EQ(mm[0]->outputs[0], r.dw);
    if (ksum) {
      EXPECT_EQ(mm[0]->outputs[1], r.db);
    }
    // The shape rule agrees: f32 outputs from bf16 operands.
    ASSERT_TRUE(ir::InferShapes(g).ok()) << ir::InferShapes(g);
    EXPECT_EQ(g.value(r.dw).dtype, DType::kF32);
  }
}

TEST(CastIntoGemmTest, LeavesGemmsWhoseOutputsHaveOtherReadersOrAreF32) {
  struct Variant {
    const char* why;
    DType dtype;
    bool cast_db, dw_read_twice;
  };
  for (const Variant& v : {Variant{"f32 operands", DType::kF32, true, false},
                           Variant{"the KSum output read in bf16", DType::kBF16, false, false},
                           Variant{"the product read in bf16 too", DType::kBF16, true, true}}) {
    GraphBuilder b;
    Build(b, v.dtype, /*ksum=*/true, v.cast_db, v.dw_read_twice);
    ir::Graph& g = b.graph();
    absl::StatusOr<bool> changed = RunPass(g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_FALSE(*changed) << v.why;
    EXPECT_FALSE(testing::NodesOf(g, OpKind::kFusedMatMul)[0]->attrs.Has("to")) << v.why;
  }
}

}  // namespace
}  // namespace onnxpipe::passes
