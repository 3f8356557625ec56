// Static memory planner: hand-computed layouts (placement, best fit, aliases, regions, peak) and
// a brute-force check on random graphs that no two values live at the same time share bytes.
#include "partitioner/memory_planner.h"

#include <random>

#include "frontend/autodiff/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;
constexpr int64_t kU = 64;  // one alignment unit; an f32 vector of 16 elements

ir::ValueId F32(ir::Graph& g, const std::string& name, int64_t elements) {
  return g.AddValue(name, ir::DType::kF32, ir::FromInts({elements}));
}

TEST(MemoryPlanner, ChainReusesFreedBuffers) {
  ir::Graph g;
  const ir::ValueId x = F32(g, "x", 16);
  g.inputs().push_back(x);
  const ir::ValueId a = F32(g, "a", 16), b = F32(g, "b", 16), c = F32(g, "c", 16);
  g.AddNode(ir::OpKind::kRelu, "n0", {x}, {a});
  g.AddNode(ir::OpKind::kRelu, "n1", {a}, {b});
  g.AddNode(ir::OpKind::kRelu, "n2", {b}, {c});
  g.outputs().push_back(c);
  absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
  ASSERT_TRUE(p.ok()) << p.status();
  // Live: x [0,0], a [0,1], b [1,2], c [2,2]. x at 0, a above it, b takes x's freed slot, c a's.
  EXPECT_EQ(p->values[x].offset, 0);
  EXPECT_EQ(p->values[a].offset, kU);
  EXPECT_EQ(p->values[b].offset, 0);
  EXPECT_EQ(p->values[c].offset, kU);
  EXPECT_EQ(p->arena_bytes, 2 * kU);
  EXPECT_EQ(p->peak_bytes, 2 * kU);
  EXPECT_EQ(p->values[b].live_begin, 1);
  EXPECT_EQ(p->values[b].live_end, 2);
  EXPECT_EQ(p->values[c].live_end, 2);  // graph output: live to the end
}

TEST(MemoryPlanner, BestFitPicksTheTightestGap) {
  ir::Graph g;
  const ir::ValueId in = g.AddConstant("in", ir::Tensor(ir::DType::kF32, {160}));
  // Sizes in units: m1 3, m2 3, b 2, m4 2 (all produced at 0), x 1 (at 1), y 1 (at 2).
  const ir::ValueId m1 = F32(g, "m1", 48), m2 = F32(g, "m2", 48), b = F32(g, "b", 32),
                    m4 = F32(g, "m4", 32), x = F32(g, "x", 16), y = F32(g, "y", 16);
  g.AddNode(ir::OpKind::kSplit, "split", {in}, {m1, m2, b, m4});
  g.AddNode(ir::OpKind::kRelu, "relu", {m2}, {x});
  g.AddNode(ir::OpKind::kSum, "sum", {m2, m4, x}, {y});
  absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
  ASSERT_TRUE(p.ok()) << p.status();
  // Largest first: m1 [0,3), m2 [3,6) (live with m1), b [6,8), m4 [8,10). x (live [1,2] with m2
  // and m4) sees gaps [0,3) and [6,8): best fit takes 6, where first fit would take 0. y (live at
  // 2 with m2, m4, x) sees [0,3) and [7,8): 7.
  EXPECT_EQ(p->values[m1].offset, 0);
  EXPECT_EQ(p->values[m2].offset, 3 * kU);
  EXPECT_EQ(p->values[b].offset, 6 * kU);
  EXPECT_EQ(p->values[m4].offset, 8 * kU);
  EXPECT_EQ(p->values[x].offset, 6 * kU);
  EXPECT_EQ(p->values[y].offset, 7 * kU);
  EXPECT_EQ(p->arena_bytes, 10 * kU);
  // Live sums: position 0: 3+3+2+2; 1: 3+2+1; 2: 3+2+1+1.
  EXPECT_EQ(p->peak_bytes, 10 * kU);
  EXPECT_EQ(p->peak_position, 0);
  EXPECT_EQ(p->values[in].region, MemoryRegion::kConstants);
  EXPECT_EQ(p->constant_bytes, 10 * kU);
}

TEST(MemoryPlanner, AliasOpsShareTheirInputBuffer) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, ir::FromInts({4, 4}));
  g.inputs().push_back(x);
  const ir::ValueId shape = g.AddConstant("shape", ir::Tensor::FromVector<int64_t>({1}, {16}));
  const ir::ValueId r = F32(g, "r", 16), s = F32(g, "s", 16), t = F32(g, "t", 16);
  g.AddNode(ir::OpKind::kReshape, "reshape", {x, shape}, {r});
  g.AddNode(ir::OpKind::kRelu, "relu", {r}, {s});
  g.AddNode(ir::OpKind::kIdentity, "id", {s}, {t});
  g.outputs().push_back(t);
  absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->values[r].buffer, x);
  EXPECT_EQ(p->values[r].offset, p->values[x].offset);
  EXPECT_EQ(p->values[t].buffer, s);
  EXPECT_EQ(p->values[t].offset, p->values[s].offset);
  EXPECT_NE(p->values[s].offset, p->values[x].offset);  // x/r is read while s is written
  EXPECT_EQ(p->arena_bytes, 2 * kU);
  // The x/r buffer is live over both members: [0, 1].
  EXPECT_EQ(p->values[x].live_end, 1);
}

