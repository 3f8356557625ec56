#include "frontend/passes/constant_folding.h"

#include "frontend/ir/verifier.h"
#include "frontend/passes/dead_code_elimination.h"
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
using testing::TinyEvaluator;

// Runs folding then DCE, as the pipeline does, and verifies the result.
void FoldAndClean(ir::Graph& g, const ir::OpEvaluator& ev, ConstantFoldingOptions opts = {}) {
  ConstantFolding fold(ev, opts);
  DeadCodeElimination dce;
  ASSERT_TRUE(fold.Run(&g).ok());
  ASSERT_TRUE(dce.Run(&g).ok());
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
}

// The exporter's reshape-to-(batch, -1) chain: Shape -> Gather -> Unsqueeze -> Concat -> Reshape.
ValueId BuildShapeChain(GraphBuilder& b, ValueId x, Dim batch) {
  ValueId shape = b.Op(OpKind::kShape, {x}, {Dim(3)}, {}, DType::kI64);
  ValueId idx = b.Const("idx0", Tensor::Scalar<int64_t>(0));
  ValueId g0 = b.Op(OpKind::kGather, {shape, idx}, {}, MakeAttrs({{"axis", int64_t{0}}}), DType::kI64);
  ValueId u = b.Op(OpKind::kUnsqueeze, {g0}, {Dim(1)}, MakeAttrs({{"axes", std::vector<int64_t>{0}}}),
                   DType::kI64);
  ValueId cat = b.Op(OpKind::kConcat, {u, b.IntVec({-1})}, {Dim(2)}, MakeAttrs({{"axis", int64_t{0}}}),
                     DType::kI64);
  return b.Op(OpKind::kReshape, {x, cat}, {batch, Dim(40)});
}

TEST(ConstantFoldingTest, ShapeChainFoldsOnceDimsAreConcrete) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2), Dim(5), Dim(8)});
  ValueId y = BuildShapeChain(b, x, Dim(2));
  b.Output(b.Op(OpKind::kRelu, {y}, {Dim(2), Dim(40)}));
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Relu", 1}, {"Reshape", 1}}));
  const ir::Node* reshape = testing::NodesOf(g, OpKind::kReshape)[0];
  const ir::Value& target = g.value(reshape->inputs[1]);
  ASSERT_TRUE(target.constant.has_value());
  EXPECT_EQ(target.constant->ToInt64Vector(), (std::vector<int64_t>{2, -1}));
}

TEST(ConstantFoldingTest, SymbolicShapeIsNotFolded) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim::Symbol("B"), Dim(5), Dim(8)});
  b.Output(b.Op(OpKind::kRelu, {BuildShapeChain(b, x, Dim::Symbol("B"))}, {Dim::Symbol("B"), Dim(40)}));
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  ConstantFolding fold(ev);
  absl::StatusOr<bool> changed = fold.Run(&g);
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  EXPECT_EQ(Histogram(g)["Shape"], 1);
  EXPECT_EQ(Histogram(g)["Concat"], 1);
}

TEST(ConstantFoldingTest, ShapeHonoursStartAndEnd) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2), Dim(5), Dim(8)});
  ValueId s = b.Op(OpKind::kShape, {x}, {Dim(2)}, MakeAttrs({{"start", int64_t{-2}}}), DType::kI64);
  ValueId r = b.Op(OpKind::kReshape, {x, s}, {Dim(10), Dim(8)});
  b.Output(r);
  TinyEvaluator ev;
  FoldAndClean(b.graph(), ev);
  const ir::Value& v = b.graph().value(s);
  ASSERT_TRUE(v.constant.has_value());
  EXPECT_EQ(v.constant->ToInt64Vector(), (std::vector<int64_t>{5, 8}));
}

