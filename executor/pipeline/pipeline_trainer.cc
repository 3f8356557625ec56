// The trainer around PipelineExecutor (tools/train_loop.h runs its steps). The training graph comes
// from autodiff::BuildTrainingGraph, so that a pipelined run trains exactly the graph the CPU reference
// does (and the graph a partition plan was made for); the executor's stages then own its parameters
// and optimizer state, and nothing else keeps them, so they are held once.
#include "executor/pipeline/pipeline_trainer.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <cstdio>
#include <filesystem>
#include <string>

#include "executor/comm/gather.h"
#include "executor/pipeline/fit_search.h"
#include "executor/pipeline/memory_check.h"
#include "executor/pipeline/report.h"
#include "executor/pipeline/stage_file.h"
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
    if (plan.data_parallel != p.data_parallel) {
      return INVALID_ARGUMENT() << "--data-parallel " << p.data_parallel << " but the plan in " << p.plan_dir
                                << " was made for --data-parallel " << plan.data_parallel
                                << " (re-run onnxpipe partition --data-parallel " << p.data_parallel << ")";
    }
    if (plan.batch * p.data_parallel != options.batch) {
      return INVALID_ARGUMENT() << "--batch " << options.batch
                                << (p.data_parallel > 1 ? " over --data-parallel " + std::to_string(p.data_parallel)
                                                        : std::string())
                                << " but the plan in " << p.plan_dir << " was made for batch " << plan.batch
                                << " per replica (re-run onnxpipe partition)";
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
  if (p.data_parallel < 1) return INVALID_ARGUMENT() << "--data-parallel must be >= 1";
  if (p.world == nullptr && p.data_parallel > 1) {
    return INVALID_ARGUMENT() << "--data-parallel " << p.data_parallel << " needs one process per rank "
                              << "(onnxpipe launch, srun or torchrun)";
  }
  if (p.world != nullptr && p.world->size() != p.stages * p.data_parallel) {
    return INVALID_ARGUMENT() << p.stages << " stages x --data-parallel " << p.data_parallel << " is "
                              << p.stages * p.data_parallel << " ranks, but the world has " << p.world->size();
  }
  const int64_t D = p.data_parallel, B = options.batch, M = p.microbatches;
  if (M * D > B) {
    return INVALID_ARGUMENT() << "--microbatches " << M << (D > 1 ? " x --data-parallel " + std::to_string(D) : "")
                              << " is more than --batch " << B;
  }
  if (B % (M * D) != 0) {
    return INVALID_ARGUMENT() << "--batch " << B << " is not divisible by --microbatches " << M
                              << (D > 1 ? " x --data-parallel " + std::to_string(D) : "")
                              << ": micro-batches must be equal (pick a batch that is a multiple)";
  }
  const int64_t b = B / (M * D);
  const int32_t rank_stage = p.world != nullptr ? p.world->rank() % p.stages : -1;
  partitioner::CompiledPlan compiled;
  ProgramFacts facts;
  if (t->plan_ && p.world != nullptr && std::filesystem::exists(StageFilePath(p.plan_dir, rank_stage))) {
    // A rank of a plan: its stage as the partition wrote it, checked against this run (no training graph here).
    const std::string file = StageFilePath(p.plan_dir, rank_stage);
    ASSIGN_OR_RETURN(LoadedStage stage, ReadStageFile(p.plan_dir, rank_stage, *t->plan_, imported));
    RETURN_IF_ERROR(CheckStageMatchesRun(stage, file, options, imported));
    t->unreachable_ = stage.unreachable;
    t->num_trainable_ = stage.num_trainable;
    t->num_classes_ = stage.num_classes;
    t->input_dtypes_ = stage.input_dtypes;
    std::printf("stage %d: its program from %s (%lld nodes)\n", rank_stage, file.c_str(),
                static_cast<long long>(stage.num_nodes));
    compiled = std::move(stage.plan);
    facts = std::move(stage.facts);
  } else {
    if (t->plan_ && p.world != nullptr) {
      std::printf("stage %d: no stage program in %s (a plan from an older onnxpipe): building the training graph\n",
                  rank_stage, p.plan_dir.c_str());
    }
    // The training graph of one micro-batch, as the trainer (and the partitioner) builds it.
    ASSIGN_OR_RETURN(ir::Graph forward, PrepareMicrobatchForward(imported, "B", b, other_bindings, options.dtype));
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
                    g, p.stages, B / D, p.microbatches, schedule, recompute, p.device, model_name,
                    options.dtype == ir::DType::kBF16 ? partitioner::Precision::kBF16 : partitioner::Precision::kFP32,
                    p.backend ? p.backend : backend::MakeCpuBackend()));
      if (recompute == partitioner::RecomputePolicy::kAuto) t->plan_ = plan;  // its budget is the report's
    }
    ASSIGN_OR_RETURN(compiled, partitioner::CompilePlan(g, plan));
    ASSIGN_OR_RETURN(facts, ProgramFactsOf(g, compiled.program, static_cast<int32_t>(M * D)));
  }
  ExecutorOptions eo;
  eo.dropout = options.dropout;
  eo.seed = options.seed;
  eo.check_numerics = options.check_numerics;
  eo.recv_timeout_s = p.recv_timeout_s;
  eo.graphs = p.graphs;
  eo.world = p.world;
  eo.dp_bucket_bytes = p.dp_bucket_bytes;
  eo.topology = Topology{p.stages, p.data_parallel, p.world ? p.world->rank() : 0};
  // A plan that cannot fit is refused before the executor allocates anything, with how much it needs, how much
  // is free and the smallest change that fits.
  const std::shared_ptr<const backend::Backend> be = p.backend ? p.backend : backend::MakeCpuBackend();
  // With a world comm this process allocates its own stage only.
  ASSIGN_OR_RETURN(PlanMemoryNeed need,
                   PlanAllocationBytes(compiled, *be, p.world != nullptr ? eo.topology.stage() : -1));
  if (absl::Status fits = CheckFits(need, *be, p.memory_budget); !fits.ok()) {
    if (!absl::IsResourceExhausted(fits)) return fits;
    return AddFitAdvice(fits, FitQuery{&imported, &other_bindings, &options, p.stages, p.microbatches, schedule,
                                       recompute, p.device, model_name, be, p.memory_budget});
  }
  ASSIGN_OR_RETURN(t->executor_, PipelineExecutor::Create(std::move(facts), std::move(compiled), eo, p.backend));
  ASSIGN_OR_RETURN(t->schedule_,
                   autodiff::MakeLrSchedule(options.schedule, options.lr, options.warmup_steps, options.steps));
  return t;
}