TEST(MemoryPlanner, ShapeOnlyOperandsDoNotExtendLiveness) {
  ir::Graph g;
  const ir::ValueId x = F32(g, "x", 16);
  g.inputs().push_back(x);
  const ir::ValueId a = F32(g, "a", 16), b = F32(g, "b", 16), z = F32(g, "z", 16);
  g.AddNode(ir::OpKind::kRelu, "n0", {x}, {a});
  g.AddNode(ir::OpKind::kRelu, "n1", {a}, {b});
  g.AddNode(ir::OpKind::kZerosLike, "zeros", {x}, {z});  // reads x's dims only
  g.outputs() = {b, z};
  absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->values[x].live_end, 0);
  EXPECT_EQ(p->values[b].offset, p->values[x].offset);  // x's slot is free again at 1
}

TEST(MemoryPlanner, TrainingGraphRegions) {
  ir::Graph g;
  const ir::ValueId w = g.AddConstant("w", ir::Tensor(ir::DType::kF32, {16}), /*is_initializer=*/true);
  const ir::ValueId frozen = g.AddConstant("table", ir::Tensor(ir::DType::kF32, {32}), true);
  const ir::ValueId x = F32(g, "x", 16);
  g.inputs().push_back(x);
  const ir::ValueId y = F32(g, "y", 16), gw = F32(g, "grad/w", 16);
  g.AddNode(ir::OpKind::kAdd, "fwd", {x, frozen}, {y});
  g.AddNode(ir::OpKind::kMul, "bwd", {y, w}, {gw});
  autodiff::OptimizerOptions o;
  o.momentum = 0.9;
  absl::StatusOr<autodiff::OptimizerGraphInfo> info = autodiff::AddOptimizer(&g, {{w, gw}}, o);
  ASSERT_TRUE(info.ok()) << info.status();
  absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->values[w].region, MemoryRegion::kParameters);
  EXPECT_EQ(p->values[gw].region, MemoryRegion::kGradients);
  EXPECT_EQ(p->values[frozen].region, MemoryRegion::kConstants);
  ASSERT_EQ(info->state.size(), 1u);
  EXPECT_EQ(p->values[info->state[0]].region, MemoryRegion::kOptimizerState);
  EXPECT_EQ(p->parameter_bytes, kU);
  EXPECT_EQ(p->gradient_bytes, kU);
  EXPECT_EQ(p->optimizer_state_bytes, kU);
  EXPECT_EQ(p->constant_bytes, 2 * kU);
  // The updates are written in place over their states.
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    EXPECT_EQ(p->values[u.new_value].region, p->values[u.state].region);
    EXPECT_EQ(p->values[u.new_value].offset, p->values[u.state].offset);
  }
  // Arena: x, y, the f32 norm scalars and the f64 lr, each one unit.
  EXPECT_EQ(p->values[info->lr].region, MemoryRegion::kArena);
  EXPECT_EQ(p->values[info->grad_norm].region, MemoryRegion::kArena);
}

TEST(MemoryPlanner, RejectsUnboundShapesAndBadOrders) {
  ir::Graph g;
  const ir::ValueId x = g.AddValue("x", ir::DType::kF32, {ir::Dim::Symbol("B"), 4});
  g.inputs().push_back(x);
  const ir::ValueId a = g.AddValue("a", ir::DType::kF32, {ir::Dim::Symbol("B"), 4});
  const ir::ValueId b = g.AddValue("b", ir::DType::kF32, {ir::Dim::Symbol("B"), 4});
  g.AddNode(ir::OpKind::kRelu, "first", {x}, {a});
  g.AddNode(ir::OpKind::kRelu, "second", {a}, {b});
  EXPECT_THAT(PlanMemory(g, g.LiveNodes()).status().message(), HasSubstr("value 'x'"));
  EXPECT_THAT(PlanMemory(g, {1, 0}).status().message(), HasSubstr("node 'second'"));
  EXPECT_THAT(PlanMemory(g, {0, 0}).status().message(), HasSubstr("scheduled twice"));
}

