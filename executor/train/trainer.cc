// Builds the training graph once and runs it step by step on the CPU interpreter. Keeping the
// whole step (loss, backward, norm, update) in one graph means the partitioned and planned
// executors run exactly what this reference runs.
#include "executor/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "executor/cpu/workspace.h"
#include "executor/runtime/arena_executor.h"
#include "executor/runtime/interpreter.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/passes/mixed_precision.h"

namespace onnxpipe::train {
namespace {

ir::DType OtherFloat(ir::DType t) { return t == ir::DType::kF32 ? ir::DType::kF64 : ir::DType::kF32; }

// --no-dropout: the model as PyTorch rebuilds it with p = 0. Setting the ratios to 0 before
// autodiff (rather than only running the forward in inference mode) keeps the backward consistent:
// DropoutGrad scales by 1 / (1 - ratio).
void DisableDropout(ir::Graph& g) {
  for (ir::NodeId id : g.LiveNodes()) {
    ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::kDropout) n.attrs.Set("ratio", 0.0);
    if (n.op == ir::OpKind::kAttention && n.attrs.Has("dropout")) n.attrs.Set("dropout", 0.0);
  }
}

// g's node order, its memory plan with the CPU kernels' workspace, and the buffers to run it in.
absl::StatusOr<runtime::PlannedRunner> PlannedCpuRunner(const ir::Graph& g) {
  std::vector<ir::NodeId> order = g.LiveNodes();
  partitioner::MemoryPlanOptions options;
  options.workspace_bytes = cpu::CpuWorkspaceBytes;
  ASSIGN_OR_RETURN(partitioner::MemoryPlan plan, partitioner::PlanMemory(g, order, options));
  return runtime::PlannedRunner(std::move(order), std::move(plan));
}

// The value the loss reads: `logits`, or an f32 Cast of it when the graph computes it in half
// precision (the loss and its gradient run in f32). A graph with its own loss keeps it.
std::string F32Logits(ir::Graph& g, const std::string& logits) {
  const ir::ValueId v = g.FindValue(logits);
  if (v == ir::kNoValue || !ir::IsHalf(g.value(v).dtype) || autodiff::FindExistingLoss(g) != ir::kNoValue) {
    return logits;
  }
  const ir::Value& val = g.value(v);
  const std::string name = g.UniqueName(logits + "/f32");
  const ir::ValueId wide = g.AddValue(name, ir::DType::kF32, val.shape, val.shape_known);
  ir::Attrs a;
  a.Set("to", std::string(ir::DTypeName(ir::DType::kF32)));
  g.AddNode(ir::OpKind::kCast, name, {v}, {wide}, std::move(a));
  return name;
}

}  // namespace

absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex) {
  switch (dtype) {
    case ir::DType::kF32:
      return absl::OkStatus();
    case ir::DType::kF64:
      return ir::ConvertFloatPrecision(g, ir::DType::kF32, ir::DType::kF64);
    case ir::DType::kBF16:
      return passes::MixedPrecision({.compute = dtype, .freeze_regex = freeze_regex}).Run(&g).status();
    default:
      return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(dtype);
  }
}

absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward,
                                                  const std::string& logits,
                                                  const std::string& labels) {
  std::vector<FieldSpec> fields;
  bool labels_is_input = false;
  for (ir::ValueId v : forward.inputs()) {
    const ir::Value& val = forward.value(v);
    if (!val.shape_known || val.shape.empty()) {
      return INVALID_ARGUMENT() << "model input '" << val.name << "' has "
                                << (val.shape_known ? "rank 0" : "no known shape")
                                << "; training data needs a leading batch dim";
    }
    FieldSpec f;
    f.name = val.name;
    f.dtype = val.dtype;
    f.row_shape.assign(val.shape.begin() + 1, val.shape.end());
    if (val.dtype == ir::DType::kF32 || val.dtype == ir::DType::kF64) {
      f.also_accept.push_back(OtherFloat(val.dtype));
    }
    if (val.name == labels) labels_is_input = true;
    fields.push_back(std::move(f));
  }
  if (labels_is_input || autodiff::FindExistingLoss(forward) != ir::kNoValue) return fields;
  const ir::ValueId lv = forward.FindValue(logits);
  if (lv == ir::kNoValue) {
    std::string outs;
    for (ir::ValueId o : forward.outputs()) outs += (outs.empty() ? "'" : ", '") + forward.value(o).name + "'";
    return NOT_FOUND() << "--logits '" << logits << "' is not a value of the model (its outputs: "
                       << outs << ")";
  }
  const ir::Value& l = forward.value(lv);
  if (!l.shape_known || l.shape.size() < 2 || l.shape.size() > 3) {
    return INVALID_ARGUMENT() << "--logits '" << logits << "' has shape " << ir::ShapeToString(l.shape)
                              << "; expected (B, C) or (B, S, V)";
  }
  FieldSpec f;
  f.name = labels;
  f.dtype = ir::DType::kI64;
  f.row_shape.assign(l.shape.begin() + 1, l.shape.end() - 1);
  f.also_accept = {ir::DType::kI32};
  fields.push_back(std::move(f));
  return fields;
}

