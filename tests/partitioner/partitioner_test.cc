// The partitioner on small synthetic training graphs (an MLP chain built with autodiff):
// optimality against brute force over every contiguous assignment, memory numbers against the
// static memory planner and against hand-computed sizes, recompute, plan.json, and bad input.
#include <algorithm>
#include <functional>
#include <limits>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/calibrate.h"
#include "partitioner/memory_planner.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"
#include "tests/partitioner/test_graphs.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;
using testing::BuildChain;
using testing::ChainSpec;
using testing::FakeDevice;
using testing::RandomTimes;

constexpr double kInf = std::numeric_limits<double>::infinity();

// The program of stage `s` of a plan, built again from the plan's positions (no recompute).
absl::StatusOr<StageProgram> ProgramOf(const GraphAnalysis& a, const PartitionPlan& plan, int32_t s) {
  std::vector<int32_t> bounds = {0};
  for (const StagePlan& st : plan.stages) bounds.push_back(st.position_end);
  const std::vector<bool> none(a.graph->num_node_slots(), false);
  return BuildStageProgram(a, PlaceStages(a, bounds, none), s);
}

std::vector<ir::NodeId> RunOrder(const StageProgram& sp) {
  std::vector<ir::NodeId> order = sp.forward;
  order.insert(order.end(), sp.backward.begin(), sp.backward.end());
  order.insert(order.end(), sp.post.begin(), sp.post.end());
  return order;
}

std::unique_ptr<PartitionContext> Context(const ir::Graph& g, int64_t memory, std::shared_ptr<const OpTimes> times,
                                          int64_t microbatch, double cut_slack = 1e9) {
  absl::StatusOr<std::unique_ptr<PartitionContext>> ctx =
      PartitionContext::Create(g, Cluster{FakeDevice(memory)}, Precision::kFP32, times, microbatch, cut_slack);
  EXPECT_TRUE(ctx.ok()) << ctx.status();
  return std::move(*ctx);
}

// Every way to cut U units into K non-empty contiguous ranges.
void ForEachAssignment(int32_t U, int32_t K, const std::function<void(const StageAssignment&)>& fn) {
  std::vector<int32_t> cuts;
  std::function<void(int32_t, int32_t)> rec = [&](int32_t start, int32_t left) {
    if (left == 1) {
      StageAssignment a;
      int32_t prev = 0;
      for (int32_t c : cuts) {
        a.ranges.push_back({prev, c});
        prev = c;
      }
      a.ranges.push_back({prev, U});
      fn(a);
      return;
    }
    for (int32_t c = start + 1; c <= U - (left - 1); ++c) {
      cuts.push_back(c);
      rec(c, left - 1);
      cuts.pop_back();
    }
  };
  rec(0, K);
}

struct Brute {
  double best_analytic = kInf, best_sim = kInf;
  int fits = 0, total = 0;
  int64_t min_peak = std::numeric_limits<int64_t>::max();
};

Brute BruteForce(const PartitionContext& ctx, const PartitionOptions& o) {
  Brute b;
  ForEachAssignment(ctx.analysis().num_units(), static_cast<int32_t>(o.num_stages), [&](const StageAssignment& a) {
    bool fits = false;
    absl::StatusOr<PartitionPlan> p = PlanAssignment(ctx, o, a, &fits);
    ASSERT_TRUE(p.ok()) << p.status();
    ++b.total;
    int64_t peak = 0;
    for (const StagePlan& s : p->stages) peak = std::max(peak, s.memory.total);
    b.min_peak = std::min(b.min_peak, peak);
    if (!fits) return;
    ++b.fits;
    b.best_analytic = std::min(b.best_analytic, p->analytic_step_ms);
    b.best_sim = std::min(b.best_sim, p->step_ms);
  });
  return b;
}

