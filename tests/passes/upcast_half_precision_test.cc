#include "frontend/passes/upcast_half_precision.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::Tensor;
using ir::ValueId;
using testing::GraphBuilder;
using testing::Histogram;
using testing::MakeAttrs;

// y = Cast(x, half) * w, all in `half`, and z = Cast(y, half) a second output: internal values and
// constants widen exactly, Cast-to-half casts to f32, the half input stays half behind a new
// Cast, the explicitly cast output z stays half, and y (half only because the model computes in
// half) comes out in f32.
TEST(UpcastHalfPrecisionTest, WidensInsideAndKeepsTheInterface) {
  for (DType half : {DType::kF16, DType::kBF16}) {
    GraphBuilder b;
    ir::Graph& g = b.graph();
    ValueId x = b.Input("x", {Dim(3)}, half);
    // 0.1 is not representable in either half type: the widened constant must be the rounded value.
    const Tensor w16 = Tensor::FromVector<float>({3}, {0.1f, -2.5f, 3.0f}).CastTo(half);
    ValueId w = g.AddConstant("w", w16, /*is_initializer=*/true);
    const std::string half_name(ir::DTypeName(half));
    ValueId xh = b.Op(OpKind::kCast, {x}, {Dim(3)}, MakeAttrs({{"to", half_name}}), half);
    ValueId y = b.Op(OpKind::kMul, {xh, w}, {Dim(3)}, {}, half);
    ValueId z = b.Op(OpKind::kCast, {y}, {Dim(3)}, MakeAttrs({{"to", half_name}}), half);
    b.Output(y);
    b.Output(z);
    UpcastHalfPrecision pass;
    absl::StatusOr<bool> changed = pass.Run(&g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(*changed);
    EXPECT_EQ(g.value(x).dtype, half);
    EXPECT_EQ(g.value(y).dtype, DType::kF32);
    EXPECT_EQ(g.value(z).dtype, half);
    EXPECT_EQ(g.value(w).dtype, DType::kF32);
    EXPECT_EQ(g.value(xh).dtype, DType::kF32);
    EXPECT_EQ(g.node(g.value(xh).producer).attrs.Get<std::string>("to"), "f32");
    EXPECT_EQ(g.node(g.value(y).producer).op, OpKind::kMul);
    EXPECT_EQ(g.node(g.value(z).producer).op, OpKind::kCast);
    EXPECT_EQ(g.node(g.value(z).producer).attrs.Get<std::string>("to"), half_name);
    // Cast(x) added, Cast(x, half) now to f32, Cast(y, half) to f32 feeding the new Cast to half.
    EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Cast", 4}, {"Mul", 1}}));
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(g.value(w).constant->GetAsDouble(i), w16.GetAsDouble(i));
    EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
    changed = pass.Run(&g);
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(*changed);  // the interface Casts it added are not half-precision compute
  }
}

TEST(UpcastHalfPrecisionTest, FloatGraphIsUntouched) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(3)});
  b.Output(b.Op(OpKind::kMul, {x, b.Param("w", {3})}, {Dim(3)}));
  UpcastHalfPrecision pass;
  absl::StatusOr<bool> changed = pass.Run(&b.graph());
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
}

}  // namespace
}  // namespace onnxpipe::passes