absl::StatusOr<Trainer> Trainer::Create(const ir::Graph& forward, const TrainOptions& options) {
  if (options.batch < 1) return INVALID_ARGUMENT() << "--batch must be >= 1, got " << options.batch;
  if (options.dtype != ir::DType::kF32 && options.dtype != ir::DType::kF64 && options.dtype != ir::DType::kBF16) {
    return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(options.dtype);
  }
  Trainer t;
  t.options_ = options;
  ASSIGN_OR_RETURN(t.schedule_, autodiff::MakeLrSchedule(options.schedule, options.lr,
                                                         options.warmup_steps, options.steps));
  ir::Graph& g = t.graph_;
  g = forward;
  RETURN_IF_ERROR(SetTrainingDType(g, options.dtype, options.freeze_regex));
  if (!options.dropout) DisableDropout(g);

  // Phase 1: the loss, in f32 under mixed precision.
  autodiff::CrossEntropyOptions ce;
  ce.ignore_index = options.ignore_index;
  ce.label_smoothing = options.label_smoothing;
  const std::string logits = F32Logits(g, options.logits);
  ASSIGN_OR_RETURN(autodiff::LossInfo loss, autodiff::AddCrossEntropyLoss(&g, logits, options.labels, ce));
  t.loss_ = loss.loss;
  if (!loss.existing) {
    const ir::Value& lv = g.value(g.FindValue(logits));
    const ir::Dim classes = lv.shape.back();
    if (!classes.is_concrete()) {
      return INVALID_ARGUMENT() << "--logits '" << options.logits << "' has a symbolic class dim "
                                << ir::ShapeToString(lv.shape);
    }
    t.num_classes_ = classes.value();
  }

  // Phase 2: gradients.
  autodiff::GradOptions go;
  go.freeze_regex = options.freeze_regex;
  ASSIGN_OR_RETURN(autodiff::TrainingGraphInfo grads, autodiff::BuildGradients(&g, t.loss_, go));
  for (ir::ValueId v : grads.unreachable_params) t.unreachable_.push_back(g.value(v).name);
  for (ir::ValueId v : grads.frozen_params) t.frozen_.push_back(g.value(v).name);
  for (const autodiff::ParamGrad& pg : grads.param_grads) {
    t.params_.push_back(pg.param);
    t.grads_.push_back(pg.grad);
  }

  // Phase 3: norm, clipping, update.
  ASSIGN_OR_RETURN(t.optimizer_info_, autodiff::AddOptimizer(&g, grads.param_grads, options.optimizer));

  // Phase 4: the step's outputs are the loss and the norm only, so that the interpreter frees
  // the logits and gradients as soon as the update has read them.
  g.outputs() = {t.loss_, t.optimizer_info_.grad_norm};
  for (ir::ValueId in : g.inputs()) {
    if (in == t.optimizer_info_.lr) {
      t.feeds_.push_back(Feed::kLr);
    } else if (in == t.optimizer_info_.step) {
      t.feeds_.push_back(Feed::kStep);
    } else if (in == loss.labels && !loss.existing) {
      t.feeds_.push_back(Feed::kLabels);
    } else {
      t.feeds_.push_back(Feed::kData);
    }
  }
  return t;
}

absl::Status Trainer::SetData(Dataset data) {
  if (data.rows() < options_.batch) {
    return INVALID_ARGUMENT() << "the data has " << data.rows() << " rows, fewer than --batch "
                              << options_.batch;
  }
  if (num_classes_ > 0) {
    RETURN_IF_ERROR(data.CheckLabels(options_.labels, num_classes_, options_.ignore_index));
  }
  data_ = std::move(data);
  return absl::OkStatus();
}

int64_t Trainer::num_trainable_parameters() const {
  int64_t n = 0;
  for (ir::ValueId p : params_) n += graph_.value(p).constant->num_elements();
  return n;
}

std::map<std::string, ir::Tensor> Trainer::Parameters() const {
  std::map<std::string, ir::Tensor> out;
  for (ir::ValueId p : params_) out[graph_.value(p).name] = *graph_.value(p).constant;
  return out;
}

std::map<std::string, ir::Tensor> Trainer::State() const {
  std::map<std::string, ir::Tensor> out;
  for (const ir::Graph::StateUpdate& u : graph_.state_updates()) {
    out[graph_.value(u.state).name] = *graph_.value(u.state).constant;
  }
  return out;
}

