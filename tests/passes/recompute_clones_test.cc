// Recompute cloning (frontend/passes/recompute_clones.h) on a hand-built graph: which values the
// clones and the backward nodes read, the order, and the random-stream key of a cloned Dropout.
#include "frontend/passes/recompute_clones.h"

#include "gtest/gtest.h"

namespace onnxpipe::passes {
namespace {

using ir::DType;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

TEST(RecomputeClones, RegionsReadTheirOwnClonesAndTheBackwardReadsTheLatest) {
  ir::Graph g;
  const ir::Shape s = {ir::Dim(4)};
  const ValueId x = g.AddValue("x", DType::kF32, s), a = g.AddValue("a", DType::kF32, s);
  const ValueId d = g.AddValue("d", DType::kF32, s), r = g.AddValue("r", DType::kF32, s);
  const ValueId gr = g.AddValue("gr", DType::kF32, s), ga = g.AddValue("ga", DType::kF32, s);
  g.inputs() = {x};
  ir::Attrs drop;
  drop.Set("ratio", 0.5);
  const NodeId n_exp = g.AddNode(OpKind::kExp, "exp", {x}, {a});
  const NodeId n_drop = g.AddNode(OpKind::kDropout, "drop", {a}, {d}, drop);
  const NodeId n_relu = g.AddNode(OpKind::kRelu, "relu", {d}, {r});
  // Two backward nodes: the first reads r (not recomputed) and d, the second a and d.
  const NodeId b1 = g.AddNode(OpKind::kMul, "b1", {r, d}, {gr});
  const NodeId b2 = g.AddNode(OpKind::kMul, "b2", {a, d}, {ga});
  const int32_t values_before = g.num_values();

  // Region 0 recomputes exp and drop before b1; region 1 recomputes only drop (reading the forward a,
  // not region 0's clone of it) before b2.
  const ClonedBackward c = CloneRecomputeRegions(g, {{n_exp, 0}, {n_drop, 0}, {b1, -1}, {n_drop, 1}, {b2, -1}});
  ASSERT_EQ(c.clones.size(), 3u);
  EXPECT_EQ(c.cloned_from, (std::vector<NodeId>{n_exp, n_drop, n_drop}));
  ASSERT_EQ(c.order.size(), 5u);
  EXPECT_EQ(c.order[2], b1);
  EXPECT_EQ(c.order[4], b2);
  EXPECT_EQ(c.order[0], c.clones[0]);
  const ir::Node& exp0 = g.node(c.clones[0]);
  const ir::Node& drop0 = g.node(c.clones[1]);
  const ir::Node& drop1 = g.node(c.clones[2]);
  EXPECT_EQ(exp0.op, OpKind::kExp);
  EXPECT_EQ(exp0.inputs[0], x);                 // a region input from outside: the forward value
  EXPECT_EQ(drop0.inputs[0], exp0.outputs[0]);  // within the region: the region's clone
  EXPECT_EQ(drop1.inputs[0], a);                // region 1 did not recompute exp
  for (const ir::Node* n : {&exp0, &drop0, &drop1}) {
    EXPECT_EQ(n->phase, ir::Phase::kBackward);
    EXPECT_GE(n->outputs[0], values_before);  // fresh values
  }
  EXPECT_EQ(drop0.attrs.Get<std::string>("rng_key", ""), "drop");
  EXPECT_EQ(drop0.origin, "drop");
  // b1 reads region 0's clone of d, keeps r; b2 reads region 0's clone of a and region 1's of d.
  EXPECT_EQ(g.node(b1).inputs, (std::vector<ValueId>{r, drop0.outputs[0]}));
  EXPECT_EQ(g.node(b2).inputs, (std::vector<ValueId>{exp0.outputs[0], drop1.outputs[0]}));
  // The forward is untouched.
  EXPECT_EQ(g.node(n_drop).inputs[0], a);
  EXPECT_EQ(g.node(n_relu).inputs[0], d);
  EXPECT_FALSE(g.node(n_drop).attrs.Has("rng_key"));
}

}  // namespace
}  // namespace onnxpipe::passes
