// The zero-copy arena executor (runtime/arena_executor.h) on the training graphs of every shipped
// model (tied GPT embedding, BERT with an attention mask, a classifier with a frozen buffer), fp32
// and fp64, SGD with momentum and AdamW, dropout on: one step in the planned arena equals the
// plain interpreter bit for bit (outputs and every updated state), kernels wrote every output in
// its planned slot (no ir::Tensor allocated during the run), kernel scratch came from the planned
// workspace, and the arena's and the workspace's high-water marks are the planned sizes. An evaluator that ignores the slots is caught.
// Steps through one PlannedRunner equal the interpreter's steps bit for bit while the runner
// reuses its buffers, and results a caller holds are never overwritten.
#include <cmath>
#include <string>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "executor/cpu/workspace.h"
#include "executor/runtime/arena_executor.h"
#include "executor/train/trainer.h"
#include "gtest/gtest.h"
#include "partitioner/memory_planner.h"
#include "tools/model.h"

namespace onnxpipe {
namespace {

struct Case {
  std::string model;
  ir::DType dtype;
  autodiff::OptimizerKind optimizer;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.model + "_" + std::string(ir::DTypeName(info.param.dtype)) + "_" +
         (info.param.optimizer == autodiff::OptimizerKind::kSGD ? "sgd" : "adamw");
}

// A training graph for the model with batch 4 of its golden data, and one step's feeds.
struct TrainingStep {
  std::optional<train::Trainer> trainer;
  std::vector<ir::Tensor> feeds;
};

void MakeSetup(const Case& c, TrainingStep* s) {
  const std::string src = ONNXPIPE_SOURCE_DIR;
  constexpr int64_t kBatch = 4;
  absl::StatusOr<tools::Model> model = tools::ImportModel(src + "/models/" + c.model + ".onnx", false);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::vector<train::FieldSpec>> fields =
      train::DataFields(*model->imported, "logits", "labels");
  ASSERT_TRUE(fields.ok()) << fields.status();
  std::map<std::string, int64_t> bindings;
  absl::StatusOr<train::Dataset> data =
      train::Dataset::Load(src + "/models/golden/" + c.model + "/data", *fields, kBatch, &bindings);
  ASSERT_TRUE(data.ok()) << data.status();
  tools::ModelOptions mo;
  mo.batch = kBatch;
  mo.extra_dims = tools::NonBatchBindings(*model->imported, bindings);
  ASSERT_TRUE(tools::PrepareModel(*model, mo).ok());
  train::TrainOptions o;
  o.batch = kBatch;
  o.steps = 1;
  o.lr = 1e-2;
  o.optimizer.kind = c.optimizer;
  o.optimizer.momentum = 0.9;
  o.optimizer.weight_decay = 0.01;
  o.logits = "logits";
  o.labels = "labels";
  o.freeze_regex = "(attn\\.mask|pos\\.table)$";
  o.dtype = c.dtype;
  o.dropout = true;
  absl::StatusOr<train::Trainer> trainer = train::Trainer::Create(*model->graph, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  s->trainer.emplace(*std::move(trainer));
  const ir::Graph& g = s->trainer->graph();
  const std::vector<int64_t> rows = data->BatchRows(/*step=*/0, kBatch, /*shuffle=*/false, /*seed=*/0);
  for (ir::ValueId in : g.inputs()) {
    const ir::Value& v = g.value(in);
    if (v.shape.empty()) {  // the optimizer's scalars: learning rate (float) and step (integer)
      s->feeds.push_back(ir::IsFloat(v.dtype) ? ir::Tensor::Scalar<double>(1e-2).CastTo(v.dtype)
                                              : ir::Tensor::Scalar<int64_t>(1).CastTo(v.dtype));
      continue;
    }
    ir::Tensor t = data->Gather(v.name, rows);
    if (t.dtype() != v.dtype) t = t.CastTo(v.dtype);
    s->feeds.push_back(std::move(t));
  }
}

absl::StatusOr<partitioner::MemoryPlan> PlanWithWorkspace(const ir::Graph& g,
                                                          const std::vector<ir::NodeId>& order) {
  partitioner::MemoryPlanOptions o;
  o.workspace_bytes = cpu::CpuWorkspaceBytes;
  return partitioner::PlanMemory(g, order, o);
}

class ArenaExecutorTest : public ::testing::TestWithParam<Case> {};

TEST_P(ArenaExecutorTest, BitwiseEqualToInterpreterInExactlyThePlannedBytes) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(MakeSetup(GetParam(), &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();

  cpu::EvalContext ctx;
  ctx.training = true;
  ctx.seed = 7;
  ctx.offset = 3;
  cpu::CpuEvaluator ev(ctx);
  absl::StatusOr<runtime::StepResult> want = runtime::InterpretStep(g, ev, s.feeds);
  ASSERT_TRUE(want.ok()) << want.status();
  runtime::ArenaStats stats;
  absl::StatusOr<runtime::StepResult> got =
      runtime::InterpretPlanned(g, order, *plan, ev, s.feeds, {}, &stats);
  ASSERT_TRUE(got.ok()) << got.status();

  ASSERT_EQ(got->outputs.size(), want->outputs.size());
  for (size_t i = 0; i < got->outputs.size(); ++i)
    EXPECT_TRUE(got->outputs[i].BitwiseEquals(want->outputs[i])) << "output " << i;
  ASSERT_EQ(got->state.size(), want->state.size());
  ASSERT_GT(got->state.size(), 0u);
  for (size_t i = 0; i < got->state.size(); ++i)
    EXPECT_TRUE(got->state[i].BitwiseEquals(want->state[i]))
        << "state " << g.value(g.state_updates()[i].state).name;
  EXPECT_TRUE(std::isfinite(want->outputs[0].GetAsDouble(0)));

  EXPECT_EQ(stats.off_plan_allocations, 0) << "a kernel allocated outside the plan";
  EXPECT_EQ(stats.arena_bytes, plan->arena_bytes);
  EXPECT_EQ(stats.arena_high_water, plan->arena_bytes);
  EXPECT_EQ(stats.gradient_bytes, plan->gradient_bytes);
  // Kernel scratch is planned too: the largest request is the reserved workspace (every shipped
  // model has attention, which needs one).
  EXPECT_GT(plan->workspace_bytes, 0);
  EXPECT_EQ(stats.workspace_bytes, plan->workspace_bytes);
  EXPECT_EQ(stats.workspace_high_water, plan->workspace_bytes);
  EXPECT_EQ(stats.state_bytes, plan->parameter_bytes + plan->optimizer_state_bytes);

  // The returned state is a view that outlives the executor and applies as the interpreter's.
  ir::Graph applied = g;
  ASSERT_TRUE(runtime::ApplyStateUpdates(applied, got->state).ok());
}

// Results are views sharing ownership of the run's buffers: they stay valid and unchanged after
// the run and after another run (which gets buffers of its own).
TEST_P(ArenaExecutorTest, ResultsAreViewsThatOutliveTheRun) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(MakeSetup(GetParam(), &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  cpu::CpuEvaluator ev;
  absl::StatusOr<runtime::StepResult> first = runtime::InterpretPlanned(g, order, *plan, ev, s.feeds);
  ASSERT_TRUE(first.ok()) << first.status();
  const ir::Tensor loss = first->outputs[0].Clone();
  // A second run allocates fresh buffers: the first run's views keep theirs.
  absl::StatusOr<runtime::StepResult> second = runtime::InterpretPlanned(g, order, *plan, ev, s.feeds);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->outputs[0].raw(), second->outputs[0].raw());
  EXPECT_TRUE(first->outputs[0].BitwiseEquals(loss));
  EXPECT_TRUE(second->outputs[0].BitwiseEquals(loss));
}

// The feeds of 0-based step `step`: the step count input is step + 1.
std::vector<ir::Tensor> FeedsOfStep(const ir::Graph& g, std::vector<ir::Tensor> feeds, int64_t step) {
  for (size_t i = 0; i < feeds.size(); ++i) {
    const ir::Value& v = g.value(g.inputs()[i]);
    if (v.shape.empty() && !ir::IsFloat(v.dtype)) feeds[i] = ir::Tensor::Scalar<int64_t>(step + 1).CastTo(v.dtype);
  }
  return feeds;
}

// Three training steps, each applying its state to its graph, through the interpreter and through
// one runner: equal bit for bit at every step. The runner allocates its workspace, arena, gradient,
// parameter and optimizer-state buffers on the first step, a second parameter and optimizer-state
// buffer on the second (the graph still holds the first step's state while the update writes the
// next), and nothing after: the arena is the same buffer at every step, the state buffers alternate.
TEST_P(ArenaExecutorTest, StepsThroughOneRunnerEqualTheInterpreterAndReuseItsBuffers) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(MakeSetup(GetParam(), &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->optimizer_state_bytes, 0);  // every case has momentum or Adam moments
  ir::Graph interpreted = g, planned = g;
  runtime::PlannedRunner runner(order, *plan);
  EXPECT_EQ(runner.buffer_allocations(), 1);  // the workspace
  std::vector<int64_t> allocations;
  std::vector<const void*> loss_at, param_at;
  for (int64_t step = 0; step < 3; ++step) {
    cpu::EvalContext ctx;
    ctx.training = true;
    ctx.seed = 7;
    ctx.offset = static_cast<uint64_t>(step);
    cpu::CpuEvaluator ev(ctx);
    const std::vector<ir::Tensor> feeds = FeedsOfStep(g, s.feeds, step);
    absl::StatusOr<runtime::StepResult> want = runtime::InterpretStep(interpreted, ev, feeds);
    ASSERT_TRUE(want.ok()) << want.status();
    runtime::ArenaStats stats;
    absl::StatusOr<runtime::StepResult> got = runner.Run(planned, ev, feeds, {}, &stats);
    ASSERT_TRUE(got.ok()) << "step " << step << ": " << got.status();
    ASSERT_EQ(got->outputs.size(), want->outputs.size());
    for (size_t i = 0; i < got->outputs.size(); ++i)
      EXPECT_TRUE(got->outputs[i].BitwiseEquals(want->outputs[i])) << "step " << step << ", output " << i;
    ASSERT_EQ(got->state.size(), want->state.size());
    for (size_t i = 0; i < got->state.size(); ++i)
      EXPECT_TRUE(got->state[i].BitwiseEquals(want->state[i]))
          << "step " << step << ", state " << g.value(g.state_updates()[i].state).name;
    EXPECT_TRUE(std::isfinite(want->outputs[0].GetAsDouble(0)));
    EXPECT_EQ(stats.off_plan_allocations, 0) << "step " << step;
    EXPECT_EQ(stats.arena_high_water, plan->arena_bytes) << "step " << step;
    EXPECT_EQ(stats.workspace_high_water, plan->workspace_bytes) << "step " << step;
    allocations.push_back(runner.buffer_allocations());
    loss_at.push_back(got->outputs[0].raw());
    param_at.push_back(got->state[0].raw());
    ASSERT_TRUE(runtime::ApplyStateUpdates(interpreted, std::move(want->state)).ok());
    ASSERT_TRUE(runtime::ApplyStateUpdates(planned, std::move(got->state)).ok());
  }
  EXPECT_EQ(allocations, (std::vector<int64_t>{5, 7, 7}));
  EXPECT_EQ(loss_at[1], loss_at[0]);
  EXPECT_EQ(loss_at[2], loss_at[0]);
  EXPECT_NE(param_at[1], param_at[0]);
  EXPECT_EQ(param_at[2], param_at[0]);
}

// Results a caller still holds are never overwritten: a second run while the first run's results
// are alive writes into other buffers, and both equal (same feeds, same state). Once every result
// is gone, a run reuses the buffers it has.
TEST_P(ArenaExecutorTest, ARunNeverOverwritesResultsACallerHolds) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(MakeSetup(GetParam(), &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  runtime::PlannedRunner runner(order, *plan);
  cpu::CpuEvaluator ev;
  absl::StatusOr<runtime::StepResult> first = runner.Run(g, ev, s.feeds);
  ASSERT_TRUE(first.ok()) << first.status();
  const ir::Tensor loss = first->outputs[0].Clone();
  const ir::Tensor param = first->state[0].Clone();
  const int64_t allocated = runner.buffer_allocations();
  {
    absl::StatusOr<runtime::StepResult> second = runner.Run(g, ev, s.feeds);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_NE(second->outputs[0].raw(), first->outputs[0].raw());
    EXPECT_NE(second->state[0].raw(), first->state[0].raw());
    EXPECT_TRUE(second->outputs[0].BitwiseEquals(loss));
    EXPECT_TRUE(second->state[0].BitwiseEquals(param));
  }
  EXPECT_TRUE(first->outputs[0].BitwiseEquals(loss));
  EXPECT_TRUE(first->state[0].BitwiseEquals(param));
  EXPECT_GT(runner.buffer_allocations(), allocated);
  first = absl::UnknownError("dropped");
  const int64_t pooled = runner.buffer_allocations();
  absl::StatusOr<runtime::StepResult> third = runner.Run(g, ev, s.feeds);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(runner.buffer_allocations(), pooled);
  EXPECT_TRUE(third->outputs[0].BitwiseEquals(loss));
}

INSTANTIATE_TEST_SUITE_P(
    ShippedModels, ArenaExecutorTest,
    ::testing::Values(Case{"tiny_gpt", ir::DType::kF64, autodiff::OptimizerKind::kAdamW},
                      Case{"tiny_gpt", ir::DType::kF32, autodiff::OptimizerKind::kSGD},
                      Case{"tiny_bert", ir::DType::kF64, autodiff::OptimizerKind::kSGD},
                      Case{"tiny_bert", ir::DType::kF32, autodiff::OptimizerKind::kAdamW},
                      Case{"tiny_classifier", ir::DType::kF64, autodiff::OptimizerKind::kSGD},
                      Case{"tiny_classifier", ir::DType::kF32, autodiff::OptimizerKind::kAdamW}),
    CaseName);

// An evaluator whose kernels allocate their own outputs (it ignores the planned slots).
class SlotIgnoringEvaluator : public ir::OpEvaluator {
 public:
  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Node& node,
                                                   const std::vector<ir::Tensor>& inputs) const override {
    return cpu_.Evaluate(node, inputs);
  }

 private:
  cpu::CpuEvaluator cpu_;
};

TEST(ArenaExecutor, RejectsOutputsOutsideTheirSlots) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(
      MakeSetup({"tiny_classifier", ir::DType::kF32, autodiff::OptimizerKind::kSGD}, &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  SlotIgnoringEvaluator ev;
  absl::StatusOr<runtime::StepResult> r = runtime::InterpretPlanned(g, order, *plan, ev, s.feeds);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside its planned slot"), std::string::npos) << r.status();
}

// A plan made without the backend's workspace function: the first kernel that needs scratch is an
// error naming it, not an allocation behind the plan's back.
TEST(ArenaExecutor, RejectsScratchThePlanDidNotReserve) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(MakeSetup({"tiny_gpt", ir::DType::kF32, autodiff::OptimizerKind::kSGD}, &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = partitioner::PlanMemory(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->workspace_bytes, 0);
  cpu::CpuEvaluator ev;
  absl::StatusOr<runtime::StepResult> r = runtime::InterpretPlanned(g, order, *plan, ev, s.feeds);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bytes of workspace"), std::string::npos) << r.status();
}

// A plan that does not fit the feeds (another batch size) is an error naming the input.
TEST(ArenaExecutor, RejectsFeedsThePlanWasNotMadeFor) {
  TrainingStep s;
  ASSERT_NO_FATAL_FAILURE(
      MakeSetup({"tiny_classifier", ir::DType::kF32, autodiff::OptimizerKind::kSGD}, &s));
  const ir::Graph& g = s.trainer->graph();
  const std::vector<ir::NodeId> order = g.LiveNodes();
  absl::StatusOr<partitioner::MemoryPlan> plan = PlanWithWorkspace(g, order);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<ir::Tensor> feeds = s.feeds;
  feeds[0] = ir::Tensor(feeds[0].dtype(), {feeds[0].dims()[0] + 1, feeds[0].dims()[1]});
  cpu::CpuEvaluator ev;
  absl::StatusOr<runtime::StepResult> r = runtime::InterpretPlanned(g, order, *plan, ev, feeds);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(g.value(g.inputs()[0]).name), std::string::npos) << r.status();
}

}  // namespace
}  // namespace onnxpipe