TEST(ConstantFoldingTest, FloatInitializersAreParametersAndStay) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(4)});
  ValueId w = b.Param("w", {4});
  ValueId w2 = b.Op(OpKind::kMul, {w, b.Scalar(2.0f)}, {Dim(4)});  // over a parameter: keep
  ValueId steps = b.graph().AddConstant("steps", Tensor::FromVector<int64_t>({2}, {0, 3}),
                                        /*is_initializer=*/true);  // integer initializer: constant
  ValueId steps2 = b.Op(OpKind::kAdd, {steps, b.IntVec({1, 1})}, {Dim(2)}, {}, DType::kI64);
  ValueId c = b.Op(OpKind::kAdd, {b.Scalar(1.0f), b.Scalar(2.0f)}, {});  // Constant values: fold
  ValueId y = b.Op(OpKind::kAdd, {b.Op(OpKind::kMul, {x, w2}, {Dim(4)}), c}, {Dim(4)});
  b.Output(y);
  b.Output(b.Op(OpKind::kReshape, {y, steps2}, {Dim(1), Dim(4)}));  // a consumer for steps2
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(Histogram(g)["Mul"], 2) << testing::HistogramString(g);
  EXPECT_FALSE(g.value(w2).constant.has_value());
  ASSERT_TRUE(g.value(steps2).constant.has_value());
  EXPECT_EQ(g.value(steps2).constant->ToInt64Vector(), (std::vector<int64_t>{1, 4}));
  ASSERT_TRUE(g.value(c).constant.has_value());
  EXPECT_EQ(g.value(c).constant->data<float>()[0], 3.0f);
  EXPECT_TRUE(g.value(w).is_initializer);
  EXPECT_FALSE(g.value(c).is_initializer);
}

TEST(ConstantFoldingTest, DropoutIsNeverFolded) {
  GraphBuilder b;
  ValueId c = b.Const("c", Tensor::FromVector<float>({2}, {1.0f, 2.0f}));
  ValueId d = b.Op(OpKind::kDropout, {c}, {Dim(2)}, MakeAttrs({{"ratio", 0.5}}));
  ValueId x = b.Input("x", {Dim(2)});
  b.Output(b.Op(OpKind::kAdd, {x, d}, {Dim(2)}));
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(Histogram(g)["Dropout"], 1);
  EXPECT_FALSE(g.value(d).constant.has_value());
}

TEST(ConstantFoldingTest, BypassesNoOps) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim::Symbol("B"), Dim(8)});
  ValueId i = b.Op(OpKind::kIdentity, {x}, {Dim::Symbol("B"), Dim(8)});
  ValueId c = b.Op(OpKind::kCast, {i}, {Dim::Symbol("B"), Dim(8)}, MakeAttrs({{"to", std::string("f32")}}));
  ValueId r = b.Op(OpKind::kReshape, {c, b.IntVec({-1, 8})}, {Dim::Symbol("B"), Dim(8)});
  ValueId e = b.Op(OpKind::kExpand, {r, b.IntVec({1, 8})}, {Dim::Symbol("B"), Dim(8)});
  ValueId real = b.Op(OpKind::kCast, {e}, {Dim::Symbol("B"), Dim(8)}, MakeAttrs({{"to", std::string("f64")}}),
                      DType::kF64);
  ValueId y = b.Op(OpKind::kNeg, {real}, {Dim::Symbol("B"), Dim(8)}, {}, DType::kF64);
  b.Output(y);
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Cast", 1}, {"Neg", 1}}));
  EXPECT_EQ(testing::NodesOf(g, OpKind::kCast)[0]->inputs[0], x);
}