absl::Status PipelineTrainer::SetData(train::Dataset data) {
  if (next_feed_.valid()) next_feed_.wait();  // a batch of the old data being gathered
  next_step_ = -1;
  if (data.rows() < options_.batch) {
    return INVALID_ARGUMENT() << "the data has " << data.rows() << " rows, fewer than --batch " << options_.batch;
  }
  if (num_classes_ > 0) RETURN_IF_ERROR(data.CheckLabels(options_.labels, num_classes_, options_.ignore_index));
  // Every input this process feeds has, past its rows, the dims its stage was built for (not those of a plan made for
  // another sequence length, say).
  for (const std::string& name : executor_->data_inputs()) {
    const ir::Value* v = executor_->LocalValue(name);
    if (v == nullptr || !v->shape_known || !data.has(name)) continue;
    const std::vector<int64_t>& dims = data.field(name).dims();
    bool same = dims.size() == v->shape.size();
    for (size_t i = 1; same && i < dims.size(); ++i) same = v->shape[i] == ir::Dim(dims[i]);
    if (!same) {
      const std::vector<int64_t> row(dims.begin() + std::min<size_t>(dims.size(), 1), dims.end());
      return INVALID_ARGUMENT() << "data '" << name << "' has rows of " << ir::ShapeToString(ir::FromInts(row))
                                << ", but "
                                << (pipeline_.plan_dir.empty() ? "the training graph" : "the plan in " + pipeline_.plan_dir)
                                << " reads micro-batches of " << ir::ShapeToString(v->shape)
                                << " (re-run onnxpipe partition with this data's --seq)";
    }
  }
  data_ = std::move(data);
  return absl::OkStatus();
}

