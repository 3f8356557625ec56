#include "frontend/passes/linear_fusion.h"

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
using testing::MakeAttrs;
using Hist = std::map<std::string, int>;

const Dim kB = Dim::Symbol("B"), kS = Dim::Symbol("S");

bool RunLinear(ir::Graph& g) {
  LinearFusion pass;
  absl::StatusOr<bool> r = pass.Run(&g);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  return r.ok() && *r;
}

TEST(LinearFusionTest, MatMulWithBiasOnEitherSide) {
  for (bool bias_first : {false, true}) {
    GraphBuilder b;
    ValueId x = b.Input("x", {kB, kS, Dim(16)});
    ValueId w = b.Param("w", {16, 32});
    ValueId bias = b.Param("b", {32});
    ValueId mm = b.Op(OpKind::kMatMul, {x, w}, {kB, kS, Dim(32)});
    ValueId y = b.Op(OpKind::kAdd, bias_first ? std::vector<ValueId>{bias, mm} : std::vector<ValueId>{mm, bias},
                     {kB, kS, Dim(32)});
    b.Output(y);
    ir::Graph& g = b.graph();
    ASSERT_TRUE(RunLinear(g));
    EXPECT_EQ(Histogram(g), (Hist{{"Linear", 1}}));
    const ir::Node* lin = testing::NodesOf(g, OpKind::kLinear)[0];
    EXPECT_EQ(lin->inputs, (std::vector<ValueId>{x, w, bias}));
    EXPECT_EQ(lin->outputs[0], y);
    EXPECT_EQ(lin->attrs.Get<int64_t>("trans_b", -1), 0);
  }
}

TEST(LinearFusionTest, MatMulWithTransposedWeight) {
  GraphBuilder b;
  ValueId x = b.Input("x", {kS, kB, Dim(16)});
  ValueId w = b.Param("w", {48, 16});
  ValueId bias = b.Param("b", {48});
  ValueId wt = b.Op(OpKind::kTranspose, {w}, {Dim(16), Dim(48)}, MakeAttrs({{"perm", std::vector<int64_t>{1, 0}}}));
  ValueId y = b.Op(OpKind::kAdd, {bias, b.Op(OpKind::kMatMul, {x, wt}, {kS, kB, Dim(48)})}, {kS, kB, Dim(48)});
  b.Output(y);
  ir::Graph& g = b.graph();
  ASSERT_TRUE(RunLinear(g));
  EXPECT_EQ(Histogram(g), (Hist{{"Linear", 1}}));
  const ir::Node* lin = testing::NodesOf(g, OpKind::kLinear)[0];
  EXPECT_EQ(lin->inputs, (std::vector<ValueId>{x, w, bias}));
  EXPECT_EQ(lin->attrs.Get<int64_t>("trans_b", -1), 1);
}

TEST(LinearFusionTest, SharedTransposeStaysForItsOtherUser) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4), Dim(16)});
  ValueId w = b.Param("w", {8, 16});
  ValueId wt = b.Op(OpKind::kTranspose, {w}, {Dim(16), Dim(8)}, MakeAttrs({{"perm", std::vector<int64_t>{1, 0}}}));
  b.Output(b.Op(OpKind::kMatMul, {x, wt}, {Dim(4), Dim(8)}));
  b.Output(b.Op(OpKind::kRelu, {wt}, {Dim(16), Dim(8)}));
  ir::Graph& g = b.graph();
  ASSERT_TRUE(RunLinear(g));
  EXPECT_EQ(Histogram(g), (Hist{{"Linear", 1}, {"Relu", 1}, {"Transpose", 1}}));
}

TEST(LinearFusionTest, BiasNotAbsorbedWhenMatMulHasAnotherConsumer) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4), Dim(16)});
  ValueId mm = b.Op(OpKind::kMatMul, {x, b.Param("w", {16, 8})}, {Dim(4), Dim(8)});
  b.Output(b.Op(OpKind::kAdd, {mm, b.Param("b", {8})}, {Dim(4), Dim(8)}));
  b.Output(b.Op(OpKind::kRelu, {mm}, {Dim(4), Dim(8)}));
  ir::Graph& g = b.graph();
  ASSERT_TRUE(RunLinear(g));
  EXPECT_EQ(Histogram(g), (Hist{{"Add", 1}, {"Linear", 1}, {"Relu", 1}}));
  EXPECT_EQ(testing::NodesOf(g, OpKind::kLinear)[0]->inputs.size(), 2u);
}