// x + 0 and x - 0 with a uniform constant, a ConstantOfShape fill or their product pass x through
// (GPT-NeoX-Japanese's baddbmm adds 1.0 * zeros to its scores); x * 1 (a norm's frozen scale the
// fusions match), a parameter holding zeros, a broadcast that grows x and 0 - x stay.
TEST(ConstantFoldingTest, BypassesArithmeticWithNeutralConstants) {
  GraphBuilder b;
  const Dim B = Dim::Symbol("B");
  ValueId x = b.Input("x", {B, Dim(4)});
  ValueId dims = b.Op(OpKind::kShape, {x}, {Dim(2)}, {}, DType::kI64);
  ValueId zeros = b.Op(OpKind::kConstantOfShape, {dims}, {B, Dim(4)},
                       MakeAttrs({{"value", Tensor::FromVector<float>({1}, {0.0f})}}));
  ValueId beta_zeros = b.Op(OpKind::kMul, {zeros, b.Scalar(1.0f)}, {B, Dim(4)});
  ValueId plus = b.Op(OpKind::kAdd, {beta_zeros, x}, {B, Dim(4)});
  ValueId minus = b.Op(OpKind::kSub, {plus, b.Const("z", Tensor::FromVector<float>({4}, {0, 0, 0, 0}))}, {B, Dim(4)});
  ValueId times = b.Op(OpKind::kMul, {minus, b.Const("one", Tensor::FromVector<float>({1, 4}, {1, 1, 1, 1}))},
                       {B, Dim(4)});
  ValueId param_zeros = b.Param("beta", {4});
  b.graph().value(param_zeros).constant = Tensor::FromVector<float>({4}, {0, 0, 0, 0});
  ValueId shifted = b.Op(OpKind::kAdd, {times, param_zeros}, {B, Dim(4)});  // a parameter: stays
  ValueId grown = b.Op(OpKind::kAdd, {shifted, b.Const("z3", Tensor(DType::kF32, {3, 1, 1}))}, {Dim(3), B, Dim(4)});
  b.Output(b.Op(OpKind::kSub, {b.Scalar(0.0f), grown}, {Dim(3), B, Dim(4)}));  // 0 - x: stays
  TinyEvaluator ev;
  FoldAndClean(b.graph(), ev);
  EXPECT_EQ(Histogram(b.graph()), (std::map<std::string, int>{{"Add", 2}, {"Sub", 1}, {"Mul", 1}}))
      << testing::HistogramString(b.graph());
  EXPECT_EQ(testing::NodesOf(b.graph(), OpKind::kMul)[0]->inputs[0], x);
}

TEST(ConstantFoldingTest, ReshapeThatChangesShapeStays) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2), Dim(8)});
  b.Output(b.Op(OpKind::kNeg, {b.Op(OpKind::kReshape, {x, b.IntVec({4, 4})}, {Dim(4), Dim(4)})},
                {Dim(4), Dim(4)}));
  TinyEvaluator ev;
  FoldAndClean(b.graph(), ev);
  EXPECT_EQ(Histogram(b.graph())["Reshape"], 1);
}

TEST(ConstantFoldingTest, GraphOutputsKeepTheirProducers) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2)});
  ValueId y = b.Op(OpKind::kIdentity, {x}, {Dim(2)});
  ValueId k = b.Op(OpKind::kAdd, {b.Scalar(1.0f), b.Scalar(2.0f)}, {});
  b.Output(y);
  b.Output(k);
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Add", 1}, {"Identity", 1}}));
  EXPECT_EQ(g.outputs()[0], y);
}