int64_t PipelineTrainer::num_trainable_parameters() const { return num_trainable_; }

std::string PipelineTrainer::Describe() const {
  return std::to_string(executor_->program().num_stages) + " stages, " + std::to_string(executor_->microbatches()) +
         " micro-batches of " + std::to_string(executor_->microbatch_size()) + ", " +
         partitioner::ScheduleName(executor_->schedule()) + ", recompute " + recompute_name_ +
         (pipeline_.data_parallel > 1 ? ", " + std::to_string(pipeline_.data_parallel) + " data-parallel replicas"
                                      : std::string()) +
         (pipeline_.plan_dir.empty() ? "" : ", plan " + pipeline_.plan_dir) +
         (executor_->backend().name() == "cpu" ? "" : ", backend " + executor_->backend().name());
}

std::map<std::string, ir::Tensor> PipelineTrainer::Parameters() const {
  if (!gathered_) return executor_->Parameters();
  std::map<std::string, ir::Tensor> out;
  for (const auto& [name, stage] : executor_->facts().parameters) {
    if (auto it = gathered_->find(name); it != gathered_->end()) out[name] = it->second;
  }
  return out;
}

std::map<std::string, ir::Tensor> PipelineTrainer::State() const { return gathered_ ? *gathered_ : executor_->State(); }

absl::Status PipelineTrainer::GatherModel() {
  if (pipeline_.world == nullptr) return absl::OkStatus();
  const Topology topo{pipeline_.stages, pipeline_.data_parallel, pipeline_.world->rank()};
  // Replicas hold equal copies: replica 0's stages send theirs to rank 0. Tags above any the executor uses.
  constexpr uint64_t kGatherTag = uint64_t{1} << 60;
  std::vector<int> senders;
  for (int32_t s = 0; s < topo.stages; ++s) senders.push_back(topo.RankOf(s, 0));
  gathered_.reset();
  if (topo.replica() != 0) return absl::OkStatus();
  absl::StatusOr<comm::NamedTensors> all =
      comm::GatherNamedTensors(*pipeline_.world, senders, 0, kGatherTag + (gathers_++ << 32), executor_->State());
  if (!all.ok()) {
    pipeline_.world->Abort(all.status());
    return Annotate(all.status(), topo.Describe() + ": gathering the model on rank 0");
  }
  if (topo.rank == 0) gathered_ = *std::move(all);
  return absl::OkStatus();
}

absl::StatusOr<PipelineTrainer::Feed> PipelineTrainer::Gather(int64_t step) const {
  Feed batch;
  const std::vector<int64_t> rows = data_->BatchRows(step, options_.batch, options_.shuffle, options_.seed);
  for (const std::string& name : executor_->data_inputs()) {
    ir::Tensor x = data_->Gather(name, rows);
    auto it = input_dtypes_.find(name);
    if (it != input_dtypes_.end() && x.dtype() != it->second) x = x.CastTo(it->second);
    batch[name] = std::move(x);
  }
  return batch;
}