TEST(Analysis, ChainPositionsAndCuts) {
  ChainSpec spec;
  spec.widths = {16, 32, 8, 32};
  const ir::Graph g = BuildChain(spec);
  absl::StatusOr<GraphAnalysis> a = AnalyzeTrainingGraph(g, {});
  ASSERT_TRUE(a.ok()) << a.status();
  // Forward: 3 x (Linear, Relu) + head Linear + the loss = 8 positions.
  EXPECT_EQ(a->num_positions(), 8);
  // Every backward and optimizer node has a position but the global ones: the SumScalars of the
  // per-gradient sums of squares and the norm's Sqrt. Each gradient's SumSquares sits with its parameter.
  for (ir::NodeId id : a->order) {
    if (a->position[id] < 0) {
      EXPECT_EQ(g.node(id).phase, ir::Phase::kOptimizer);
      EXPECT_TRUE(g.node(id).origin.empty()) << g.node(id).name;
    }
    if (g.node(id).op == ir::OpKind::kSumSquares) {
      EXPECT_GE(a->position[id], 0) << g.node(id).name;
    }
  }
  ASSERT_EQ(a->global_nodes.size(), 2u);
  EXPECT_EQ(g.node(a->global_nodes[0]).op, ir::OpKind::kSumScalars);
  // A parameter's update sits with its forward consumer.
  for (ir::NodeId id : a->order) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::OpKind::kSGDUpdate) continue;
    const ir::ValueId p = n.inputs[0];
    EXPECT_EQ(a->position[id], a->param_owner[p]) << n.name;
  }
  // Between layer 1 and layer 2 (after the Relu of width 8): one (4, 8) f32 tensor each way.
  const int32_t cut = 4;  // positions 0-3: layers 0 and 1
  EXPECT_EQ(g.node(a->forward[cut]).name, "/layers.2/Linear");
  EXPECT_EQ(a->cross_fwd_bytes[cut], 4 * 8 * 4);
  EXPECT_EQ(a->cross_bwd_bytes[cut], 4 * 8 * 4);
  // The default slack keeps only the narrowest cuts: after layer 1's Linear and Relu (width 8).
  absl::StatusOr<GraphAnalysis> narrow = AnalyzeTrainingGraph(g, AnalysisOptions{0.05});
  ASSERT_TRUE(narrow.ok());
  for (int32_t c : narrow->cut_candidates) {
    EXPECT_LE(narrow->cross_fwd_bytes[c] + narrow->cross_bwd_bytes[c], 2 * 4 * 8 * 4 * 1.05) << c;
  }
  EXPECT_THAT(narrow->cut_candidates, ::testing::Contains(cut));
}

TEST(Analysis, LayerKeys) {
  EXPECT_EQ(LayerKey("/encoder/layers.3/self_attn"), "/encoder/layers.3");
  EXPECT_EQ(LayerKey("/h_11/mlp"), "/h_11");
  EXPECT_EQ(LayerKey("/emb"), "/emb");
  EXPECT_EQ(LayerKey("loss"), "loss");
  EXPECT_EQ(LayerKey("blocks.2/attn"), "blocks.2");
  EXPECT_EQ(LayerKey(""), "(top)");
}

TEST(Analysis, LayersFromParametersWhenNodesHaveNoScope) {
  ChainSpec spec;
  spec.widths = {16, 16, 16};
  spec.expand = 2;
  ir::Graph g = BuildChain(spec);
  for (ir::NodeId id : g.LiveNodes()) g.node(id).scope.clear();
  absl::StatusOr<GraphAnalysis> a = AnalyzeTrainingGraph(g, {});
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<std::string> want = {"/layers.0", "/layers.0", "/layers.0", "/layers.1", "/layers.1", "/layers.1",
                                   "/head", "(top) loss/SoftmaxCrossEntropyLoss"};  // per layer: Linear, Relu, Linear.out
  EXPECT_EQ(a->layer_of_position, want);
}

TEST(Search, OptimalAgainstBruteForce) {
  // Random widths and random per-node times; every contiguous assignment is planned (phases 4-6
  // with the memory planner) and the best that fits is compared with the search's plan.
  std::mt19937_64 rng(7);
  int cases = 0, constrained = 0, gaps = 0;
  double worst_gap = 0;
  for (int trial = 0; trial < 12; ++trial) {
    ChainSpec spec;
    spec.batch = 8;
    spec.widths.clear();
    const int layers = 3 + trial % 3;
    for (int i = 0; i <= layers; ++i) spec.widths.push_back(8 + 8 * static_cast<int64_t>(rng() % 8));
    spec.optimizer = trial % 2 ? autodiff::OptimizerKind::kAdamW : autodiff::OptimizerKind::kSGD;
    const ir::Graph g = BuildChain(spec);
    auto times = std::make_shared<OpTimes>(RandomTimes(g, spec.batch, 100 + trial));
    for (int32_t K : {2, 3}) {
      for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
        PartitionOptions o;
        o.num_stages = K;
        o.batch = spec.batch * 4;
        o.microbatches = 4;
        o.schedule = kind;
        // First without a memory limit, then with one between the smallest and largest peaks.
        auto loose = Context(g, int64_t{1} << 40, times, spec.batch);
        const Brute all = BruteForce(*loose, o);
        ASSERT_GT(all.fits, 0);
        for (int64_t budget : {int64_t{1} << 40, all.min_peak + all.min_peak / 8}) {
          auto ctx = Context(g, budget, times, spec.batch);
          const Brute brute = budget == (int64_t{1} << 40) ? all : BruteForce(*ctx, o);
          absl::StatusOr<PartitionPlan> plan = Partition(*ctx, o);
          ++cases;
          if (brute.fits == 0) {
            EXPECT_FALSE(plan.ok());
            continue;
          }
          if (brute.fits < brute.total) ++constrained;
          ASSERT_TRUE(plan.ok()) << plan.status();
          // Exact for the search objective; the simulated pick is the best of the Pareto plans.
          EXPECT_NEAR(plan->search.best_objective_ms, brute.best_analytic, 1e-9 * brute.best_analytic)
              << "trial " << trial << " K " << K << " " << ScheduleName(kind) << " budget " << budget;
          const double gap = plan->step_ms / brute.best_sim - 1;
          worst_gap = std::max(worst_gap, gap);
          if (gap > 1e-9) ++gaps;

          for (const StagePlan& s : plan->stages) EXPECT_LE(s.memory.total, budget);
        }
      }
    }
  }
  EXPECT_GT(constrained, 4);  // the memory limit did bind in several cases
  // The simulated step is not the search objective (for 1F1B with stages whose backward is not a
  // fixed multiple of their forward there is no closed form): the Pareto plans and the cut
  // refinement find the simulated optimum in almost every case, and come close in the rest.
  std::printf("simulated step above the brute-force best in %d of %d cases, worst by %.2f%%\n", gaps, cases,
              100 * worst_gap);
  EXPECT_LE(gaps, cases / 10);
  EXPECT_LT(worst_gap, 0.10);
  EXPECT_EQ(cases, 12 * 2 * 2 * 2);
}