TEST(LinearFusionTest, AddOfNonBiasShapeIsNotAbsorbed) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4), Dim(16)});
  ValueId mm = b.Op(OpKind::kMatMul, {x, b.Param("w", {16, 8})}, {Dim(4), Dim(8)});
  b.Output(b.Op(OpKind::kAdd, {mm, b.Param("full", {4, 8})}, {Dim(4), Dim(8)}));
  ir::Graph& g = b.graph();
  ASSERT_TRUE(RunLinear(g));
  EXPECT_EQ(Histogram(g), (Hist{{"Add", 1}, {"Linear", 1}}));
}

TEST(LinearFusionTest, MatMulOfActivationsStays) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4), Dim(16)});
  ValueId y = b.Input("y", {Dim(16), Dim(8)});
  b.Output(b.Op(OpKind::kMatMul, {x, y}, {Dim(4), Dim(8)}));
  ValueId w3 = b.Param("w3", {2, 16, 8});
  b.Output(b.Op(OpKind::kMatMul, {x, w3}, {Dim(2), Dim(4), Dim(8)}));
  ir::Graph& g = b.graph();
  EXPECT_FALSE(RunLinear(g));
  EXPECT_EQ(Histogram(g), (Hist{{"MatMul", 2}}));
}

TEST(LinearFusionTest, GemmWithUnitAlphaBeta) {
  for (int64_t trans_b : {0, 1}) {
    GraphBuilder b;
    ValueId x = b.Input("x", {kB, Dim(16)});
    ValueId w = trans_b ? b.Param("w", {8, 16}) : b.Param("w", {16, 8});
    ValueId bias = b.Param("b", {8});
    b.Output(b.Op(OpKind::kGemm, {x, w, bias}, {kB, Dim(8)},
                  MakeAttrs({{"alpha", 1.0}, {"beta", 1.0}, {"transB", trans_b}})));
    ir::Graph& g = b.graph();
    ASSERT_TRUE(RunLinear(g));
    EXPECT_EQ(Histogram(g), (Hist{{"Linear", 1}}));
    const ir::Node* lin = testing::NodesOf(g, OpKind::kLinear)[0];
    EXPECT_EQ(lin->inputs, (std::vector<ValueId>{x, w, bias}));
    EXPECT_EQ(lin->attrs.Get<int64_t>("trans_b", -1), trans_b);
  }
}

TEST(LinearFusionTest, GemmWithOtherAttributesStays) {
  struct Case {
    ir::Attrs attrs;
    bool full_c;
  };
  std::vector<Case> cases = {
      {MakeAttrs({{"alpha", 0.5}, {"transB", int64_t{1}}}), false},
      {MakeAttrs({{"beta", 2.0}, {"transB", int64_t{1}}}), false},
      {MakeAttrs({{"transA", int64_t{1}}, {"transB", int64_t{1}}}), false},
      {MakeAttrs({{"transB", int64_t{1}}}), true},  // C of shape (M, N) is not a bias
  };
  for (const Case& c : cases) {
    GraphBuilder b;
    ValueId x = b.Input("x", {Dim(16), Dim(16)});
    ValueId bias = c.full_c ? b.Param("c", {16, 8}) : b.Param("b", {8});
    b.Output(b.Op(OpKind::kGemm, {x, b.Param("w", {8, 16}), bias}, {Dim(16), Dim(8)}, c.attrs));
    ir::Graph& g = b.graph();
    EXPECT_FALSE(RunLinear(g)) << c.attrs.ToString();
    EXPECT_EQ(Histogram(g), (Hist{{"Gemm", 1}}));
  }
}

}  // namespace
}  // namespace onnxpipe::passes
