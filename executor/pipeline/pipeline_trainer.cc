// The trainer around PipelineExecutor (tools/train_loop.h runs its steps). The training graph comes
// from autodiff::BuildTrainingGraph, so that a pipelined run trains exactly the graph the CPU reference
// does (and the graph a partition plan was made for); the executor's stages then own its parameters
// and optimizer state, and nothing else keeps them, so they are held once.
#include "executor/pipeline/pipeline_trainer.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "executor/pipeline/fit_search.h"
#include "executor/pipeline/memory_check.h"
#include "executor/pipeline/report.h"
#include "frontend/ir/status.h"
#include "partitioner/device.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::pipeline {

absl::StatusOr<partitioner::PartitionPlan> PartitionAtFixedStages(
    const ir::Graph& g, int32_t num_stages, int64_t batch, int32_t microbatches, partitioner::ScheduleKind schedule,
    partitioner::RecomputePolicy recompute, const std::string& device, const std::string& model_name,
    partitioner::Precision precision, std::shared_ptr<const backend::Backend> backend) {
  partitioner::Cluster cluster;
  ASSIGN_OR_RETURN(cluster.device, partitioner::ResolveDevice(device));
  partitioner::PartitionOptions o;
  o.num_stages = num_stages;
  o.batch = batch;
  o.microbatches = microbatches;
  o.schedule = schedule;
  o.recompute = recompute;
  o.precision = precision;
  o.model = model_name;
  if (backend) {
    o.workspace = [backend](const ir::Graph& graph, const ir::Node& n) { return backend->WorkspaceBytes(graph, n); };
  }
  // K is given: the profile chooses the cuts, and the run holds what the plan needs (no memory budget
  // to fit, as without a plan), except for --recompute auto, which trades recompute for the device's memory.
  if (recompute != partitioner::RecomputePolicy::kAuto) o.memory_bytes = int64_t{1} << 60;
  return partitioner::Partition(g, cluster, o);
}

