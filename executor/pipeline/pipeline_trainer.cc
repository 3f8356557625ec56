// The training loop around PipelineExecutor. The training graph comes from train::Trainer so that a
// pipelined run trains exactly the graph the unpartitioned one does (and the graph a partition plan
// was made for); the trainer is dropped once its graph is copied, so the initial parameters are not
// held twice.
#include "executor/pipeline/pipeline_trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "executor/pipeline/plan.h"
#include "executor/pipeline/report.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/writer.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::pipeline {

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
    const bool plan_fp32 = plan.precision == partitioner::Precision::kFP32;
    if (!(plan_fp32 && options.dtype == ir::DType::kF32)) {
      std::fprintf(stderr, "warning: the plan in %s was made for %s and this run trains in %s: its memory "
                   "predictions do not apply\n", p.plan_dir.c_str(), plan_fp32 ? "fp32" : "bf16",
                   std::string(ir::DTypeName(options.dtype)).c_str());
    }
    p.stages = static_cast<int32_t>(plan.num_stages);
    p.microbatches = static_cast<int32_t>(plan.microbatches);
    if (p.schedule.empty()) p.schedule = partitioner::ScheduleName(plan.schedule);
    p.recompute = partitioner::RecomputePolicyName(plan.recompute);
  }
  if (p.stages < 1) return INVALID_ARGUMENT() << "--stages must be >= 1 (or give --plan DIR)";
  if (p.microbatches < 1) p.microbatches = 1;
  if (p.schedule.empty()) p.schedule = "1f1b";
  if (p.recompute.empty()) p.recompute = "none";
  t->recompute_name_ = p.recompute;
  ASSIGN_OR_RETURN(ScheduleKind schedule, ParseScheduleKind(p.schedule));
  ASSIGN_OR_RETURN(RecomputePolicy recompute, ParseRecomputePolicy(p.recompute));
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
    ASSIGN_OR_RETURN(train::Trainer trainer, train::Trainer::Create(forward, mo));
    g = trainer.graph();
    t->unreachable_ = trainer.unreachable_parameters();
    t->num_trainable_ = trainer.num_trainable_parameters();
  }
  if (!options.logits.empty()) {
    const ir::ValueId lv = forward.FindValue(options.logits);
    if (lv != ir::kNoValue && forward.value(lv).shape_known && !forward.value(lv).shape.empty() &&
        forward.value(lv).shape.back().is_concrete()) {
      t->num_classes_ = forward.value(lv).shape.back().value();
    }
  }
  for (ir::ValueId v : g.inputs()) t->input_dtypes_[g.value(v).name] = g.value(v).dtype;

  StageAssignment a;
  if (t->plan_) {
    ASSIGN_OR_RETURN(a, AssignFromPlan(g, *t->plan_));
  } else if (recompute == RecomputePolicy::kAuto) {
    ASSIGN_OR_RETURN(t->plan_, PartitionInProcess(g, p.stages, B, p.microbatches, schedule, recompute, p.device,
                                                  model_name));
    ASSIGN_OR_RETURN(a, AssignFromPlan(g, *t->plan_));
  } else {
    ASSIGN_OR_RETURN(a, AssignContiguous(g, p.stages));
    RETURN_IF_ERROR(MarkRecompute(g, recompute, &a));
  }
  ExecutorOptions eo;
  eo.schedule = schedule;
  eo.microbatches = p.microbatches;
  eo.dropout = options.dropout;
  eo.seed = options.seed;
  eo.check_numerics = options.check_numerics;
  eo.recv_timeout_s = p.recv_timeout_s;
  ASSIGN_OR_RETURN(t->executor_, PipelineExecutor::Create(g, a, eo));
  ASSIGN_OR_RETURN(t->schedule_, autodiff::MakeLrSchedule(options.schedule, options.lr, options.warmup_steps,
                                                          options.steps));
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
  const ExecutorOptions& o = executor_->options();
  return std::to_string(executor_->program().num_stages) + " stages, " + std::to_string(o.microbatches) +
         " micro-batches of " + std::to_string(executor_->microbatch_size()) + ", " + ScheduleKindName(o.schedule) +
         ", recompute " + recompute_name_ + (pipeline_.plan_dir.empty() ? "" : ", plan " + pipeline_.plan_dir);
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

absl::Status RunPipelinedTraining(const std::string& model_path, const ir::Graph& imported,
                                  const std::map<std::string, int64_t>& other_bindings,
                                  const train::TrainOptions& options, train::Dataset data,
                                  const PipelineTrainOptions& pipeline, const std::string& metrics_path,
                                  const std::string& checkpoint_path) {
  ASSIGN_OR_RETURN(std::unique_ptr<PipelineTrainer> trainer,
                   PipelineTrainer::Create(imported, other_bindings, options, pipeline, model_path));
  if (!trainer->unreachable_parameters().empty()) {
    std::string names;
    for (const std::string& n : trainer->unreachable_parameters()) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "warning: not trained (the loss does not depend on them): %s\n", names.c_str());
  }
  RETURN_IF_ERROR(trainer->SetData(std::move(data)));
  std::optional<train::MetricsWriter> metrics;
  if (!metrics_path.empty()) {
    ASSIGN_OR_RETURN(train::MetricsWriter w, train::MetricsWriter::Open(metrics_path));
    metrics.emplace(std::move(w));
  }
  std::printf("training %s: %lld trainable parameters, batch %lld, %lld steps, pipelined: %s\n", model_path.c_str(),
              static_cast<long long>(trainer->num_trainable_parameters()), static_cast<long long>(options.batch),
              static_cast<long long>(options.steps), trainer->Describe().c_str());
  std::fflush(stdout);
  const bool tty = isatty(fileno(stdout));
  for (int64_t k = 0; k < options.steps; ++k) {
    absl::StatusOr<train::StepMetrics> m = trainer->Step();
    if (!m.ok()) {
      if (tty && k > 0) std::printf("\n");
      return m.status();
    }
    if (metrics) RETURN_IF_ERROR(metrics->Write(*m));
    char line[256];
    std::snprintf(line, sizeof(line), "step %lld/%lld  loss %.6g  lr %.4g  grad_norm %.4g  %.1f samples/s",
                  static_cast<long long>(m->step + 1), static_cast<long long>(options.steps), m->loss, m->lr,
                  m->grad_norm, m->samples_per_s);
    std::printf(tty ? "\r%s\x1b[K" : "%s\n", line);
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");
  if (!pipeline.report_dir.empty()) {
    RETURN_IF_ERROR(trainer->WriteReport());
    std::printf("report: %s (measured.json, measured.trace.json, predicted.trace.json, report.txt, report.html)\n",
                pipeline.report_dir.c_str());
  }
  if (!checkpoint_path.empty()) {
    std::map<std::string, ir::Tensor> params;
    for (auto& [name, t] : trainer->Parameters()) {
      const ir::ValueId v = imported.FindValue(name);
      params[name] = v != ir::kNoValue && t.dtype() != imported.value(v).dtype ? t.CastTo(imported.value(v).dtype) : t;
    }
    RETURN_IF_ERROR(onnx_frontend::WriteOnnxWithInitializers(model_path, params, checkpoint_path,
                                                             /*external_threshold_bytes=*/-1));
    std::printf("checkpoint: %s\n", checkpoint_path.c_str());
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