TEST(ConstantFoldingTest, LargeOutputsAreCapped) {
  GraphBuilder b;
  const int64_t n = (int64_t{1} << 20) + 1;
  ValueId a = b.Const("a", Tensor(DType::kF32, {n}));
  ValueId s = b.Op(OpKind::kAdd, {a, b.Scalar(1.0f)}, {Dim(n)});
  ValueId big = b.Op(OpKind::kConstantOfShape, {b.IntVec({4096, 4096})}, {Dim(4096), Dim(4096)});
  ValueId unknown = b.Op(OpKind::kConstantOfShape, {b.IntVec({2048, 2048})}, {Dim::Unknown(), Dim::Unknown()});
  b.Output(b.Op(OpKind::kNeg, {s}, {Dim(n)}));
  b.Output(b.Op(OpKind::kNeg, {big}, {Dim(4096), Dim(4096)}));
  b.Output(b.Op(OpKind::kNeg, {unknown}, {Dim::Unknown(), Dim::Unknown()}));
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  EXPECT_EQ(ev.calls, 0);  // sized before evaluation
  EXPECT_EQ(Histogram(g)["Add"], 1);
  EXPECT_EQ(Histogram(g)["ConstantOfShape"], 2);

  ConstantFoldingOptions generous;
  generous.max_elements = n;
  FoldAndClean(g, ev, generous);
  EXPECT_EQ(Histogram(g)["Add"], 0);
  ASSERT_TRUE(g.value(s).constant.has_value());
  EXPECT_EQ(g.value(s).constant->data<float>()[n - 1], 1.0f);
}

// A GPT-style causal mask kept as a float buffer: Equal(buffer-derived, 0) is boolean, so no
// gradient can flow through it; it folds even though its cone contains a float initializer.
TEST(ConstantFoldingTest, BooleanResultOverBufferFolds) {
  GraphBuilder b;
  ValueId buf = b.graph().AddConstant("bias", Tensor::FromVector<float>({2, 2}, {1, 0, 1, 1}),
                                      /*is_initializer=*/true);
  ValueId neg = b.Op(OpKind::kNeg, {buf}, {Dim(2), Dim(2)});
  ValueId eq = b.Op(OpKind::kEqual, {neg, b.Scalar(0.0f)}, {Dim(2), Dim(2)}, {}, DType::kBool);
  ValueId x = b.Input("x", {Dim(2), Dim(2)});
  ValueId y = b.Op(OpKind::kWhere, {eq, b.Scalar(-1e9f), x}, {Dim(2), Dim(2)});
  b.Output(y);
  ValueId kept = b.Op(OpKind::kMul, {buf, x}, {Dim(2), Dim(2)});  // float use of the buffer: stays
  b.Output(kept);
  ir::Graph& g = b.graph();
  TinyEvaluator ev;
  FoldAndClean(g, ev);
  ASSERT_TRUE(g.value(eq).constant.has_value());
  const bool* m = g.value(eq).constant->data<bool>();
  EXPECT_EQ(std::vector<bool>(m, m + 4), (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Mul", 1}, {"Where", 1}}));
  EXPECT_FALSE(g.value(neg).constant.has_value());  // the float intermediate was never committed
  EXPECT_TRUE(g.value(buf).is_initializer);
}

TEST(ConstantFoldingTest, BooleanResultOverGraphInputStays) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim(2)});
  ValueId eq = b.Op(OpKind::kEqual, {b.Op(OpKind::kNeg, {x}, {Dim(2)}), b.Scalar(0.0f)}, {Dim(2)}, {},
                    DType::kBool);
  b.Output(b.Op(OpKind::kNot, {eq}, {Dim(2)}, {}, DType::kBool));
  TinyEvaluator ev;
  FoldAndClean(b.graph(), ev);
  EXPECT_EQ(ev.calls, 0);
  EXPECT_EQ(Histogram(b.graph())["Equal"], 1);
}

TEST(ConstantFoldingTest, EvaluatorErrorsNameTheNode) {
  GraphBuilder b;
  ValueId data = b.IntVec({1, 2, 3});
  ValueId bad = b.Op(OpKind::kGather, {data, b.IntVec({7})}, {Dim(1)}, {}, DType::kI64);
  ValueId x = b.Input("x", {Dim(3)});
  b.Output(b.Op(OpKind::kReshape, {x, bad}, {Dim(3)}));
  TinyEvaluator ev;
  ConstantFolding fold(ev);
  absl::StatusOr<bool> r = fold.Run(&b.graph());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/l/Gather"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("out of range"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace onnxpipe::passes