absl::Status Trainer::Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) {
  if (step < 0) return INVALID_ARGUMENT() << "cannot continue at step " << step;
  if (state.size() != graph_.state_updates().size()) {
    return INVALID_ARGUMENT() << "the state holds " << state.size() << " tensors; the training graph updates "
                              << graph_.state_updates().size();
  }
  for (const ir::Graph::StateUpdate& u : graph_.state_updates()) {
    const ir::Value& v = graph_.value(u.state);
    auto it = state.find(v.name);
    if (it == state.end()) return NOT_FOUND() << "the state has no '" << v.name << "'";
    if (it->second.dtype() != v.constant->dtype() || it->second.dims() != v.constant->dims()) {
      return INVALID_ARGUMENT() << "state '" << v.name << "' is " << ir::DTypeName(it->second.dtype())
                                << ", expected " << ir::DTypeName(v.constant->dtype()) << " of the same dims";
    }
  }
  for (const ir::Graph::StateUpdate& u : graph_.state_updates()) {
    graph_.value(u.state).constant = state.at(graph_.value(u.state).name).Clone();
  }
  step_ = step;
  return absl::OkStatus();
}

std::vector<ir::Tensor> Trainer::Feeds(double lr) const {
  const std::vector<int64_t> rows =
      data_->BatchRows(step_, options_.batch, options_.shuffle, options_.seed);
  std::vector<ir::Tensor> feeds;
  for (size_t i = 0; i < feeds_.size(); ++i) {
    const ir::Value& in = graph_.value(graph_.inputs()[i]);
    switch (feeds_[i]) {
      case Feed::kLr:
        feeds.push_back(ir::Tensor::Scalar<double>(lr));
        break;
      case Feed::kStep:
        feeds.push_back(ir::Tensor::Scalar<int64_t>(step_ + 1));
        break;
      case Feed::kLabels:
      case Feed::kData: {
        ir::Tensor t = data_->Gather(in.name, rows);
        if (t.dtype() != in.dtype) t = t.CastTo(in.dtype);
        feeds.push_back(std::move(t));
        break;
      }
    }
  }
  return feeds;
}

absl::StatusOr<runtime::StepResult> Trainer::Run(const ir::Graph& g, double lr) {
  RET_CHECK(data_.has_value()) << "SetData before Step";
  cpu::EvalContext ctx;
  ctx.training = options_.dropout;
  ctx.seed = options_.seed;
  ctx.offset = static_cast<uint64_t>(step_);
  evaluator_.set_context(ctx);
  runtime::InterpreterOptions iopts;
  iopts.check_numerics = options_.check_numerics;
  // Kernels run in place in the statically planned arena (zero-copy, exactly the planned bytes).
  // graph_'s runner is made on its first step and kept; other graphs (Gradients()) get one per call.
  const bool cached = &g == &graph_;
  std::optional<runtime::PlannedRunner> once;
  if (!cached || !runner_) {
    absl::StatusOr<runtime::PlannedRunner> made = PlannedCpuRunner(g);
    if (!made.ok()) return Annotate(made.status(), "step " + std::to_string(step_));
    (cached ? runner_ : once).emplace(*std::move(made));
  }
  runtime::ArenaStats stats;
  absl::StatusOr<runtime::StepResult> r =
      (cached ? *runner_ : *once).Run(g, evaluator_, Feeds(lr), iopts, &stats);
  if (!r.ok()) return Annotate(r.status(), "step " + std::to_string(step_));
  if (cached) {
    measured_.arena_bytes = stats.arena_bytes;
    measured_.gradient_bytes = stats.gradient_bytes;
    measured_.state_bytes = stats.state_bytes;
    measured_.workspace_bytes = stats.workspace_bytes;
    measured_.arena_high_water = std::max(measured_.arena_high_water, stats.arena_high_water);
    measured_.workspace_high_water = std::max(measured_.workspace_high_water, stats.workspace_high_water);
    measured_.off_plan_allocations += stats.off_plan_allocations;
  }
  return r;
}

absl::StatusOr<std::map<std::string, ir::Tensor>> Trainer::Gradients() {
  // A copy whose outputs are the gradients (constants share their storage, so it is cheap).
  ir::Graph g = graph_;
  g.outputs() = grads_;
  ASSIGN_OR_RETURN(runtime::StepResult r, Run(g, schedule_.At(step_)));
  std::map<std::string, ir::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) out[graph_.value(params_[i]).name] = r.outputs[i];
  return out;
}

absl::StatusOr<StepMetrics> Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  StepMetrics m;
  m.step = step_;
  m.lr = schedule_.At(step_);
  ASSIGN_OR_RETURN(runtime::StepResult r, Run(graph_, m.lr));
  m.loss = r.outputs[0].GetAsDouble(0);
  m.grad_norm = r.outputs[1].GetAsDouble(0);
  if (!std::isfinite(m.loss)) {
    return FAILED_PRECONDITION() << "step " << step_ << ": the loss is " << m.loss
                                 << "; rerun with --check-numerics to name the first node that "
                                    "produces a non-finite value";
  }
  RETURN_IF_ERROR(runtime::ApplyStateUpdates(graph_, std::move(r.state)));
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.samples_per_s = m.seconds > 0 ? options_.batch / m.seconds : 0;
  ++step_;
  return m;
}

}  // namespace onnxpipe::train