absl::StatusOr<train::StepMetrics> PipelineTrainer::Step() {
  RET_CHECK(data_.has_value()) << "SetData before Step";
  const auto begin = std::chrono::steady_clock::now();
  gathered_.reset();  // the step updates the stages' states
  train::StepMetrics m;
  m.step = step_;
  m.lr = schedule_->At(step_);
  StepFeeds feeds;
  feeds.step = step_;
  feeds.lr = m.lr;
  // This step's batch (gathered while the previous step ran, unless the step was moved by a restore), and the next
  // one's on another thread while this step runs.
  absl::StatusOr<Feed> batch = next_feed_.valid() && next_step_ == step_ ? next_feed_.get() : Gather(step_);
  if (next_feed_.valid()) next_feed_.wait();  // a batch gathered for a step that did not come
  RETURN_IF_ERROR(batch.status());
  feeds.batch = *std::move(batch);
  next_step_ = step_ + 1;
  next_feed_ = std::async(std::launch::async, [this, next = next_step_] { return Gather(next); });
  ASSIGN_OR_RETURN(PipelineStepResult r, executor_->Step(feeds));
  m.loss = r.loss;
  m.grad_norm = r.grad_norm;
  // The whole interval since the previous step ended (the loop's work between steps included), as a process's
  // throughput counts it; the executor's own time is in the report.
  const auto end = std::chrono::steady_clock::now();
  m.seconds = std::chrono::duration<double>(end - last_step_end_.value_or(begin)).count();
  last_step_end_ = end;
  m.samples_per_s = m.seconds > 0 ? options_.batch / m.seconds : 0;
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
  if (pipeline_.world == nullptr) return WriteRunReport(pipeline_.report_dir, *executor_, results_, ctx);
  // Replica 0's stages send rank 0 their records (a tensor of JSON bytes each); rank 0 writes the report.
  const Topology topo{pipeline_.stages, pipeline_.data_parallel, pipeline_.world->rank()};
  if (topo.replica() != 0) return absl::OkStatus();
  constexpr uint64_t kReportTag = uint64_t{3} << 59;
  std::vector<int> senders;
  for (int32_t s = 1; s < topo.stages; ++s) senders.push_back(topo.RankOf(s, 0));
  const std::string mine = StageRecordJson(*executor_, results_, topo.stage());
  ir::Tensor bytes(ir::DType::kU8, {static_cast<int64_t>(mine.size())});
  if (!mine.empty()) std::memcpy(bytes.raw(), mine.data(), mine.size());
  absl::StatusOr<comm::NamedTensors> records = comm::GatherNamedTensors(
      *pipeline_.world, senders, 0, kReportTag, {{"stage " + std::to_string(topo.stage()), bytes}});
  if (!records.ok()) return Annotate(records.status(), topo.Describe() + ": collecting the stages' measurements");
  if (topo.rank != 0) return absl::OkStatus();
  std::vector<PipelineStepResult> steps = results_;
  ctx.predicted_memory.resize(topo.stages);
  ctx.predicted_memory[0] = PredictStageMemory(executor_->program().stages[0], executor_->layout(0));
  for (const auto& [name, t] : *records) {
    if (name == "stage 0") continue;  // this rank's own, already in results_
    const std::string record(static_cast<const char*>(t.raw()), static_cast<size_t>(t.num_bytes()));
    RETURN_IF_ERROR(MergeStageRecord(record, &steps, &ctx.predicted_memory));
  }
  return WriteRunReport(pipeline_.report_dir, *executor_, steps, ctx);
}

absl::Status PipelineTrainer::Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) {
  if (step < 0) return INVALID_ARGUMENT() << "cannot continue at step " << step;
  const std::map<std::string, ir::Tensor> current = executor_->State();
  if (pipeline_.world != nullptr) {  // a rank takes its stage's tensors out of the whole model's state
    for (const auto& [name, t] : current) {
      auto it = state.find(name);
      if (it == state.end()) return NOT_FOUND() << "the state has no '" << name << "'";
      RETURN_IF_ERROR(executor_->SetState(name, it->second));
    }
    step_ = step;
    return absl::OkStatus();
  }
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