// Every pair of arena values in distinct buffers whose live ranges intersect occupies disjoint
// bytes, every value lies inside the arena, the arena is at least the liveness peak, and members
// of one buffer coincide.
void ExpectLiveValuesDisjoint(const ir::Graph& g, const MemoryPlan& plan, int trial) {
  EXPECT_GE(plan.arena_bytes, plan.peak_bytes);
  for (ir::ValueId u = 0; u < g.num_values(); ++u) {
    const ValueMemory& mu = plan.values[u];
    ASSERT_EQ(mu.region, MemoryRegion::kArena) << g.value(u).name;
    EXPECT_EQ(mu.offset % 64, 0);
    EXPECT_LE(mu.offset + mu.bytes, plan.arena_bytes);
    if (mu.buffer != u) {
      EXPECT_EQ(mu.offset, plan.values[mu.buffer].offset);
      EXPECT_EQ(mu.live_begin, plan.values[mu.buffer].live_begin);
    }
    for (ir::ValueId v = u + 1; v < g.num_values(); ++v) {
      const ValueMemory& mv = plan.values[v];
      if (mu.buffer == mv.buffer) continue;
      const bool live_together = mu.live_begin <= mv.live_end && mv.live_begin <= mu.live_end;
      const bool bytes_overlap = mu.offset < mv.offset + mv.bytes && mv.offset < mu.offset + mu.bytes;
      EXPECT_FALSE(live_together && bytes_overlap)
          << "trial " << trial << ": '" << g.value(u).name << "' [" << mu.offset << ", +"
          << mu.bytes << ") live [" << mu.live_begin << ", " << mu.live_end << "] overlaps '"
          << g.value(v).name << "' [" << mv.offset << ", +" << mv.bytes << ") live ["
          << mv.live_begin << ", " << mv.live_end << "]";
    }
  }
}

// Random DAGs with random sizes, alias ops, multi-output nodes and outputs, planned with and
// without a split: ExpectLiveValuesDisjoint, and the split's layout.
TEST(MemoryPlanner, RandomGraphsNeverOverlapLiveValues) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    ir::Graph g;
    std::vector<ir::ValueId> avail;
    const int n_inputs = 1 + rng() % 3;
    for (int i = 0; i < n_inputs; ++i) {
      const ir::ValueId v = F32(g, "in" + std::to_string(i), 1 + rng() % 64);
      g.inputs().push_back(v);
      avail.push_back(v);
    }
    const int n_nodes = 5 + rng() % 40;
    for (int k = 0; k < n_nodes; ++k) {
      const std::string name = "n" + std::to_string(k);
      const ir::ValueId in0 = avail[rng() % avail.size()];
      if (rng() % 4 == 0) {  // an alias of an earlier value
        const ir::ValueId out = F32(g, name + "_alias", ir::NumElements(g.value(in0).shape).value());
        g.AddNode(ir::OpKind::kIdentity, name, {in0}, {out});
        avail.push_back(out);
        continue;
      }
      std::vector<ir::ValueId> ins{in0};
      for (int j = rng() % 3; j > 0; --j) ins.push_back(avail[rng() % avail.size()]);
      std::vector<ir::ValueId> outs;
      for (int j = 1 + (rng() % 5 == 0 ? rng() % 3 : 0); j > 0; --j) {
        outs.push_back(F32(g, name + "_" + std::to_string(j), 1 + rng() % 200));
      }
      g.AddNode(outs.size() > 1 ? ir::OpKind::kSplit : ir::OpKind::kSum, name, ins, outs);
      for (ir::ValueId o : outs) avail.push_back(o);
    }
    for (int j = rng() % 3; j >= 0; --j) {
      const ir::ValueId o = avail[rng() % avail.size()];
      if (!g.IsGraphOutput(o)) g.outputs().push_back(o);
    }
    absl::StatusOr<MemoryPlan> p = PlanMemory(g, g.LiveNodes());
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectLiveValuesDisjoint(g, *p, trial);
    // With a split: the buffers live across it packed below split_bytes (their aligned sizes sum to
    // it exactly), every other buffer above it, and still no live overlap.
    MemoryPlanOptions split;
    split.split_position = static_cast<int32_t>(rng() % g.LiveNodes().size());
    absl::StatusOr<MemoryPlan> ps = PlanMemory(g, g.LiveNodes(), split);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ExpectLiveValuesDisjoint(g, *ps, trial);
    int64_t crossing = 0;
    for (ir::ValueId v = 0; v < g.num_values(); ++v) {
      const ValueMemory& m = ps->values[v];
      if (m.buffer != v || m.bytes == 0) continue;
      const bool crosses = m.live_begin < split.split_position && m.live_end >= split.split_position;
      // Liveness does not depend on the split.
      EXPECT_EQ(m.live_begin, p->values[v].live_begin);
      EXPECT_EQ(m.live_end, p->values[v].live_end);
      if (crosses) {
        crossing += (m.bytes + 63) / 64 * 64;
        EXPECT_LE(m.offset + m.bytes, ps->split_bytes) << "trial " << trial << " '" << g.value(v).name << "'";
      } else {
        EXPECT_GE(m.offset, ps->split_bytes) << "trial " << trial << " '" << g.value(v).name << "'";
      }
    }
    EXPECT_EQ(ps->split_bytes, crossing) << "trial " << trial;
    // Liveness independently: a value is live from its producer to its last reader.
    const std::vector<ir::NodeId> order = g.LiveNodes();
    for (size_t t = 0; t < order.size(); ++t) {
      for (ir::ValueId v : g.node(order[t]).inputs) {
        const ValueMemory& m = p->values[v];
        EXPECT_LE(m.live_begin, static_cast<int32_t>(t));
        EXPECT_GE(m.live_end, static_cast<int32_t>(t));
      }
    }
  }
}

}  // namespace
}  // namespace onnxpipe::partitioner
