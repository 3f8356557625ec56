#include "frontend/passes/gathers_to_split.h"

#include <cstdint>
#include <tuple>
#include <utility>

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
using testing::NodesOf;

// x (B, 3, 4) -> Tanh -> Gathers along axis `axis` with the given scalar indices, each an output.
struct Unbound {
  GraphBuilder b;
  ValueId packed = ir::kNoValue;
  std::vector<ValueId> parts;
};

void Build(Unbound& u, const std::vector<int64_t>& indices, int64_t axis = 1) {
  ValueId x = u.b.Input("x", {Dim::Symbol("B"), Dim(3), Dim(4)});
  u.packed = u.b.Op(OpKind::kTanh, {x}, {Dim::Symbol("B"), Dim(3), Dim(4)});
  for (int64_t i : indices) {
    const ValueId idx = u.b.Const("i" + std::to_string(u.parts.size()), ir::Tensor::Scalar<int64_t>(i));
    u.parts.push_back(u.b.Op(OpKind::kGather, {u.packed, idx}, {Dim::Symbol("B"), Dim(4)}, MakeAttrs({{"axis", axis}})));
    u.b.Output(u.parts.back());
  }
}

TEST(GathersToSplitTest, ScalarGathersCoveringAnAxisBecomeOneSplit) {
  for (int64_t axis : {1, -2}) {
    Unbound u;
    Build(u, {2, 0, -2}, axis);  // -2 wraps to 1: every index of the axis once, in any order
    ir::Graph& g = u.b.graph();
    GathersToSplit pass;
    absl::StatusOr<bool> changed = pass.Run(&g);
    ASSERT_TRUE(changed.ok()) << changed.status();
    EXPECT_TRUE(*changed);
    EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Tanh", 1}, {"Split", 1}, {"Squeeze", 3}}));
    const ir::Node& split = *NodesOf(g, OpKind::kSplit)[0];
    EXPECT_EQ(split.inputs[0], u.packed);
    EXPECT_EQ(split.attrs.Get<int64_t>("axis"), 1);
    EXPECT_EQ(split.attrs.Get<std::vector<int64_t>>("split"), (std::vector<int64_t>{1, 1, 1}));
    ASSERT_EQ(split.outputs.size(), 3u);
    // Gather k's output is now Squeeze(piece index_k): index 2 -> piece 2, 0 -> 0, -2 -> 1.
    const std::vector<int> piece_of = {2, 0, 1};
    for (size_t k = 0; k < u.parts.size(); ++k) {
      const ir::Node& sq = g.node(g.value(u.parts[k]).producer);
      EXPECT_EQ(sq.op, OpKind::kSqueeze);
      EXPECT_EQ(sq.inputs[0], split.outputs[piece_of[k]]) << k;
      EXPECT_EQ(sq.attrs.Get<std::vector<int64_t>>("axes"), (std::vector<int64_t>{1}));
    }
    // The pieces keep the symbolic batch dim.
    EXPECT_EQ(g.value(split.outputs[0]).shape, (ir::Shape{Dim::Symbol("B"), Dim(1), Dim(4)}));
    EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
    changed = pass.Run(&g);
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(*changed);
  }
}

// x (B, 12) -> Tanh -> Slices [starts[k], ends[k]) of the last axis (steps[k] when non-zero), each an output.
std::pair<GraphBuilder, std::vector<ValueId>> Chunked(const std::vector<int64_t>& starts,
                                                      const std::vector<int64_t>& ends,
                                                      const std::vector<int64_t>& steps) {
  GraphBuilder b;
  ValueId x = b.Input("x", {Dim::Symbol("B"), Dim(12)});
  ValueId packed = b.Op(OpKind::kTanh, {x}, {Dim::Symbol("B"), Dim(12)});
  std::vector<ValueId> parts;
  for (size_t k = 0; k < starts.size(); ++k) {
    std::vector<ValueId> in = {packed, b.IntVec({starts[k]}), b.IntVec({ends[k]}), b.IntVec({-1})};
    if (steps[k] != 0) in.push_back(b.IntVec({steps[k]}));
    parts.push_back(b.Op(OpKind::kSlice, in, {Dim::Symbol("B"), Dim::Unknown()}));
    b.Output(parts.back());
  }
  return {std::move(b), parts};
}

TEST(GathersToSplitTest, SlicesTilingAnAxisBecomeOneSplit) {
  // torch's chunk(3, -1) on older exporters: the last end is "to the end" (INT64_MAX), in any order.
  auto [b, parts] = Chunked({8, 0, 4}, {INT64_MAX, 4, 8}, {0, 1, 0});
  ir::Graph& g = b.graph();
  absl::StatusOr<bool> changed = GathersToSplit().Run(&g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(Histogram(g), (std::map<std::string, int>{{"Tanh", 1}, {"Split", 1}}));
  const ir::Node& split = *NodesOf(g, OpKind::kSplit)[0];
  EXPECT_EQ(split.attrs.Get<int64_t>("axis"), 1);
  EXPECT_EQ(split.attrs.Get<std::vector<int64_t>>("split"), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(split.outputs, (std::vector<ValueId>{parts[1], parts[2], parts[0]}));
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  // A gap, an overlap, a step of 2: left alone.
  for (auto [starts, ends, steps] : {std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>>{
                                         {0, 5}, {4, 12}, {0, 0}},
                                     {{0, 3}, {4, 12}, {0, 0}},
                                     {{0, 6}, {6, 12}, {2, 0}}}) {
    auto [other, unused] = Chunked(starts, ends, steps);
    changed = GathersToSplit().Run(&other.graph());
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(*changed) << testing::HistogramString(other.graph());
  }
}

TEST(GathersToSplitTest, LeavesPartialRepeatedOrMixedUsesAlone) {
  const std::vector<std::vector<int64_t>> cases = {{0, 1}, {0, 1, 1}, {0, 1, 2, -3}, {0}};
  for (const std::vector<int64_t>& indices : cases) {
    Unbound u;
    Build(u, indices);
    GathersToSplit pass;
    absl::StatusOr<bool> changed = pass.Run(&u.b.graph());
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(*changed) << ::testing::PrintToString(indices);
  }
  // Another use of the packed value besides the Gathers.
  Unbound mixed;
  Build(mixed, {0, 1, 2});
  mixed.b.Output(mixed.b.Op(OpKind::kExp, {mixed.packed}, {Dim::Symbol("B"), Dim(3), Dim(4)}));
  // The packed value itself a graph output.
  Unbound output;
  Build(output, {0, 1, 2});
  output.b.Output(output.packed);
  // An index that is computed, not constant.
  Unbound computed;
  Build(computed, {0, 1});
  ir::Graph& g = computed.b.graph();
  const ValueId two = computed.b.Op(OpKind::kIdentity, {computed.b.Const("two", ir::Tensor::Scalar<int64_t>(2))}, {},
                                    {}, ir::DType::kI64);
  computed.b.Output(computed.b.Op(OpKind::kGather, {computed.packed, two}, {Dim::Symbol("B"), Dim(4)},
                                  MakeAttrs({{"axis", int64_t{1}}})));
  for (ir::Graph* graph : {&mixed.b.graph(), &output.b.graph(), &g}) {
    GathersToSplit pass;
    absl::StatusOr<bool> changed = pass.Run(graph);
    ASSERT_TRUE(changed.ok());
    EXPECT_FALSE(*changed) << testing::HistogramString(*graph);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