absl::StatusOr<std::unique_ptr<PipelineTrainer>> PipelineTrainer::Create(
    const ir::Graph& imported, const std::map<std::string, int64_t>& other_bindings, const train::TrainOptions& options,
    const PipelineTrainOptions& pipeline, const std::string& model_name) {
  std::unique_ptr<PipelineTrainer> t(new PipelineTrainer());
  t->options_ = options;
  t->pipeline_ = pipeline;
  t->model_name_ = model_name;
  PipelineTrainOptions& p = t->pipeline_;
  if (!p.plan_dir.empty()) {
    ASSIGN_OR_RETURN(t->plan_, partitioner::LoadPlan(p.plan_dir));
    const partitioner::PartitionPlan& plan = *t->plan_;
    if (p.stages > 0 && p.stages != plan.num_stages) {
      return INVALID_ARGUMENT() << "--stages " << p.stages << " but the plan in " << p.plan_dir << " has "
                                << plan.num_stages << " stages";
    }
    if (p.microbatches > 0 && p.microbatches != plan.microbatches) {
      return INVALID_ARGUMENT() << "--microbatches " << p.microbatches << " but the plan was made for "
                                << plan.microbatches;
    }
    if (plan.batch != options.batch) {
      return INVALID_ARGUMENT() << "--batch " << options.batch << " but the plan in " << p.plan_dir
                                << " was made for batch " << plan.batch << " (re-run onnxpipe partition)";
    }
    if (!p.recompute.empty() && p.recompute != partitioner::RecomputePolicyName(plan.recompute)) {
      return INVALID_ARGUMENT() << "--recompute " << p.recompute << " but the plan's regions are for '"
                                << partitioner::RecomputePolicyName(plan.recompute) << "'";
    }
    if (!p.schedule.empty() && p.schedule != partitioner::ScheduleName(plan.schedule)) {
      return INVALID_ARGUMENT() << "--schedule " << p.schedule << " but the plan in " << p.plan_dir << " was made for "
                                << partitioner::ScheduleName(plan.schedule)
                                << " (its memory and action lists are the schedule's; re-run onnxpipe partition)";
    }
    // A bf16 training graph has other nodes (its Casts) than an fp32 one: the plan must be its own.
    const bool plan_bf16 = plan.precision == partitioner::Precision::kBF16;
    if (plan_bf16 != (options.dtype == ir::DType::kBF16)) {
      return INVALID_ARGUMENT() << "--dtype " << (options.dtype == ir::DType::kBF16 ? "bf16" : "fp32/fp64")
                                << " but the plan in " << p.plan_dir << " was made for "
                                << partitioner::PrecisionName(plan.precision) << " (re-run onnxpipe partition with "
                                << "the same --dtype)";
    }
    if (options.dtype == ir::DType::kF64) {
      std::fprintf(stderr,
                   "warning: the plan in %s was made for fp32 and this run trains in fp64: its memory "
                   "predictions do not apply\n",
                   p.plan_dir.c_str());
    }
    p.stages = static_cast<int32_t>(plan.num_stages);
    p.microbatches = static_cast<int32_t>(plan.microbatches);
    p.schedule = partitioner::ScheduleName(plan.schedule);
    p.recompute = partitioner::RecomputePolicyName(plan.recompute);
  }
  if (p.stages < 1) return INVALID_ARGUMENT() << "--stages must be >= 1 (or give --plan DIR)";
  if (p.microbatches < 1) p.microbatches = 1;
  if (p.schedule.empty()) p.schedule = "1f1b";
  if (p.recompute.empty()) p.recompute = "none";
  t->recompute_name_ = p.recompute;
  ASSIGN_OR_RETURN(partitioner::ScheduleKind schedule, partitioner::ParseSchedule(p.schedule));
  ASSIGN_OR_RETURN(partitioner::RecomputePolicy recompute, partitioner::ParseRecomputePolicy(p.recompute));
  const int64_t B = options.batch, M = p.microbatches;
  if (M > B) return INVALID_ARGUMENT() << "--microbatches " << M << " is more than --batch " << B;
  if (B % M != 0) {
    return INVALID_ARGUMENT() << "--batch " << B << " is not divisible by --microbatches " << M
                              << ": micro-batches must be equal (pick M dividing B)";
  }
  const int64_t b = B / M;

  // The training graph of one micro-batch, as the trainer (and the partitioner) builds it.
  ASSIGN_OR_RETURN(ir::Graph forward, PrepareMicrobatchForward(imported, "B", b, other_bindings));
  train::TrainOptions mo = options;
  mo.batch = b;
  ir::Graph g;
  {
    ASSIGN_OR_RETURN(autodiff::TrainingGraph tg, autodiff::BuildTrainingGraph(forward, mo));
    t->unreachable_ = tg.unreachable;
    t->num_trainable_ = tg.num_trainable_parameters();
    t->num_classes_ = tg.num_classes;
    g = std::move(tg.graph);
  }
  for (ir::ValueId v : g.inputs()) t->input_dtypes_[g.value(v).name] = g.value(v).dtype;

  // --plan runs the plan as written; --stages K asks the partitioner for one at fixed K.
  partitioner::PartitionPlan plan;
  if (t->plan_) {
    plan = *t->plan_;
  } else {
    ASSIGN_OR_RETURN(
        plan, PartitionAtFixedStages(
                  g, p.stages, B, p.microbatches, schedule, recompute, p.device, model_name,
                  options.dtype == ir::DType::kBF16 ? partitioner::Precision::kBF16 : partitioner::Precision::kFP32,
                  p.backend ? p.backend : backend::MakeCpuBackend()));
    if (recompute == partitioner::RecomputePolicy::kAuto) t->plan_ = plan;  // its budget is the report's
  }
  ASSIGN_OR_RETURN(partitioner::CompiledPlan compiled, partitioner::CompilePlan(g, plan));
  ExecutorOptions eo;
  eo.dropout = options.dropout;
  eo.seed = options.seed;
  eo.check_numerics = options.check_numerics;
  eo.recv_timeout_s = p.recv_timeout_s;
  eo.graphs = p.graphs;
  // A plan that cannot fit is refused before the executor allocates anything, with how much it needs, how much
  // is free and the smallest change that fits.
  const std::shared_ptr<const backend::Backend> be = p.backend ? p.backend : backend::MakeCpuBackend();
  ASSIGN_OR_RETURN(const PlanMemoryNeed need, PlanAllocationBytes(compiled, *be));
  if (absl::Status fits = CheckFits(need, *be); !fits.ok()) {
    if (!absl::IsResourceExhausted(fits)) return fits;
    return AddFitAdvice(fits, FitQuery{&imported, &other_bindings, &options, p.stages, p.microbatches, schedule,
                                       recompute, p.device, model_name, be});
  }
  ASSIGN_OR_RETURN(t->executor_, PipelineExecutor::Create(g, std::move(compiled), eo, p.backend));
  ASSIGN_OR_RETURN(t->schedule_,
                   autodiff::MakeLrSchedule(options.schedule, options.lr, options.warmup_steps, options.steps));
  return t;
}

