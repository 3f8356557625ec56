// Pipeline behaviour beyond equality with the unpartitioned run: faults stop every stage with one
// error naming stage, micro-batch and node; tied parameters stay identical on their stages;
// dropout replays under recompute; memory measured against the static planner's prediction and
// 1F1B's activations below GPipe's.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "executor/comm/comm.h"
#include "executor/cpu/workspace.h"
#include "executor/data/npy.h"
#include "executor/pipeline/memory.h"
#include "frontend/passes/batch_symbolic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/pipeline/pipeline_test_util.h"

namespace onnxpipe::pipeline::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const ModelFixture& Fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<ModelFixture>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    absl::StatusOr<std::unique_ptr<ModelFixture>> f = ModelFixture::Load(name);
    EXPECT_TRUE(f.ok()) << f.status();
    it = cache.emplace(name, std::move(*f)).first;
  }
  return *it->second;
}

// The first forward node of `stage` in the partitioner's K-stage plan of the micro-batch graph.
std::string FirstForwardNodeOf(const ModelFixture& f, const RunConfig& c, int32_t stage) {
  absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
  EXPECT_TRUE(g.ok());
  absl::StatusOr<partitioner::PartitionPlan> plan = f.Plan(c, *g);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? plan->stages[stage].forward_nodes.front() : "";
}

TEST(PipelineFaults, AnErrorInStageOneMicrobatchTwoStopsEveryStageWithOneError) {
  const ModelFixture& f = Fixture("tiny_gpt");
  RunConfig c;
  c.stages = 3;
  c.microbatches = 4;
  c.schedule = ScheduleKind::k1F1B;
  const std::string target = FirstForwardNodeOf(f, c, 1);
  ASSERT_FALSE(target.empty());
  std::atomic<int> hits{0};
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>*) -> absl::Status {
    if (e.stage == 1 && e.microbatch == 2 && e.phase == StepPhase::kForward && e.node->name == target) {
      ++hits;
      return absl::InternalError("injected fault");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(hits.load(), 1);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg, HasSubstr("step 0: stage 1, micro-batch 2, forward node '" + target + "'"));
  EXPECT_THAT(msg, HasSubstr("injected fault"));
  EXPECT_THAT(msg, Not(HasSubstr("pipeline aborted")));  // the root cause, not a woken peer
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
}

TEST(PipelineFaults, AnExceptionInABackwardIsCaughtAndNamed) {
  const ModelFixture& f = Fixture("tiny_bert");
  RunConfig c;
  c.stages = 4;
  c.microbatches = 2;
  c.schedule = ScheduleKind::kGPipe;
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>*) -> absl::Status {
    if (e.stage == 2 && e.microbatch == 1 && e.phase == StepPhase::kBackward) throw std::runtime_error("kaboom");
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("stage 2, micro-batch 1, backward node"));
  EXPECT_THAT(r.status().message(), HasSubstr("exception: kaboom"));
}

TEST(PipelineFaults, CheckNumericsNamesTheNodeProducingANaN) {
  const ModelFixture& f = Fixture("tiny_classifier");
  RunConfig c;
  c.stages = 2;
  c.microbatches = 4;
  c.check_numerics = true;
  const std::string target = FirstForwardNodeOf(f, c, 1);
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>* out) -> absl::Status {
    if (e.stage == 1 && e.microbatch == 3 && e.node->name == target && e.phase == StepPhase::kForward) {
      ir::Tensor& t = (*out)[0];  // written in its planned slot, as a kernel would
      if (t.dtype() == ir::DType::kF64) t.mutable_data<double>()[0] = std::nan("");
      if (t.dtype() == ir::DType::kF32) t.mutable_data<float>()[0] = std::nanf("");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("stage 1, micro-batch 3, forward node '" + target + "'"));
  EXPECT_THAT(r.status().message(), HasSubstr("produced a non-finite value"));
}

// A kernel that returns an output it allocated itself, outside the arena (here: a copy of what it wrote), is an
// error naming the node, not memory behind the plan's back. One stage, as `onnxpipe train` runs by default.
TEST(PipelineFaults, AnOutputOutsideItsPlannedSlotIsAnError) {
  const ModelFixture& f = Fixture("tiny_classifier");
  RunConfig c;
  c.stages = 1;
  const std::string target = FirstForwardNodeOf(f, c, 0);
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>* out) -> absl::Status {
    if (e.node->name == target && e.phase == StepPhase::kForward) (*out)[0] = (*out)[0].Clone();
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("stage 0, micro-batch 0, forward node '" + target + "'"));
  EXPECT_THAT(r.status().message(), HasSubstr("outside its planned slot"));
}

