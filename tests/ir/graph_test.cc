#include "frontend/ir/graph.h"

#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"

namespace onnxpipe::ir {
namespace {

TEST(DimTest, SymbolicProductsDivideExactly) {
  Dim b = Dim::Symbol("B"), s = Dim::Symbol("S");
  Dim bs = b * s * Dim(4);
  EXPECT_EQ(bs.ToString(), "4*B*S");
  ASSERT_TRUE(bs.DivExact(s * Dim(2)).has_value());
  EXPECT_EQ(*bs.DivExact(s * Dim(2)), b * Dim(2));
  EXPECT_FALSE(bs.DivExact(Dim(3)).has_value());
  EXPECT_FALSE(b.DivExact(s).has_value());
  EXPECT_EQ(bs.Bind({{"B", 3}, {"S", 5}}), Dim(60));
}

TEST(GraphTest, TopoSortReordersAndDetectsCycles) {
  Graph g;
  ValueId x = g.AddValue("x", DType::kF32, {Dim(2)});
  g.inputs().push_back(x);
  ValueId a = g.AddValue("a", DType::kF32, {Dim(2)});
  ValueId b = g.AddValue("b", DType::kF32, {Dim(2)});
  g.AddNode(OpKind::kNeg, "/l/second", {a}, {b});
  g.AddNode(OpKind::kNeg, "/l/first", {x}, {a});
  g.outputs().push_back(b);
  EXPECT_FALSE(Verify(g).ok());  // uses 'a' before it is defined
  ASSERT_TRUE(g.TopoSort().ok());
  EXPECT_EQ(g.node(0).name, "/l/first");
  EXPECT_EQ(g.node(0).scope, "/l");
  EXPECT_TRUE(Verify(g).ok());

  Graph c;
  ValueId p = c.AddValue("p", DType::kF32, {});
  ValueId q = c.AddValue("q", DType::kF32, {});
  c.AddNode(OpKind::kNeg, "n1", {p}, {q});
  c.AddNode(OpKind::kNeg, "n2", {q}, {p});
  absl::Status st = c.TopoSort();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cycle"), std::string::npos);
}

TEST(TensorTest, CastsAndHalfConversionsRoundTrip) {
  Tensor t = Tensor::FromVector<float>({3}, {1.5f, -2.25f, 65504.f});
  Tensor h = t.CastTo(DType::kF16);
  EXPECT_EQ(h.CastTo(DType::kF32).data<float>()[1], -2.25f);
  EXPECT_EQ(F16ToFloat(FloatToF16(65504.f)), 65504.f);
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 1.0f / 256)), 1.0f);  // ties to even
  Tensor i = t.CastTo(DType::kI64);
  EXPECT_EQ(i.data<int64_t>()[1], -2);
}

}  // namespace
}  // namespace onnxpipe::ir
