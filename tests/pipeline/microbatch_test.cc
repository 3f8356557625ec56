// Micro-batching helpers: loss shares (hand-counted), row slicing, and the fixed-batch re-derivation
// on small hand-built graphs (unique batch entry patched, ambiguous entries refused, Expand), and an f64 micro-batch
// graph folded in f64.
#include "executor/pipeline/microbatch.h"
#include "frontend/passes/batch_symbolic.h"

#include <cmath>

#include "frontend/ir/infer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::pipeline {
namespace {

using ::testing::HasSubstr;

ir::Tensor I64(std::vector<int64_t> v) { return ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v); }

TEST(LossShares, CountNonIgnoredLabelsPerMicrobatch) {
  LossShareRule rule;
  rule.has_ignore_index = true;
  rule.ignore_index = -100;
  rule.labels_input = "labels";
  absl::StatusOr<std::vector<double>> s = LossShares(rule, {I64({1, -100, 2}), I64({-100, -100, 3})});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ((*s)[0], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ((*s)[1], 1.0 / 3.0);
  // Equal micro-batches without ignored labels: 1/M exactly.
  rule.has_ignore_index = false;
  s = LossShares(rule, {I64({0, 1}), I64({1, 1}), I64({0, 0}), I64({1, 0})});
  ASSERT_TRUE(s.ok());
  for (double x : *s) EXPECT_EQ(x, 0.25);
  rule.reduction = "sum";
  s = LossShares(rule, {I64({0}), I64({1})});
  EXPECT_EQ(*s, (std::vector<double>{1.0, 1.0}));
}

TEST(LossShares, AMicrobatchWithoutLabelsIsAnError) {
  LossShareRule rule;
  rule.has_ignore_index = true;
  rule.ignore_index = -100;
  EXPECT_THAT(LossShares(rule, {I64({1, 2}), I64({-100, -100})}).status().message(),
              HasSubstr("micro-batch 1 has no label other than ignore_index"));
  EXPECT_THAT(LossShares(rule, {I64({-100}), I64({-100})}).status().message(), HasSubstr("undefined"));
}

TEST(SliceRows, CopiesTheRows) {
  ir::Tensor t = ir::Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  absl::StatusOr<ir::Tensor> s = SliceRows(t, 1, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dims(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(s->data<float>()[0], 3.0f);
  EXPECT_EQ(s->data<float>()[3], 6.0f);
  EXPECT_FALSE(SliceRows(t, 2, 4).ok());
}

// x (B0, 4, 8) -> Reshape(shape) -> y, a graph output.
ir::Graph ReshapeGraph(int64_t b0, std::vector<int64_t> shape) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, ir::FromInts({b0, 4, 8}));
  g.inputs().push_back(x);
  const ir::ValueId s = g.AddConstant("shape", I64(shape));
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {}, /*shape_known=*/false);
  g.AddNode(ir::OpKind::kReshape, "heads", {x, s}, {y});
  g.outputs().push_back(y);
  EXPECT_TRUE(ir::InferShapes(g).ok());
  return g;
}

TEST(MakeBatchSymbolic, PatchesTheOnlyEntryThatCanBeTheBatch) {
  ir::Graph g = ReshapeGraph(6, {6, 4, 2, 4});
  int64_t b0 = 0;
  absl::Status st = passes::MakeBatchSymbolic(&g, "B", &b0);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(b0, 6);
  const ir::Value& y = g.value(g.FindValue("y"));
  EXPECT_EQ(ir::ShapeToString(y.shape), ir::ShapeToString({ir::Dim::Symbol("B"), 4, 2, 4}));
  // And the graph binds to another batch.
  ASSERT_TRUE(ir::BindSymbols(g, {{"B", 3}}).ok());
  ASSERT_TRUE(ir::InferShapes(g).ok());
  EXPECT_EQ(ir::ToInts(g.value(g.FindValue("y")).shape), (std::vector<int64_t>{3, 4, 2, 4}));
}

TEST(MakeBatchSymbolic, RefusesWhenTwoEntriesCouldBeTheBatch) {
  // Export batch 4 with 4 "heads": [4, 4, 2, 4] reshaped from (4, 4, 8) could keep the batch first
  // or second.
  ir::Graph g = ReshapeGraph(4, {4, 4, 2, 4});
  absl::Status st = passes::MakeBatchSymbolic(&g, "B", nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr("node 'heads' (Reshape)"));
  EXPECT_THAT(st.message(), HasSubstr("ambiguous"));
  EXPECT_THAT(st.message(), HasSubstr("re-export the model with dynamic axes"));
}