absl::Status PipelineTrainer::SetData(train::Dataset data) {
  if (data.rows() < options_.batch) {
    return INVALID_ARGUMENT() << "the data has " << data.rows() << " rows, fewer than --batch " << options_.batch;
  }
  if (num_classes_ > 0) RETURN_IF_ERROR(data.CheckLabels(options_.labels, num_classes_, options_.ignore_index));
  data_ = std::move(data);
  return absl::OkStatus();
}

int64_t PipelineTrainer::num_trainable_parameters() const { return num_trainable_; }

std::string PipelineTrainer::Describe() const {
  return std::to_string(executor_->program().num_stages) + " stages, " + std::to_string(executor_->microbatches()) +
         " micro-batches of " + std::to_string(executor_->microbatch_size()) + ", " +
         partitioner::ScheduleName(executor_->schedule()) + ", recompute " + recompute_name_ +
         (pipeline_.plan_dir.empty() ? "" : ", plan " + pipeline_.plan_dir) +
         (executor_->backend().name() == "cpu" ? "" : ", backend " + executor_->backend().name());
}

absl::StatusOr<train::StepMetrics> PipelineTrainer::Step() {
  RET_CHECK(data_.has_value()) << "SetData before Step";
  train::StepMetrics m;
  m.step = step_;
  m.lr = schedule_->At(step_);
  StepFeeds feeds;
  feeds.step = step_;
  feeds.lr = m.lr;
  const std::vector<int64_t> rows = data_->BatchRows(step_, options_.batch, options_.shuffle, options_.seed);
  for (const std::string& name : executor_->data_inputs()) {
    ir::Tensor x = data_->Gather(name, rows);
    auto it = input_dtypes_.find(name);
    if (it != input_dtypes_.end() && x.dtype() != it->second) x = x.CastTo(it->second);
    feeds.batch[name] = std::move(x);
  }
  ASSIGN_OR_RETURN(PipelineStepResult r, executor_->Step(feeds));
  m.loss = r.loss;
  m.grad_norm = r.grad_norm;
  m.seconds = r.seconds;
  m.samples_per_s = r.seconds > 0 ? options_.batch / r.seconds : 0;
  // Keep every step's measurements but only the latest trace (the report draws one step).
  if (!results_.empty()) results_.back().trace.clear();
  results_.push_back(std::move(r));
  ++step_;
  return m;
}

absl::Status PipelineTrainer::WriteReport() const {
  if (pipeline_.report_dir.empty()) return absl::OkStatus();
  ReportContext ctx;
  ctx.model = model_name_;
  ctx.plan = plan_ ? &*plan_ : nullptr;
  ctx.plan_dir = pipeline_.plan_dir;
  return WriteRunReport(pipeline_.report_dir, *executor_, results_, ctx);
}

absl::Status PipelineTrainer::Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) {
  if (step < 0) return INVALID_ARGUMENT() << "cannot continue at step " << step;
  const std::map<std::string, ir::Tensor> current = executor_->State();
  if (state.size() != current.size()) {
    return INVALID_ARGUMENT() << "the state holds " << state.size() << " tensors; the pipeline's stages update "
                              << current.size();
  }
  for (const auto& [name, t] : current) {
    if (!state.count(name)) return NOT_FOUND() << "the state has no '" << name << "'";
  }
  for (const auto& [name, t] : state) RETURN_IF_ERROR(executor_->SetState(name, t));
  step_ = step;
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
