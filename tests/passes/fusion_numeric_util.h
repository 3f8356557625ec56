// What the fusion passes' tests share: a pass that must fuse exactly one node, a pass that must leave a graph as it
// was, the layout passes in a row, and two graphs compared on the same random inputs (numeric_util.h's CPU evaluation).
#pragma once

#include "frontend/ir/verifier.h"
#include "frontend/passes/attention_layout.h"
#include "frontend/passes/dead_code_elimination.h"
#include "frontend/passes/row_layout_motion.h"
#include "gtest/gtest.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes::testing {

// `g` after `Pass`, which must change it into a valid graph with exactly one `fused` node.
template <typename Pass>
ir::Graph FusedOnce(const ir::Graph& g, ir::OpKind fused) {
  ir::Graph out = g;
  Pass pass;
  absl::StatusOr<bool> changed = pass.Run(&out);
  EXPECT_TRUE(changed.ok() && *changed) << HistogramString(out);
  EXPECT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  EXPECT_EQ(NodesOf(out, fused).size(), 1u) << HistogramString(out);
  return out;
}

// `run` (a pass over `g`) reports no change and leaves the op histogram as it was.
template <typename Run>
void ExpectUnchanged(ir::Graph& g, Run run) {
  const std::map<std::string, int> before = Histogram(g);
  absl::StatusOr<bool> changed = run(g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(*changed) << HistogramString(g);
  EXPECT_EQ(Histogram(g), before);
}
template <typename Pass>
void ExpectUnchangedBy(ir::Graph& g) {
  ExpectUnchanged(g, [](ir::Graph& x) { return Pass().Run(&x); });
}

// `g` after the layout passes as the pipeline runs them (RowLayoutMotion, AttentionLayout, then dead code removed),
// a valid graph.
inline ir::Graph LaidOut(const ir::Graph& g) {
  ir::Graph out = g;
  absl::StatusOr<bool> moved = RowLayoutMotion().Run(&out);
  EXPECT_TRUE(moved.ok()) << moved.status();
  absl::StatusOr<bool> changed = AttentionLayout().Run(&out);
  EXPECT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(DeadCodeElimination().Run(&out).ok());
  EXPECT_TRUE(ir::Verify(out).ok()) << ir::Verify(out);
  return out;
}

// Every output of `a` and `b` within `tol` of each other on two sets of random inputs.
inline void ExpectSameOutputs(const ir::Graph& a, const ir::Graph& b, double tol) {
  for (uint32_t seed : {1u, 2u}) {
    absl::StatusOr<std::vector<ir::Tensor>> feeds = RandomFeeds(a, {}, seed);
    ASSERT_TRUE(feeds.ok()) << feeds.status();
    absl::StatusOr<std::vector<ir::Tensor>> ya = Evaluate(a, *feeds), yb = Evaluate(b, *feeds);
    ASSERT_TRUE(ya.ok()) << ya.status();
    ASSERT_TRUE(yb.ok()) << yb.status();
    absl::StatusOr<double> diff = MaxAbsDiff(*ya, *yb);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, tol) << "seed " << seed;
  }
}

}  // namespace onnxpipe::passes::testing