TEST(MakeBatchSymbolic, ExpandKeepsTheBatchAndRefusesABroadcastToIt) {
  for (bool ambiguous : {false, true}) {
    ir::Graph g;
    const ir::ValueId x = g.AddValue("x", ir::DType::kF32, ir::FromInts({6, 1, 8}));
    g.inputs().push_back(x);
    const ir::ValueId s = g.AddConstant("shape", I64({6, ambiguous ? 6 : 3, 8}));
    const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {}, false);
    g.AddNode(ir::OpKind::kExpand, "expand", {x, s}, {y});
    g.outputs().push_back(y);
    ASSERT_TRUE(ir::InferShapes(g).ok());
    absl::Status st = passes::MakeBatchSymbolic(&g, "B", nullptr);
    if (ambiguous) {
      EXPECT_THAT(st.message(), HasSubstr("broadcasts a size-1 dim to 6, the export batch"));
    } else {
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(ir::ShapeToString(g.value(y).shape), ir::ShapeToString({ir::Dim::Symbol("B"), 3, 8}));
    }
  }
}

TEST(MakeBatchSymbolic, InputsWithDifferentLeadingDimsAreAmbiguous) {
  ir::Graph g;
  g.inputs().push_back(g.AddValue("a", ir::DType::kF32, ir::FromInts({2, 3})));
  g.inputs().push_back(g.AddValue("b", ir::DType::kF32, ir::FromInts({3, 3})));
  EXPECT_THAT(passes::MakeBatchSymbolic(&g, "B", nullptr).message(), HasSubstr("leading dims differ"));
  EXPECT_TRUE(passes::HasFixedBatch(g));
}

// An f64 micro-batch graph folds in f64: a table computed from constants (as a rotary table is from positions) is
// the f64 value, not the f32 one converted afterwards (up to 2^-24 relative off); an f32 graph folds in f32.
TEST(PrepareMicrobatchForward, F64FoldsInF64) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, {ir::Dim::Symbol("B"), ir::Dim(3)});
  g.inputs().push_back(x);
  const ir::ValueId k = g.AddConstant("k", ir::Tensor::FromVector<float>({3}, {1.0f, 2.0f, 3.0f}));
  const ir::ValueId c = g.AddConstant("c", ir::Tensor::FromVector<float>({}, {0.1f}));
  const ir::ValueId angle = g.AddValue("angle", ir::DType::kF32, {}, false);
  const ir::ValueId table = g.AddValue("table", ir::DType::kF32, {}, false);
  const ir::ValueId y = g.AddValue("y", ir::DType::kF32, {}, false);
  g.AddNode(ir::OpKind::kMul, "angle", {k, c}, {angle});
  g.AddNode(ir::OpKind::kCos, "table", {angle}, {table});
  g.AddNode(ir::OpKind::kAdd, "y", {x, table}, {y});
  g.outputs().push_back(y);
  ASSERT_TRUE(ir::InferShapes(g).ok());
  for (const ir::DType compute : {ir::DType::kF64, ir::DType::kF32}) {
    absl::StatusOr<ir::Graph> prepared = PrepareMicrobatchForward(g, "B", 2, {}, compute);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    const ir::Value& out = prepared->value(prepared->outputs()[0]);
    EXPECT_EQ(out.dtype, compute);
    const ir::Node& add = prepared->node(out.producer);
    ASSERT_EQ(add.op, ir::OpKind::kAdd);
    const ir::Value& folded = prepared->value(add.inputs[1]);
    ASSERT_TRUE(folded.constant && folded.constant->has_data()) << "the table is folded";
    for (int64_t i = 0; i < 3; ++i) {
      const double want = std::cos(static_cast<double>(i + 1) * static_cast<double>(0.1f));
      if (compute == ir::DType::kF64) {
        EXPECT_EQ(folded.constant->GetAsDouble(i), want) << i;
      } else {  // f32 arithmetic: within a few f32 ulps of the f64 value
        EXPECT_NEAR(folded.constant->GetAsDouble(i), want, 4 * 0x1p-24 * std::abs(want)) << i;
      }
    }
  }
}

}  // namespace
}  // namespace onnxpipe::pipeline