TEST(Search, ProportionalCostsAreExactForTheSimulatedStep) {
  // With every stage's backward twice its forward, the objective is the simulated makespan, so the
  // search's plan has the smallest simulated step of all assignments.
  ChainSpec spec;
  spec.widths = {16, 16, 16, 16, 16, 16, 16};
  const ir::Graph g = BuildChain(spec);
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto times = std::make_shared<OpTimes>(RandomTimes(g, spec.batch, seed, /*backward_ratio=*/2.0));
    auto ctx = Context(g, int64_t{1} << 40, times, spec.batch);
    for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
      PartitionOptions o;
      o.num_stages = 3;
      o.batch = spec.batch * 6;
      o.microbatches = 6;
      o.schedule = kind;
      const Brute brute = BruteForce(*ctx, o);
      absl::StatusOr<PartitionPlan> plan = Partition(*ctx, o);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_NEAR(plan->step_ms, brute.best_sim, 1e-6 * brute.best_sim) << ScheduleName(kind) << " seed " << seed;
    }
  }
}

TEST(Memory, EqualsThePlannerAndHandSizes) {
  ChainSpec spec;
  spec.batch = 4;
  spec.widths = {16, 32, 32, 16};
  spec.classes = 4;
  spec.optimizer = autodiff::OptimizerKind::kAdamW;
  const ir::Graph g = BuildChain(spec);
  auto ctx = Context(g, int64_t{1} << 40, nullptr, spec.batch, /*cut_slack=*/0.05);
  PartitionOptions o;
  o.num_stages = 2;
  o.batch = 16;
  o.microbatches = 4;
  absl::StatusOr<PartitionPlan> plan = Partition(*ctx, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const GraphAnalysis& a = ctx->analysis();
  int64_t all_params = 0;
  for (const StagePlan& s : plan->stages) {
    // The planner on the stage's program, directly.
    absl::StatusOr<StageProgram> sp = ProgramOf(a, *plan, s.index);
    ASSERT_TRUE(sp.ok()) << sp.status();
    absl::StatusOr<MemoryPlan> mp = PlanMemory(sp->graph, RunOrder(*sp));
    ASSERT_TRUE(mp.ok()) << mp.status();
    EXPECT_EQ(s.memory.parameters, mp->parameter_bytes);
    EXPECT_EQ(s.memory.gradients, mp->gradient_bytes);
    EXPECT_EQ(s.memory.optimizer_state, mp->optimizer_state_bytes);
    EXPECT_EQ(s.memory.constants, mp->constant_bytes);
    // The micro-batch memory is the executor's layout (checked against runs in tests/pipeline):
    // in-flight saved slots plus the transient part.
    EXPECT_EQ(s.memory.activations, s.memory.saved * s.memory.in_flight);
    EXPECT_EQ(s.memory.activations + s.memory.transient, s.memory.arena);
    EXPECT_GT(s.memory.saved, 0);
    EXPECT_EQ(s.memory.in_flight, InFlightMicrobatches(ScheduleKind::k1F1B, 2, s.index, 4));
    // By hand: each owned Linear (k, n) has k*n + n floats; AdamW keeps two more copies.
    int64_t params = 0;
    for (const std::string& name : s.parameters) {
      const ir::Value& v = g.value(g.FindValue(name));
      params += (ir::NumElements(v.shape).value() * 4 + 63) / 64 * 64;
    }
    EXPECT_EQ(s.memory.parameters, params);
    EXPECT_EQ(s.memory.gradients, params);
    EXPECT_EQ(s.memory.optimizer_state, 2 * params);
    all_params += params;
  }
  // 16*32+32, 32*32+32, 32*16+16, 16*4+4 floats, each rounded up to 64 bytes.
  const int64_t want = ((544 * 4 + 63) / 64 + (1056 * 4 + 63) / 64 + (528 * 4 + 63) / 64 + (68 * 4 + 63) / 64) * 64;
  EXPECT_EQ(all_params, want);
}

// A parameter read on several stages (a tied embedding and output projection) is held Megatron
// style on each: parameter, gradient and optimizer state on every stage that reads it, its
// contributions accumulated on their own stage and sent to the other holder once per step (one
// receive buffer), never per micro-batch. Every 3-stage assignment of a chain whose head reuses
// layer 0's weight.
TEST(Memory, SharedParameterIsHeldOnEveryStageThatReadsIt) {
  ChainSpec spec;
  spec.batch = 4;
  spec.widths = {16, 8, 8, 8, 16};
  spec.classes = 8;
  spec.tie_head = true;
  spec.momentum = 0.9;
  const ir::Graph g = BuildChain(spec);
  auto ctx = Context(g, int64_t{1} << 40, nullptr, spec.batch);
  const GraphAnalysis& a = ctx->analysis();
  const ir::ValueId tied = g.FindValue("layers.0.weight");
  ASSERT_NE(tied, ir::kNoValue);
  const int64_t tied_bytes = 16 * 8 * 4;  // a multiple of 64: no alignment padding
  PartitionOptions o;
  o.num_stages = 3;
  o.batch = 8;
  o.microbatches = 2;
  int checked = 0;
  ForEachAssignment(a.num_units(), 3, [&](const StageAssignment& asg) {
    bool fits = false;
    absl::StatusOr<PartitionPlan> p = PlanAssignment(*ctx, o, asg, &fits);
    ASSERT_TRUE(p.ok()) << p.status();
    std::vector<int32_t> readers;  // stages whose forward reads the tied weight
    for (const StagePlan& s : p->stages) {
      for (const std::string& n : s.forward_nodes)
        if (n == "/layers.0/Linear" || n == "/head/Linear") readers.push_back(s.index);
    }
    ASSERT_EQ(readers.size(), 2u);
    for (const StagePlan& s : p->stages) {
      const bool holds = std::count(readers.begin(), readers.end(), s.index) > 0;
      const bool shared = readers.front() != readers.back();
      EXPECT_EQ(std::count(s.parameters.begin(), s.parameters.end(), "layers.0.weight"), holds ? 1 : 0);
      int64_t params = 0;
      for (const std::string& name : s.parameters) {
        params += (ir::NumElements(g.value(g.FindValue(name)).shape).value() * 4 + 63) / 64 * 64;
      }
      EXPECT_EQ(s.memory.parameters, params) << s.index;
      EXPECT_EQ(s.memory.gradients, params) << s.index;
      EXPECT_EQ(s.memory.optimizer_state, params) << s.index;  // one momentum buffer each
      int shared_gradients = 0;
      for (const BoundaryTensor& b : s.boundary_inputs) {
        if (b.kind != "shared_gradient") continue;
        ++shared_gradients;
        EXPECT_EQ(a.contribution_param[g.FindValue(b.name)], tied) << b.name;  // a contribution of the tied weight
        EXPECT_EQ(b.bytes, tied_bytes);
        const int32_t peer = s.index == readers.front() ? readers.back() : readers.front();
        EXPECT_EQ(b.peers, std::vector<int32_t>{peer});
      }
      EXPECT_EQ(shared_gradients, holds && shared ? 1 : 0) << s.index;
      // Boundary memory: a buffer per value sent per micro-batch and per shared contribution
      // received; values received per micro-batch live in the arena's slots, not counted twice.
      int64_t boundary = 0;
      for (const BoundaryTensor& b : s.boundary_outputs)
        if (b.kind == "activation" || b.kind == "gradient") boundary += (b.bytes + 63) / 64 * 64;
      for (const BoundaryTensor& b : s.boundary_inputs)
        if (b.kind == "shared_gradient") boundary += (b.bytes + 63) / 64 * 64;
      EXPECT_EQ(s.memory.boundary, boundary) << s.index;
      // Between stages only (B, w) activations and their gradients travel per micro-batch.
      for (const auto* list : {&s.boundary_inputs, &s.boundary_outputs}) {
        for (const BoundaryTensor& b : *list) {
          if (b.kind == "activation" || b.kind == "gradient") {
            EXPECT_EQ(b.dims.front(), spec.batch) << b.name;
          }
        }
      }
      // The stage's program: the planner agrees; the accumulation Sum runs once per step on every
      // holder, over its own contributions and those received once per step (never per micro-batch).
      absl::StatusOr<StageProgram> sp = ProgramOf(a, *p, s.index);
      ASSERT_TRUE(sp.ok()) << sp.status();
      absl::StatusOr<MemoryPlan> mp = PlanMemory(sp->graph, RunOrder(*sp));
      ASSERT_TRUE(mp.ok()) << mp.status();
      EXPECT_EQ(s.memory.parameters, mp->parameter_bytes);
      EXPECT_EQ(s.memory.gradients, mp->gradient_bytes);
      EXPECT_EQ(s.memory.optimizer_state, mp->optimizer_state_bytes);
      const std::vector<ir::NodeId> order = RunOrder(*sp);
      std::set<ir::NodeId> here(order.begin(), order.end());
      std::set<ir::ValueId> once_per_step;
      for (const auto& [peer, vs] : sp->recv_post) once_per_step.insert(vs.begin(), vs.end());
      // Once per step only the tied weight's contributions and scalars travel: each stage sums its own
      // gradients' squares, the coordinator adds the scalars, and the norm (clip scale) goes back.
      for (ir::ValueId v : once_per_step) {
        if (a.contribution_param[v] == ir::kNoValue) {
          EXPECT_TRUE(sp->graph.value(v).shape.empty()) << g.value(v).name;
        }
      }
      int sums = 0;
      for (ir::NodeId id : sp->post) {
        if (sp->graph.node(id).op != ir::OpKind::kSum || a.tail_param[id] != tied) continue;
        ++sums;
        for (ir::ValueId v : sp->graph.node(id).inputs) {
          EXPECT_TRUE(here.count(g.value(v).producer) || once_per_step.count(v)) << s.index;
        }
      }
      EXPECT_EQ(sums, holds ? 1 : 0) << s.index;
      for (const auto* l : {&sp->recv_forward, &sp->recv_backward})
        for (const auto& [peer, vs] : *l)
          for (ir::ValueId v : vs) EXPECT_EQ(a.contribution_param[v], ir::kNoValue) << g.value(v).name;
    }
    ++checked;
  });
  EXPECT_GT(checked, 10);
}

// Calibration recovers a device from times it produced: every node timed by a known roofline
// (GEMM 20 GFLOP/s, other ops 2 GFLOP/s, 3 GB/s, 5 us per kernel), the fitted profile predicts the
// same total and close peaks; memory and links stay the base's.
TEST(Calibrate, RecoversTheDeviceThatProducedTheTimes) {
  ChainSpec spec;
  spec.batch = 16;
  spec.widths = {64, 64, 64, 64, 64};
  spec.expand = 4;
  spec.activation = ir::OpKind::kGelu;
  const ir::Graph g = BuildChain(spec);
  DeviceProfile truth = FakeDevice(1 << 30);
  truth.gemm_flops_fp32 = truth.gemm_flops_bf16 = 20e9;
  truth.vector_flops = 2e9;
  truth.memory_bandwidth = 3e9;
  truth.op_overhead_s = 5e-6;
  std::vector<double> seconds(g.num_node_slots(), 0.0);
  double total = 0;
  for (ir::NodeId id : g.LiveNodes()) {
    seconds[id] = RooflineSeconds(EstimateOpCost(g, g.node(id)), truth, Precision::kFP32);
    total += seconds[id];
  }
  const DeviceProfile base = FakeDevice(int64_t{7} << 30);
  const Calibration c = CalibrateDevice(g, seconds, base);
  EXPECT_GT(c.gemm_nodes, 0);
  EXPECT_GT(c.memory_nodes, 0);
  EXPECT_DOUBLE_EQ(c.measured_s, total);
  EXPECT_NEAR(c.predicted_s, total, 0.05 * total);
  EXPECT_NEAR(c.device.gemm_flops_fp32, 20e9, 0.15 * 20e9);
  EXPECT_NEAR(c.device.memory_bandwidth, 3e9, 0.25 * 3e9);
  EXPECT_NEAR(c.device.op_overhead_s, 5e-6, 5e-6);
  EXPECT_EQ(c.device.compute_efficiency, 1.0);
  EXPECT_EQ(c.device.memory_bytes, base.memory_bytes);
  EXPECT_EQ(c.device.link_bandwidth, base.link_bandwidth);
}

TEST(Recompute, PoliciesTradeMemoryForTime) {
  ChainSpec spec;
  spec.batch = 32;
  spec.widths = {64, 64, 64, 64, 64, 64};
  spec.expand = 4;  // cuts between blocks; each block's activation is cheap and inside its unit
  // GeluGrad reads Gelu's input, which is kept anyway: recomputing Gelu drops its output.
  spec.activation = ir::OpKind::kGelu;
  const ir::Graph g = BuildChain(spec);
  auto ctx = Context(g, int64_t{1} << 40, nullptr, spec.batch, /*cut_slack=*/0.05);
  std::map<RecomputePolicy, PartitionPlan> plans;
  for (RecomputePolicy p : {RecomputePolicy::kNone, RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    PartitionOptions o;
    o.num_stages = 2;
    o.batch = 128;
    o.microbatches = 4;
    o.schedule = ScheduleKind::kGPipe;
    o.recompute = p;
    absl::StatusOr<PartitionPlan> plan = Partition(*ctx, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plans[p] = *plan;
  }
  for (int k = 0; k < 2; ++k) {
    const StagePlan& none = plans[RecomputePolicy::kNone].stages[k];
    const StagePlan& sel = plans[RecomputePolicy::kSelective].stages[k];
    const StagePlan& full = plans[RecomputePolicy::kFull].stages[k];
    EXPECT_EQ(none.recompute_ms, 0);
    EXPECT_TRUE(none.recompute_regions.empty());
    // Selective drops the Gelu outputs but keeps the Linear outputs.
    EXPECT_LT(sel.memory.saved, none.memory.saved) << k;
    EXPECT_GT(sel.recompute_ms, 0) << k;
    for (const RegionPlan& r : sel.recompute_regions)
      for (const std::string& n : r.nodes) EXPECT_THAT(n, HasSubstr("Gelu"));
    // Full keeps the stage input only; one region per stage.
    EXPECT_LT(full.memory.saved, sel.memory.saved) << k;
    EXPECT_GE(full.recompute_ms, sel.recompute_ms) << k;
    EXPECT_EQ(full.recompute_regions.size(), 1u);
  }
  // Full recompute on stage 1 keeps its input (32 x 64 f32) and the labels (32 i64) for the
  // recompute, and the loss node's outputs, which are not recomputed (the loss is a graph output):
  // its Stats (32 x 2 f32; the logits its gradient reads are recomputed) and the scalar loss (one
  // 64-byte slot).
  EXPECT_EQ(plans[RecomputePolicy::kFull].stages[1].memory.saved, 32 * 64 * 4 + 32 * 8 + 32 * 2 * 4 + 64);
  // Each Gelu region runs just before the first backward node reading its output: the gradient
  // of the block's second Linear.
  for (const RegionPlan& r : plans[RecomputePolicy::kSelective].stages[0].recompute_regions) {
    EXPECT_THAT(r.before, HasSubstr(".out/Linear_grad"));
  }
}

TEST(Recompute, AutoFitsWhereNoneDoesNot) {
  ChainSpec spec;
  spec.batch = 64;
  spec.widths = {128, 128, 128, 128, 128, 128, 128};
  const ir::Graph g = BuildChain(spec);
  PartitionOptions o;
  o.num_stages = 2;
  o.batch = 512;
  o.microbatches = 8;
  o.schedule = ScheduleKind::kGPipe;
  auto loose = Context(g, int64_t{1} << 40, nullptr, spec.batch, 0.05);
  o.recompute = RecomputePolicy::kNone;
  const PartitionPlan none = *Partition(*loose, o);
  o.recompute = RecomputePolicy::kFull;
  const PartitionPlan full = *Partition(*loose, o);
  int64_t none_peak = 0, full_peak = 0;
  for (const StagePlan& s : none.stages) none_peak = std::max(none_peak, s.memory.total);
  for (const StagePlan& s : full.stages) full_peak = std::max(full_peak, s.memory.total);
  ASSERT_LT(full_peak, none_peak);
  const int64_t budget = (none_peak + full_peak) / 2;
  auto tight = Context(g, budget, nullptr, spec.batch, 0.05);
  o.recompute = RecomputePolicy::kNone;
  absl::Status st = Partition(*tight, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("--recompute auto"));
  o.recompute = RecomputePolicy::kAuto;
  absl::StatusOr<PartitionPlan> autoplan = Partition(*tight, o);
  ASSERT_TRUE(autoplan.ok()) << autoplan.status();
  double auto_rec = 0;
  for (const StagePlan& s : autoplan->stages) {
    EXPECT_LE(s.memory.total, budget);
    auto_rec += s.recompute_ms;
  }
  double full_rec = 0;
  for (const StagePlan& s : full.stages) full_rec += s.recompute_ms;
  EXPECT_GT(auto_rec, 0);
  EXPECT_LE(auto_rec, full_rec);
}

TEST(Memory, Bf16TrainingGraphHalvesActivations) {
  std::map<Precision, PartitionPlan> plans;
  for (Precision p : {Precision::kFP32, Precision::kBF16}) {
    ChainSpec spec;
    spec.batch = 16;
    spec.widths = {64, 64, 64, 64};
    spec.dtype = p == Precision::kBF16 ? ir::DType::kBF16 : ir::DType::kF32;
    const ir::Graph g = BuildChain(spec);
    absl::StatusOr<std::unique_ptr<PartitionContext>> ctx =
        PartitionContext::Create(g, Cluster{FakeDevice(int64_t{1} << 40)}, p, nullptr, spec.batch, 0.05);
    ASSERT_TRUE(ctx.ok());
    PartitionOptions o;
    o.num_stages = 1;
    o.batch = 32;
    o.microbatches = 2;
    o.precision = p;
    absl::StatusOr<PartitionPlan> plan = Partition(**ctx, o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plans[p] = *plan;
  }
  const StageMemory& f = plans[Precision::kFP32].stages[0].memory;
  const StageMemory& b = plans[Precision::kBF16].stages[0].memory;
  // By hand, per micro-batch of 16 rows. Saved across the forward/backward boundary: the inputs of
  // the three hidden Linears' and the head's dW, x and the Relu outputs r0..r2 (4 of 16 x 64, which
  // the Relu gradients read too), the logits the loss gradient reads (16 x 4, in the run's dtype) and
  // the loss's Stats (16 x 2, f32 in both: the loss computes in f32), the labels (16 i64) and the loss
  // slot (one aligned 64-byte buffer).
  const int64_t activations_f32 = 4 * 16 * 64 * 4, stats = 16 * 2 * 4, labels = 16 * 8, loss = 64;
  const int64_t logits_f32 = 16 * 4 * 4, logits_bf16 = 16 * 4 * 2;
  EXPECT_EQ(f.saved, activations_f32 + logits_f32 + stats + labels + loss);
  // bf16: the activations at 2 bytes (the Cast of x included). The weights' bf16 copies are not saved per
  // micro-batch: they are the parameters' compute copies, optimizer state the updates write.
  const int64_t activations_bf16 = 4 * 16 * 64 * 2;
  EXPECT_EQ(activations_bf16 * 2, activations_f32);
  EXPECT_EQ(b.saved, activations_bf16 + logits_bf16 + stats + labels + loss);
  // fp32 masters and gradients: as the fp32 run's, 3 x (64x64 + 64) + 64x4 + 4 floats, each buffer 64-byte
  // aligned (the head's 16-byte bias takes 64). The optimizer state adds the compute copies: the same tensors in
  // bf16, 64-byte aligned (each 64-element bias 128 bytes, the head's 8-byte bias 64).
  const int64_t params = 3 * (64 * 64 + 64) * 4 + 64 * 4 * 4 + 64;
  const int64_t copies = 3 * (64 * 64 + 64) * 2 + 64 * 4 * 2 + 64;
  EXPECT_EQ(f.parameters, params);
  EXPECT_EQ(b.parameters, params);
  EXPECT_EQ(b.gradients, f.gradients);
  EXPECT_EQ(b.optimizer_state, f.optimizer_state + copies);
}

TEST(Plan, JsonRoundTripAndValidation) {
  ChainSpec spec;
  const ir::Graph g = BuildChain(spec);
  auto ctx = Context(g, int64_t{1} << 40, nullptr, spec.batch, 0.05);
  PartitionOptions o;
  o.num_stages = 2;
  o.batch = 8;
  o.microbatches = 2;
  o.recompute = RecomputePolicy::kSelective;
  absl::StatusOr<PartitionPlan> plan = Partition(*ctx, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const nlohmann::json j = nlohmann::json::parse(PlanToJson(*plan).dump());
  absl::StatusOr<PartitionPlan> back = PlanFromJson(j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->stages.size(), plan->stages.size());
  for (size_t k = 0; k < back->stages.size(); ++k) {
    EXPECT_EQ(back->stages[k].forward_nodes, plan->stages[k].forward_nodes);
    EXPECT_EQ(back->stages[k].memory.total, plan->stages[k].memory.total);
    EXPECT_EQ(back->stages[k].recompute_regions.size(), plan->stages[k].recompute_regions.size());
  }
  EXPECT_DOUBLE_EQ(back->step_ms, plan->step_ms);
  for (size_t k = 0; k < back->stages.size(); ++k) EXPECT_EQ(back->stages[k].actions, plan->stages[k].actions);
  EXPECT_TRUE(CompilePlan(g, *back).ok()) << CompilePlan(g, *back).status();
  // A graph of another shape does not match.
  ChainSpec other = spec;
  other.widths.push_back(16);
  EXPECT_FALSE(CompilePlan(BuildChain(other), *back).ok());

  auto broken = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json c = j;
    edit(c);
    return PlanFromJson(c, "plan.json").status();
  };
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["schema_version"] = 4; }).message()),
              HasSubstr("schema_version"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["schema_version"] = 2; }).message()),
              HasSubstr("no kernel scratch"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["config"].erase("kernel_scratch_counted"); }).message()),
              HasSubstr("config.kernel_scratch_counted"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["schema_version"] = 1; }).message()),
              HasSubstr("re-run onnxpipe partition"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["stages"][0]["actions"][0] = "F"; }).message()),
              HasSubstr("stages[0].actions[0]"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["stages"][0].erase("memory"); }).message()),
              HasSubstr("stages[0].memory"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["stages"][1]["memory"]["total"] = 1; }).message()),
              HasSubstr("sum of its parts"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) {
                            c["stages"][1]["nodes"]["forward"].push_back(c["stages"][0]["nodes"]["forward"][0]);
                          }).message()),
              HasSubstr("two stages"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["stages"][1]["units"][0] = 0; }).message()),
              HasSubstr("contiguously"));
  EXPECT_THAT(std::string(broken([](nlohmann::json& c) { c["config"]["num_stages"] = 3; }).message()),
              HasSubstr("num_stages"));
}