TEST(PipelineFaults, WithoutCheckNumericsANaNLossFailsTheStepAndSaysHowToFindIt) {
  const ModelFixture& f = Fixture("tiny_classifier");
  RunConfig c;
  c.stages = 2;
  c.microbatches = 2;
  const std::string target = FirstForwardNodeOf(f, c, 1);
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>* out) -> absl::Status {
    if (e.node->name == target && e.phase == StepPhase::kForward) {
      ir::Tensor& t = (*out)[0];  // written in its planned slot, as a kernel would
      for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<double>()[i] = INFINITY;
    }
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("--check-numerics"));
}

TEST(PipelineFaults, AFailedStepLeavesTheExecutorUnusable) {
  const ModelFixture& f = Fixture("tiny_gpt");
  RunConfig c;
  c.stages = 2;
  c.microbatches = 2;
  absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok());
  absl::StatusOr<partitioner::PartitionPlan> plan = f.Plan(c, *g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<partitioner::CompiledPlan> compiled = partitioner::CompilePlan(*g, *plan);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ExecutorOptions eo;
  eo.dropout = false;
  bool fail = true;
  eo.node_hook = [&](const NodeEvent& e, std::vector<ir::Tensor>*) -> absl::Status {
    return fail && e.stage == 0 && e.phase == StepPhase::kPost ? absl::InternalError("optimizer fault")
                                                               : absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<PipelineExecutor>> ex = PipelineExecutor::Create(*g, *std::move(compiled), eo);
  ASSERT_TRUE(ex.ok()) << ex.status();
  absl::StatusOr<PipelineStepResult> s = (*ex)->Step(f.Feeds(0, 0.05, ir::DType::kF64));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("stage 0, optimizer node"));
  fail = false;
  s = (*ex)->Step(f.Feeds(1, 0.05, ir::DType::kF64));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The last stage reaches the tied embedding's all-reduce and waits there for stage 0, which fails
// in its last backward: the abort wakes it, and the step returns stage 0's error at once (not the
// comm's timeout).
TEST(PipelineFaults, AFailureWakesTheOtherHolderBlockedInTheTiedAllReduce) {
  const ModelFixture& f = Fixture("tiny_gpt");
  RunConfig c;
  c.stages = 2;
  c.microbatches = 2;
  absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
  ASSERT_TRUE(g.ok());
  absl::StatusOr<partitioner::PartitionPlan> plan = f.Plan(c, *g);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<partitioner::CompiledPlan> compiled = partitioner::CompilePlan(*g, *plan);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  ExecutorOptions eo;
  eo.dropout = false;
  eo.recv_timeout_s = 60;
  std::atomic<bool> failed{false};
  std::vector<std::string> ran_post;  // stage 1's post nodes, in order (its thread alone writes)
  eo.node_hook = [&](const NodeEvent& e, std::vector<ir::Tensor>*) -> absl::Status {
    if (e.stage == 1 && e.phase == StepPhase::kPost) ran_post.push_back(e.node->name);
    if (e.stage == 0 && e.phase == StepPhase::kBackward && e.microbatch == c.microbatches - 1 &&
        !failed.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return absl::InternalError("injected backward fault");
    }
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<PipelineExecutor>> ex = PipelineExecutor::Create(*g, *std::move(compiled), eo);
  ASSERT_TRUE(ex.ok()) << ex.status();
  const std::map<ir::NodeId, std::vector<int32_t>> reduced = partitioner::AllReducedSums((*ex)->program(), 1);
  ASSERT_EQ(reduced.size(), 1u);
  const StageProgram& last = (*ex)->program().stages[1];
  std::vector<std::string> before;
  for (auto it = last.post.begin(); *it != reduced.begin()->first; ++it) before.push_back(last.graph.node(*it).name);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<PipelineStepResult> s = (*ex)->Step(f.Feeds(0, 0.05, ir::DType::kF64));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInternal) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("injected backward fault"));
  EXPECT_THAT(s.status().message(), HasSubstr("stage 0, micro-batch 1, backward"));
  EXPECT_LT(seconds, 30);
  EXPECT_EQ(ran_post, before);  // stage 1 did all it could before the all-reduce, and nothing after
}

