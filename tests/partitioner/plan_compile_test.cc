// plan.json executed as written (plan_io.h's CompilePlan): the partitioner's own plan compiles to
// the very programs and action lists it planned with, and every kind of hand edit that cannot run
// is refused with an error naming the node, the stage and what is wrong — never re-derived.
// The graph: a 4-layer MLP chain whose head reuses layer 0's weight (a tied parameter held on the
// first and the last stage), cut into 3 stages, 2 micro-batches, 1F1B, full recompute.
#include <algorithm>
#include <functional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"
#include "tests/partitioner/test_graphs.h"

namespace onnxpipe::partitioner {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using testing::BuildChain;
using testing::ChainSpec;
using testing::FakeDevice;

struct Fixture {
  ir::Graph g;
  PartitionPlan plan;
  json j;
  ir::NodeId Find(const std::string& name) const {
    for (ir::NodeId id : g.LiveNodes())
      if (g.node(id).name == name) return id;
    ADD_FAILURE() << "no node " << name;
    return ir::kNoNode;
  }
  const ir::Node& Node(const std::string& name) const { return g.node(Find(name)); }
};

const Fixture& TiedChain() {
  static const Fixture* f = [] {
    auto* x = new Fixture();
    ChainSpec spec;
    spec.batch = 4;
    spec.widths = {16, 8, 8, 4, 16};  // the last stage holds layers.3 and the head with the loss
    spec.classes = 8;
    spec.tie_head = true;
    spec.momentum = 0.9;
    x->g = BuildChain(spec);
    PartitionOptions o;
    o.num_stages = 3;
    o.batch = 8;
    o.microbatches = 2;
    o.recompute = RecomputePolicy::kFull;
    absl::StatusOr<PartitionPlan> plan = Partition(x->g, Cluster{FakeDevice(int64_t{1} << 40)}, o);
    EXPECT_TRUE(plan.ok()) << plan.status();
    x->plan = *plan;
    x->j = json::parse(PlanToJson(x->plan).dump());
    return x;
  }();
  return *f;
}

// The plan after `edit`, through plan.json's loader and CompilePlan.
absl::Status Compile(const std::function<void(json&)>& edit) {
  const Fixture& f = TiedChain();
  json c = f.j;
  edit(c);
  absl::StatusOr<PartitionPlan> p = PlanFromJson(c, "plan.json");
  if (!p.ok()) return p.status();
  return CompilePlan(f.g, *p).status();
}

// Moves the node named `name` out of whichever list of stage `from` holds it.
void Erase(json& stage, const std::string& list, const std::string& name) {
  json& l = stage["nodes"][list];
  for (size_t i = 0; i < l.size(); ++i) {
    if (l[i] == name) {
      l.erase(i);
      return;
    }
  }
  ADD_FAILURE() << name << " is not under " << list;
}

TEST(CompilePlan, ThePartitionersPlanCompilesToItsOwnProgramsAndActions) {
  const Fixture& f = TiedChain();
  absl::StatusOr<PartitionPlan> back = PlanFromJson(f.j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  absl::StatusOr<CompiledPlan> c = CompilePlan(f.g, *back);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->program.num_stages, 3);
  EXPECT_EQ(c->schedule, ScheduleKind::k1F1B);
  EXPECT_EQ(c->microbatches, 2);
  // The partitioner's programs, from its stage boundaries and recompute set.
  absl::StatusOr<GraphAnalysis> a = AnalyzeTrainingGraph(f.g, {});
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> bounds = {0};
  std::vector<bool> recompute(f.g.num_node_slots(), false);
  for (const StagePlan& s : f.plan.stages) {
    bounds.push_back(s.position_end);
    for (const RegionPlan& r : s.recompute_regions)
      for (const std::string& n : r.nodes) recompute[f.Find(n)] = true;
  }
  absl::StatusOr<PipelineProgram> direct = BuildPipelineProgram(*a, PlaceStages(*a, bounds, recompute));
  ASSERT_TRUE(direct.ok()) << direct.status();
  int clones = 0;
  for (int32_t k = 0; k < 3; ++k) {
    const StageProgram& x = c->program.stages[k];
    const StageProgram& y = direct->stages[k];
    EXPECT_EQ(x.forward, y.forward) << k;
    EXPECT_EQ(x.backward, y.backward) << k;
    EXPECT_EQ(x.post, y.post) << k;
    EXPECT_EQ(x.recv_post, y.recv_post) << k;
    EXPECT_EQ(x.accumulate, y.accumulate) << k;
    EXPECT_EQ(c->actions[k], f.plan.stages[k].actions) << k;
    clones += static_cast<int>(x.recompute_clones.size());
  }
  EXPECT_GT(clones, 0);
  // The tied weight's holders: the first and the last stage, each running its Sum and update.
  const ir::ValueId tied = f.g.FindValue("layers.0.weight");
  EXPECT_THAT(c->program.stages[0].shared_parameters, ::testing::Contains(tied));
  EXPECT_THAT(c->program.stages[2].shared_parameters, ::testing::Contains(tied));
  EXPECT_FALSE(f.plan.stages[2].replicated_nodes.empty());
}

// The tied weight's gradient Sum adds one contribution from each holder: it runs as an all-reduce
// over the holders, in the Sum's operand order (each operand's stage read off the plan's node
// lists), on the holders alone. CompilePlan proved the optimizer phase deadlock-free with it.
TEST(CompilePlan, TheTiedGradientSumIsAnAllReduceOverItsHolders) {
  const Fixture& f = TiedChain();
  absl::StatusOr<PartitionPlan> back = PlanFromJson(f.j, "plan.json");
  ASSERT_TRUE(back.ok()) << back.status();
  absl::StatusOr<CompiledPlan> c = CompilePlan(f.g, *back);
  ASSERT_TRUE(c.ok()) << c.status();
  auto stage_running = [&](ir::NodeId id) {
    for (const StagePlan& s : f.plan.stages)
      for (const std::vector<std::string>* l : {&s.forward_nodes, &s.backward_nodes})
        if (std::count(l->begin(), l->end(), f.g.node(id).name)) return s.index;
    return -1;
  };
  for (int32_t k : {0, 2}) {
    const std::map<ir::NodeId, std::vector<int32_t>> reduced = AllReducedSums(c->program, k);
    ASSERT_EQ(reduced.size(), 1u) << k;
    const ir::Node& sum = f.g.node(reduced.begin()->first);
    EXPECT_EQ(sum.op, ir::OpKind::kSum);
    EXPECT_EQ(sum.origin, "layers.0.weight");
    std::vector<int32_t> expected;
    for (ir::ValueId v : sum.inputs) expected.push_back(stage_running(f.g.value(v).producer));
    EXPECT_EQ(reduced.begin()->second, expected) << k;
    EXPECT_THAT(expected, ::testing::UnorderedElementsAre(0, 2));
  }
  EXPECT_TRUE(AllReducedSums(c->program, 1).empty());
}

TEST(CompilePlan, AnUnknownNodeIsNamed) {
  const absl::Status st = Compile([](json& c) { c["stages"][1]["nodes"]["forward"][0] = "/layers.9/Linear"; });
  EXPECT_THAT(st.message(), HasSubstr("stage 1 lists node '/layers.9/Linear' under forward, which the training graph "
                                      "does not have"));
}

TEST(CompilePlan, ANodeOnTwoStagesIsNamed) {
  const absl::Status st =
      Compile([](json& c) { c["stages"][1]["nodes"]["forward"].push_back(c["stages"][0]["nodes"]["forward"][0]); });
  EXPECT_THAT(st.message(), HasSubstr("is on two stages (0 and 1)"));
}

TEST(CompilePlan, AMissingNodeIsNamed) {
  std::string gone;
  const absl::Status st = Compile([&](json& c) {
    gone = c["stages"][1]["nodes"]["backward"].back();
    c["stages"][1]["nodes"]["backward"].erase(c["stages"][1]["nodes"]["backward"].size() - 1);
  });
  EXPECT_THAT(st.message(), HasSubstr("node '" + gone + "'"));
  EXPECT_THAT(st.message(), HasSubstr("is on no stage"));
}

// A Relu of a later stage, whose input that stage makes, moved to the end of stage 0 with its
// gradient: it reads a value of a later stage.
TEST(CompilePlan, ADependencyFlowingBackwardsAcrossStagesIsRefused) {
  const Fixture& f = TiedChain();
  std::string moved;
  int32_t from = -1;
  for (int32_t k = 1; k < 3 && moved.empty(); ++k) {
    const std::vector<std::string>& fwd = f.plan.stages[k].forward_nodes;
    for (size_t i = 1; i < fwd.size() && moved.empty(); ++i) {
      if (f.Node(fwd[i]).op == ir::OpKind::kRelu &&
          f.g.value(f.Node(fwd[i]).inputs[0]).producer == f.Find(fwd[i - 1])) {
        moved = fwd[i];
        from = k;
      }
    }
  }
  ASSERT_FALSE(moved.empty());
  const absl::Status st = Compile([&](json& c) {
    Erase(c["stages"][from], "forward", moved);
    c["stages"][0]["nodes"]["forward"].push_back(moved);
    for (const std::string& n : f.plan.stages[from].backward_nodes) {
      if (f.Node(n).origin != moved) continue;
      Erase(c["stages"][from], "backward", n);
      c["stages"][0]["nodes"]["backward"].insert(c["stages"][0]["nodes"]["backward"].begin(), n);
    }
    // (its recompute clone goes with it: drop the regions naming it)
    json& regions = c["stages"][from]["recompute_regions"];
    for (size_t r = 0; r < regions.size(); ++r) {
      json& nodes = regions[r]["nodes"];
      for (size_t i = 0; i < nodes.size(); ++i)
        if (nodes[i] == moved) nodes.erase(i);
    }
  });
  EXPECT_THAT(st.message(), HasSubstr("stage 0: node '" + moved + "' (Relu) reads"));
  EXPECT_THAT(st.message(), HasSubstr("from the later stage " + std::to_string(from)));
}

// Two forward nodes of a stage swapped: the second reads what the first makes.
TEST(CompilePlan, ADependencyFlowingBackwardsWithinAStageIsRefused) {
  const Fixture& f = TiedChain();
  int32_t stage = -1;
  size_t at = 0;
  for (int32_t k = 0; k < 3 && stage < 0; ++k) {
    const std::vector<std::string>& fwd = f.plan.stages[k].forward_nodes;
    for (size_t i = 1; i < fwd.size() && stage < 0; ++i) {
      if (f.g.value(f.Node(fwd[i]).inputs[0]).producer == f.Find(fwd[i - 1])) {
        stage = k;
        at = i;
      }
    }
  }
  ASSERT_GE(stage, 0);
  const std::string first = f.plan.stages[stage].forward_nodes[at - 1], second = f.plan.stages[stage].forward_nodes[at];
  const absl::Status st = Compile([&](json& c) {
    json& fwd = c["stages"][stage]["nodes"]["forward"];
    std::swap(fwd[at - 1], fwd[at]);
  });
  EXPECT_THAT(st.message(), HasSubstr("stage " + std::to_string(stage) + ": node '" + second + "'"));
  EXPECT_THAT(st.message(), HasSubstr("before '" + first + "'"));
  EXPECT_THAT(st.message(), HasSubstr("the stage's forward order"));
}

TEST(CompilePlan, AGradientAwayFromItsNodeIsRefused) {
  const Fixture& f = TiedChain();
  const std::string moved = f.plan.stages[1].backward_nodes.front();
  const absl::Status st = Compile([&](json& c) {
    Erase(c["stages"][1], "backward", moved);
    c["stages"][2]["nodes"]["backward"].push_back(moved);
  });
  EXPECT_THAT(st.message(), HasSubstr("backward node '" + moved + "'"));
  EXPECT_THAT(st.message(), HasSubstr("is on stage 2, but the forward node"));
  EXPECT_THAT(st.message(), HasSubstr("is on stage 1"));
}

// The tied weight's gradient Sum runs once per step after the accumulation: listed under backward
// (per micro-batch) it is refused.
TEST(CompilePlan, APostStepNodeUnderBackwardIsRefused) {
  const Fixture& f = TiedChain();
  std::string sum;
  for (const std::string& n : f.plan.stages[0].optimizer_nodes) {
    const ir::Node& node = f.Node(n);
    if (node.op == ir::OpKind::kSum && node.origin == "layers.0.weight") sum = n;
  }
  ASSERT_FALSE(sum.empty());
  const absl::Status st = Compile([&](json& c) {
    Erase(c["stages"][0], "optimizer", sum);
    c["stages"][0]["nodes"]["backward"].push_back(sum);
  });
  EXPECT_THAT(st.message(), HasSubstr("stage 0 lists node '" + sum + "' (Sum) under backward"));
  EXPECT_THAT(st.message(), HasSubstr("list it under optimizer"));
}

// The last stage reads the tied weight (the head) but no longer runs its update.
TEST(CompilePlan, AStageReadingAParameterItDoesNotHoldIsRefused) {
  const Fixture& f = TiedChain();
  const absl::Status st = Compile([&](json& c) {
    for (const std::string& n : f.plan.stages[2].replicated_nodes) Erase(c["stages"][2], "optimizer", n);
    c["stages"][2]["nodes"]["replicated"] = json::array();
  });
  EXPECT_THAT(st.message(), HasSubstr("stage 2: node '/head/Linear' (Linear) reads the parameter 'layers.0.weight', "
                                      "which this stage does not update"));
}

TEST(CompilePlan, ARecomputeRegionOfAnotherStageIsRefused) {
  const Fixture& f = TiedChain();
  int32_t stage = -1;
  for (int32_t k = 0; k < 3 && stage < 0; ++k)
    if (!f.plan.stages[k].recompute_regions.empty()) stage = k;
  ASSERT_GE(stage, 0);
  const std::string other = f.plan.stages[(stage + 1) % 3].forward_nodes[0];
  const absl::Status st =
      Compile([&](json& c) { c["stages"][stage]["recompute_regions"][0]["nodes"].push_back(other); });
  EXPECT_THAT(st.message(), HasSubstr("stage " + std::to_string(stage) + ": recompute region 0 names '" + other + "'"));
  EXPECT_THAT(st.message(), HasSubstr("not a forward node of this stage"));
}

TEST(CompilePlan, ActionsThatAreNotThePlansScheduleAreRefused) {
  // Two actions of stage 0 swapped.
  absl::Status st = Compile([](json& c) {
    json& a = c["stages"][0]["actions"];
    std::swap(a[0], a[2]);
  });
  EXPECT_THAT(st.message(),
              HasSubstr("stage 0's actions are not the 1f1b schedule of its program (K=3, M=2): action 0"));
  // The schedule changed, the actions kept.
  st = Compile([](json& c) { c["config"]["schedule"] = "gpipe"; });
  EXPECT_THAT(st.message(), HasSubstr("actions are not the gpipe schedule"));
  // An action dropped.
  st = Compile([](json& c) { c["stages"][1]["actions"].erase(0); });
  EXPECT_THAT(st.message(), HasSubstr("stage 1's actions are not the 1f1b schedule"));
}

}  // namespace
}  // namespace onnxpipe::partitioner