TEST(Errors, BadOptionsAndPlansThatCannotFit) {
  ChainSpec spec;
  spec.batch = 8;
  const ir::Graph g = BuildChain(spec);
  auto ctx = Context(g, int64_t{1} << 40, nullptr, spec.batch, 0.05);
  PartitionOptions o;
  o.batch = 32;
  o.microbatches = 4;
  o.num_stages = ctx->analysis().num_units() + 1;
  EXPECT_THAT(std::string(Partition(*ctx, o).status().message()), HasSubstr("cut candidates"));
  o.num_stages = 2;
  o.microbatches = 64;
  EXPECT_THAT(std::string(Partition(*ctx, o).status().message()), HasSubstr("larger than --batch"));
  o.microbatches = 5;
  EXPECT_THAT(std::string(Partition(*ctx, o).status().message()), HasSubstr("not divisible"));
  // Too little memory for one stage, enough for more (GPipe: every stage holds all micro-batches).
  o.microbatches = 4;
  o.schedule = ScheduleKind::kGPipe;
  auto loose = Context(g, int64_t{1} << 40, nullptr, spec.batch, 1e9);
  o.num_stages = 4;
  absl::StatusOr<PartitionPlan> four = Partition(*loose, o);
  ASSERT_TRUE(four.ok());
  int64_t peak4 = 0;
  for (const StagePlan& s : four->stages) peak4 = std::max(peak4, s.memory.total);
  auto tight = Context(g, peak4, nullptr, spec.batch, 1e9);
  o.num_stages = 1;
  absl::Status st = Partition(*tight, o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("does not fit"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("It would fit on devices with"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("--stages"));
  // The numbers it names, against brute force over every assignment: the smallest peak memory of
  // a 1-stage and of a 2-stage plan, and the fewest stages with an assignment that fits.
  for (int64_t K : {1, 2}) {
    o.num_stages = K;
    const Brute brute = BruteForce(*tight, o);
    if (brute.fits > 0) continue;
    const std::string message(Partition(*tight, o).status().message());
    EXPECT_THAT(message, HasSubstr("It would fit on devices with " + FormatBytes(brute.min_peak) + " ")) << message;
  }
  int fewest = 0;
  for (int64_t K = 1; K <= 4 && fewest == 0; ++K) {
    o.num_stages = K;
    if (BruteForce(*tight, o).fits > 0) fewest = static_cast<int>(K);
  }
  ASSERT_GT(fewest, 1);
  o.num_stages = 1;
  EXPECT_THAT(std::string(Partition(*tight, o).status().message()),
              HasSubstr("or with " + std::to_string(fewest) + " stages (--stages " + std::to_string(fewest) + ")"));
  // --stages auto finds the fewest that fit.
  o.num_stages = 0;
  absl::StatusOr<PartitionPlan> autok = Partition(*tight, o);
  ASSERT_TRUE(autok.ok()) << autok.status();
  EXPECT_LE(autok->num_stages, 4);
  EXPECT_GT(autok->num_stages, 1);
  EXPECT_TRUE(autok->stages_auto);
  EXPECT_EQ(autok->num_stages, fewest);
  // --stages auto --objective throughput: the stage count whose plan has the shortest simulated step.
  o.objective = Objective::kThroughput;
  o.max_stages = 4;
  absl::StatusOr<PartitionPlan> fastest = Partition(*loose, o);
  ASSERT_TRUE(fastest.ok()) << fastest.status();
  double best_ms = kInf;
  int64_t best_k = 0;
  for (int64_t K = 1; K <= 4; ++K) {
    PartitionOptions fixed = o;
    fixed.num_stages = K;
    fixed.objective = Objective::kFewestStages;
    absl::StatusOr<PartitionPlan> p = Partition(*loose, fixed);
    ASSERT_TRUE(p.ok()) << p.status();
    if (p->step_ms < best_ms) {
      best_ms = p->step_ms;
      best_k = K;
    }
  }
  EXPECT_EQ(fastest->num_stages, best_k);
  EXPECT_DOUBLE_EQ(fastest->step_ms, best_ms);
}

}  // namespace
}  // namespace onnxpipe::partitioner