TEST(PipelineFaults, AReceiveTimeoutTurnsAHangIntoAnError) {
  // Stage 1 stalls (a hook that sleeps) longer than the receive timeout: stage 0 gives up waiting
  // for its gradient, and the step fails naming the wait instead of hanging.
  const ModelFixture& f = Fixture("tiny_gpt");
  RunConfig c;
  c.stages = 2;
  c.recv_timeout_s = 0.2;
  std::atomic<bool> slept{false};
  c.hook = [&](const NodeEvent& e, std::vector<ir::Tensor>*) -> absl::Status {
    if (e.stage == 1 && e.phase == StepPhase::kBackward && !slept.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("stage 0, micro-batch 0: receiving"));
}

// Megatron style: the lm head's stage holds the tied embedding itself, with its own optimizer state,
// receives the other holder's gradient contribution once per step, and applies the same update:
// after every step both copies and both optimizer states are bitwise equal (and equal to the
// unpartitioned run, checked by the equivalence tests), without any parameter broadcast.
TEST(PipelineProgram, TiedEmbeddingGradientsAreSummedAcrossStagesAndCopiesStayIdentical) {
  const ModelFixture& f = Fixture("tiny_gpt");
  for (autodiff::OptimizerKind optimizer : {autodiff::OptimizerKind::kSGD, autodiff::OptimizerKind::kAdamW}) {
    for (int32_t K : {2, 3, 4}) {
      RunConfig c;
      c.stages = K;
      c.microbatches = 2;
      c.steps = 3;
      c.optimizer = optimizer;
      const std::string where =
          std::string(optimizer == autodiff::OptimizerKind::kSGD ? "sgd" : "adamw") + " K=" + std::to_string(K);
      absl::StatusOr<RunResult> r = f.Pipeline(c);
      ASSERT_TRUE(r.ok()) << r.status();
      const PipelineProgram& p = r->executor->program();
      const ir::ValueId tied = p.stages[0].graph.FindValue("tok_emb.weight");
      ASSERT_NE(tied, ir::kNoValue);
      EXPECT_EQ(p.parameter_owner.at(tied), 0);  // the embedding Gather's stage
      // Both holders run the Sum of the tied gradient's contributions once per step; the
      // contributions cross stages once per step (post), never per micro-batch.
      auto post_sum = [&](int32_t s) {
        for (ir::NodeId id : p.stages[s].post) {
          const ir::Node& n = p.stages[s].graph.node(id);
          if (n.op == ir::OpKind::kSum && n.origin == "tok_emb.weight") return true;
        }
        return false;
      };
      EXPECT_TRUE(post_sum(0)) << where;
      EXPECT_TRUE(post_sum(K - 1)) << where;
      EXPECT_FALSE(p.stages[0].recv_post.empty()) << where;
      EXPECT_FALSE(p.stages[K - 1].recv_post.empty()) << where;
      EXPECT_THAT(p.stages[0].shared_parameters, ::testing::Contains(tied)) << where;
      EXPECT_THAT(p.stages[K - 1].shared_parameters, ::testing::Contains(tied)) << where;
      auto tied_states = [&](int32_t s) {
        std::vector<std::string> names;
        for (const ir::Graph::StateUpdate& u : p.stages[s].state_updates) {
          const std::string& name = p.stages[s].graph.value(u.state).name;
          if (name.find("tok_emb.weight") != std::string::npos) names.push_back(name);
        }
        return names;
      };
      const std::vector<std::string> names = tied_states(K - 1);
      EXPECT_EQ(names, tied_states(0)) << where;
      EXPECT_GE(names.size(), optimizer == autodiff::OptimizerKind::kSGD ? 1u : 3u) << where;  // + moments
      for (const std::string& name : names) {
        std::optional<ir::Tensor> owner = r->executor->StageConstant(0, name);
        std::optional<ir::Tensor> holder = r->executor->StageConstant(K - 1, name);
        ASSERT_TRUE(owner && holder) << where << " " << name;
        EXPECT_TRUE(owner->BitwiseEquals(*holder)) << where << " " << name;
      }
      // Stages in between hold no copy at all.
      for (int32_t s = 1; s < K - 1; ++s) EXPECT_FALSE(r->executor->StageConstant(s, "tok_emb.weight")) << s;
      // The holders combine the contributions with one all-reduce per step (comm::Comm::AllReduce),
      // the stages in between take no part in it.
      for (const PipelineStepResult& step : r->steps) {
        std::vector<int32_t> reducing;
        for (const TraceEvent& e : step.trace)
          if (e.name == "all-reduce tok_emb.weight") reducing.push_back(e.stage);
        std::sort(reducing.begin(), reducing.end());
        EXPECT_EQ(reducing, (std::vector<int32_t>{0, K - 1})) << where;
      }
    }
  }
}

TEST(PipelineDropout, RecomputeReplaysTheMasksBitForBit) {
  const ModelFixture& f = Fixture("tiny_gpt");
  for (int32_t M : {1, 2}) {
    RunConfig c;
    c.dropout = true;
    c.microbatches = M;
    c.stages = 3;
    absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
    ASSERT_TRUE(g.ok());
    absl::StatusOr<RunResult> none = f.Pipeline(c, &*g);
    ASSERT_TRUE(none.ok()) << none.status();
    for (RecomputePolicy rp : {RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
      c.recompute = rp;
      absl::StatusOr<RunResult> re = f.Pipeline(c, &*g);
      ASSERT_TRUE(re.ok()) << re.status();
      for (size_t k = 0; k < none->losses.size(); ++k) EXPECT_EQ(re->losses[k], none->losses[k]) << Describe(c);
      for (const auto& [name, t] : none->params)
        EXPECT_TRUE(re->params.at(name).BitwiseEquals(t)) << Describe(c) << " " << name;
    }
    if (M == 1) {
      // With one micro-batch the random streams are the trainer's (offset = step).
      c.recompute = RecomputePolicy::kNone;
      absl::StatusOr<RunResult> ref = f.Reference(c);
      ASSERT_TRUE(ref.ok()) << ref.status();
      for (size_t k = 0; k < ref->losses.size(); ++k) EXPECT_EQ(none->losses[k], ref->losses[k]);
      // And dropout is really on: the run differs from one without it.
      RunConfig off = c;
      off.dropout = false;
      absl::StatusOr<RunResult> r_off = f.Reference(off);
      ASSERT_TRUE(r_off.ok());
      EXPECT_NE(r_off->losses[0], ref->losses[0]);
    }
  }
}

// Every micro-batch value lives in the slot the stage's static layout gives it (the executor checks
// each output's address), so the high-water of what each stage's arena handed out must be exactly
// the layout's prediction: bytes saved per micro-batch, micro-batches in flight (the schedule's
// bound), activations = saved x in-flight, the transient region, the whole arena, accumulators and
// workspace. Dropout is on, as in training (without it Dropout passes its input through and
// shares its buffer). M = 1 checks the layout without a later-micro-batch plan.
TEST(PipelineMemory, MeasuredEqualsThePlannerPrediction) {
  for (const char* model : {"tiny_gpt", "tiny_bert", "tiny_classifier"}) {
    const ModelFixture& f = Fixture(model);
    for (int32_t K : {2, 3}) {
      for (RecomputePolicy rp : {RecomputePolicy::kNone, RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
        std::map<ScheduleKind, std::vector<int64_t>> activations;
        for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
          for (int32_t M : {1, 4}) {
            RunConfig c;
            c.dropout = true;
            c.stages = K;
            c.microbatches = M;
            c.steps = 2;
            c.schedule = kind;
            c.recompute = rp;
            absl::StatusOr<RunResult> r = f.Pipeline(c);
            ASSERT_TRUE(r.ok()) << r.status();
            for (int32_t s = 0; s < c.stages; ++s) {
              const PipelineExecutor& ex = *r->executor;
              // The layout the executor allocated is the partitioner's layout of the program.
              absl::StatusOr<StageLayout> fresh = partitioner::PlanStageLayout(
                  ex.program().stages[s], partitioner::InFlightMicrobatches(kind, c.stages, s, c.microbatches),
                  c.microbatches, 64,
                  [](const ir::Graph& g, const ir::Node& n) { return cpu::CpuWorkspaceBytes(g, n); });
              ASSERT_TRUE(fresh.ok()) << fresh.status();
              const StageMemoryPrediction p = PredictStageMemory(ex.program().stages[s], ex.layout(s));
              EXPECT_EQ(fresh->arena(), p.arena);
              EXPECT_EQ(fresh->workspace, p.workspace);
              for (int32_t k = 0; k < c.steps; ++k) {
                const std::string where = std::string(model) + " " + Describe(c) + " step " + std::to_string(k) +
                                          " stage " + std::to_string(s);
                const StageMeasure& m = r->steps[k].stages[s];
                EXPECT_EQ(m.saved_bytes, p.saved) << where;
                EXPECT_EQ(m.max_in_flight, p.in_flight) << where;
                EXPECT_EQ(m.activations_peak, p.activations) << where;
                EXPECT_EQ(m.transient_bytes, p.transient) << where;
                EXPECT_EQ(m.arena_bytes, p.arena) << where;
                EXPECT_EQ(m.accumulator_bytes, p.accumulators) << where;
                EXPECT_EQ(m.workspace_bytes, p.workspace) << where;
                EXPECT_GT(p.saved, 0) << where;
                // Parameters and optimizer state are updated in place and a tied parameter's
                // gradient is all-reduced in place: the optimizer phase's fresh tensors are scalars
                // (norm partials).
                EXPECT_LT(m.optimizer_scratch_bytes, p.parameters / 4) << where;
              }
              if (M == 4) activations[kind].push_back(r->steps[0].stages[s].activations_peak);
            }
          }
        }
        // 1F1B keeps min(M, K - s) micro-batches where GPipe keeps M: less on every stage here.
        for (int32_t s = 0; s < K; ++s) {
          EXPECT_LT(activations[ScheduleKind::k1F1B][s], activations[ScheduleKind::kGPipe][s])
              << model << " K=" << K << " " << RecomputePolicyName(rp) << " stage " << s;
        }
      }
    }
  }
}

// The stages update their parameters in place, so what Parameters() returned must be a copy that a
// later step leaves alone.
TEST(PipelineMemory, ParametersReturnedStayUnchangedByLaterSteps) {
  const ModelFixture& f = Fixture("tiny_bert");
  RunConfig c;
  c.stages = 2;
  c.microbatches = 2;
  c.steps = 1;
  absl::StatusOr<RunResult> r = f.Pipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::map<std::string, ir::Tensor> before = r->executor->Parameters();
  std::map<std::string, ir::Tensor> copy;
  for (const auto& [name, t] : before) copy[name] = t.Clone();
  ASSERT_TRUE(r->executor->Step(f.Feeds(1, c.lr, c.dtype)).ok());
  int changed = 0;
  for (const auto& [name, t] : r->executor->Parameters()) {
    EXPECT_TRUE(before.at(name).BitwiseEquals(copy.at(name))) << name;
    changed += !t.BitwiseEquals(copy.at(name));
  }
  EXPECT_GT(changed, 0);  // the step did train
}

TEST(PipelineMemory, DimsOnlyTensorsCarryShapesWithoutStorage) {
  ir::Tensor t = ir::Tensor::DimsOnly(ir::DType::kF32, {3, 5});
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.has_data());
  EXPECT_EQ(t.raw(), nullptr);
  EXPECT_EQ(t.dims(), (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(ir::Tensor(ir::DType::kF32, {3, 5}).has_data());
  EXPECT_TRUE(ir::Tensor(ir::DType::kF32, {0}).has_data());
}

// The partitioner's plan run as is: its cuts and its recompute regions (none, full, selective,
// auto). Results are bitwise those of one stage at the same M, and each stage's measured memory is
// the plan's own prediction, byte for byte: saved bytes per micro-batch, micro-batches in flight,
// activations, the whole arena and its transient part, kernel scratch, gradients, parameters,
// optimizer state.
TEST(PipelinePlan, RunsThePartitionersPlanWithItsPredictedMemory) {
  for (const char* model : {"tiny_gpt", "tiny_bert", "tiny_classifier"}) {
    const ModelFixture& f = Fixture(model);
    for (int32_t M : {1, 2, 4}) {
      RunConfig c;
      c.dropout = true;
      c.microbatches = M;
      c.steps = 2;
      absl::StatusOr<ir::Graph> g = f.MicrobatchTrainingGraph(c);
      ASSERT_TRUE(g.ok()) << g.status();
      absl::StatusOr<RunResult> one = f.Pipeline(c, &*g);
      ASSERT_TRUE(one.ok()) << one.status();
      for (int32_t K : {2, 3, 4}) {
        for (RecomputePolicy rp :
             {RecomputePolicy::kNone, RecomputePolicy::kFull, RecomputePolicy::kSelective, RecomputePolicy::kAuto}) {
          for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::k1F1B}) {
            const std::string where = std::string(model) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " " +
                                      RecomputePolicyName(rp) + " " + ScheduleName(kind);
            absl::StatusOr<partitioner::PartitionPlan> plan =
                PartitionAtFixedStages(*g, K, f.batch(), M, kind, rp, "cpu", model, partitioner::Precision::kFP32,
                                       backend::MakeCpuBackend());
            ASSERT_TRUE(plan.ok()) << where << ": " << plan.status();
            absl::StatusOr<partitioner::CompiledPlan> compiled = partitioner::CompilePlan(*g, *plan);
            ASSERT_TRUE(compiled.ok()) << compiled.status();
            ExecutorOptions eo;
            eo.dropout = c.dropout;
            eo.seed = c.seed;
            absl::StatusOr<std::unique_ptr<PipelineExecutor>> ex =
                PipelineExecutor::Create(*g, *std::move(compiled), eo);
            ASSERT_TRUE(ex.ok()) << where << ": " << ex.status();
            for (int32_t k = 0; k < c.steps; ++k) {
              absl::StatusOr<PipelineStepResult> r = (*ex)->Step(f.Feeds(k, c.lr, c.dtype));
              ASSERT_TRUE(r.ok()) << r.status();
              EXPECT_EQ(r->loss, one->losses[k]) << where;
              for (int32_t s = 0; s < K; ++s) {
                const StageMeasure& m = r->stages[s];
                const partitioner::StageMemory& pm = plan->stages[s].memory;
                EXPECT_EQ(m.saved_bytes, pm.saved) << where << " stage " << s;
                EXPECT_EQ(m.max_in_flight, pm.in_flight) << where << " stage " << s;
                EXPECT_EQ(m.activations_peak, pm.activations) << where << " stage " << s;
                // The persistent regions too: parameters, gradients (the accumulators) and optimizer
                // state, tied parameters included on every stage holding them.
                const StageMemoryPrediction pr = PredictStageMemory((*ex)->program().stages[s], (*ex)->layout(s));
                EXPECT_EQ(pr.parameters, pm.parameters) << where << " stage " << s;
                EXPECT_EQ(pr.optimizer_state, pm.optimizer_state) << where << " stage " << s;
                EXPECT_EQ(pr.accumulators, pm.gradients) << where << " stage " << s;
                EXPECT_EQ(m.accumulator_bytes, pm.gradients) << where << " stage " << s;
                // And the arena itself: the plan's per-stage prediction is the executor's layout.
                EXPECT_EQ(m.arena_bytes, pm.arena) << where << " stage " << s;
                EXPECT_EQ(m.transient_bytes, pm.transient) << where << " stage " << s;
                // Kernel scratch, counted by the partitioner from the same backend.
                EXPECT_EQ(m.workspace_bytes, pm.kernel_scratch) << where << " stage " << s;
              }
            }
            for (const auto& [name, t] : (*ex)->Parameters()) {
              EXPECT_TRUE(one->params.at(name).BitwiseEquals(t)) << where << " " << name;
            }
          }
        }
      }
    }
  }
}

// A model exported with a fixed batch (PyTorch without dynamic axes) trains in micro-batches once
// the batch is re-derived, bitwise like the dynamic export; an export whose batch equals the head
// count is refused as ambiguous.
TEST(PipelineFixedBatch, ReDerivedBatchTrainsLikeTheDynamicExport) {
  const std::string dir = ::testing::TempDir() + "/pipeline_fixed_batch";
  std::filesystem::create_directories(dir);
  const std::string src = ONNXPIPE_SOURCE_DIR;
  for (int b : {6, 4}) {
    const std::string out = dir + "/gpt_b" + std::to_string(b) + ".onnx";
    const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + src +
                            "/models/export.py --family gpt --vocab 512 --d-model 64 --heads 4 --ffn 256 --layers 2 "
                            "--seq 32 --dropout 0.1 --norm-first --causal-mask tril --opset 17 --seed 0 "
                            "--no-dynamic-axes --export-batch " +
                            std::to_string(b) + " --out " + out + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  RunConfig c;
  c.stages = 2;
  c.microbatches = 2;
  absl::StatusOr<RunResult> dynamic = Fixture("tiny_gpt").Pipeline(c);
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  absl::StatusOr<std::unique_ptr<ModelFixture>> fixed =
      ModelFixture::FromFile(dir + "/gpt_b6.onnx", dir + "/gpt_b6.json", src + "/models/golden/tiny_gpt/data", 4);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_TRUE(passes::HasFixedBatch((*fixed)->imported()));
  absl::StatusOr<RunResult> r = (*fixed)->Pipeline(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->losses, dynamic->losses);
  for (const auto& [name, t] : dynamic->params) EXPECT_TRUE(r->params.at(name).BitwiseEquals(t)) << name;

  absl::StatusOr<std::unique_ptr<ModelFixture>> ambiguous =
      ModelFixture::FromFile(dir + "/gpt_b4.onnx", dir + "/gpt_b4.json", src + "/models/golden/tiny_gpt/data", 4);
  ASSERT_TRUE(ambiguous.ok()) << ambiguous.status();
  absl::StatusOr<RunResult> refused = (*ambiguous)->Pipeline(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("ambiguous"));
  EXPECT_THAT(refused.status().message(), HasSubstr("re-export the model with dynamic axes"));
}

// A seq-first post-LN encoder exported at fixed batch 6 (opset 14, no dynamic axes) whose batch cannot be
// re-derived: with one micro-batch of 6 the micro-batch is the export's batch, so it trains pipelined as
// exported, bitwise like the unpartitioned run; two micro-batches of 3 are still refused, saying why.
TEST(PipelineFixedBatch, OneMicrobatchOfTheExportBatchTrainsAsExported) {
  const std::string dir = ::testing::TempDir() + "/pipeline_fixed_batch_m1";
  std::filesystem::create_directories(dir + "/data");
  const std::string src = ONNXPIPE_SOURCE_DIR;
  const std::string onnx = dir + "/encoder_b6.onnx";
  const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + src +
                          "/models/export.py --family classifier --vocab 100 --d-model 32 --heads 4 --ffn 64 "
                          "--layers 2 --seq 24 --classes 5 --dropout 0.1 --opset 14 --no-batch-first "
                          "--no-norm-first --no-dynamic-axes --export-batch 6 --seed 0 --out " +
                          onnx + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // 12 rows: two steps of batch 6.
  std::vector<int64_t> tokens(12 * 24), labels(12);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 37 + i / 24) % 100);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>((i * 3) % 5);
  ASSERT_TRUE(data::WriteNpy(dir + "/data/tokens.npy", ir::Tensor::FromVector<int64_t>({12, 24}, tokens)).ok());
  ASSERT_TRUE(data::WriteNpy(dir + "/data/labels.npy", ir::Tensor::FromVector<int64_t>({12}, labels)).ok());
  absl::StatusOr<std::unique_ptr<ModelFixture>> fixed =
      ModelFixture::FromFile(onnx, dir + "/encoder_b6.json", dir + "/data", /*batch=*/6);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_TRUE(passes::HasFixedBatch((*fixed)->imported()));

  RunConfig c;
  c.stages = 2;
  c.microbatches = 1;
  c.dropout = true;
  absl::StatusOr<RunResult> reference = (*fixed)->Reference(c);
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<RunResult> piped = (*fixed)->Pipeline(c);
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ(piped->losses, reference->losses);
  ASSERT_EQ(piped->params.size(), reference->params.size());
  for (const auto& [name, t] : reference->params) EXPECT_TRUE(piped->params.at(name).BitwiseEquals(t)) << name;

  c.microbatches = 2;
  absl::StatusOr<RunResult> refused = (*fixed)->Pipeline(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("export batch 6"));
  EXPECT_THAT(refused.status().message(), HasSubstr("re-export the model with dynamic axes"));
}

}  // namespace
}  // namespace onnxpipe::pipeline::testing
