// The reference steps: the interpreter over the training graph, the state updates applied to its
// constants.
#include "executor/train/trainer.h"

#include <chrono>
#include <cmath>

#include "frontend/ir/status.h"

namespace onnxpipe::train {

absl::StatusOr<Trainer> Trainer::Create(const ir::Graph& forward, const TrainOptions& options) {
  Trainer t;
  t.options_ = options;
  ASSIGN_OR_RETURN(t.schedule_,
                   autodiff::MakeLrSchedule(options.schedule, options.lr, options.warmup_steps, options.steps));
  if (options.batch < 1) return INVALID_ARGUMENT() << "--batch must be >= 1, got " << options.batch;
  ASSIGN_OR_RETURN(t.tg_, autodiff::BuildTrainingGraph(forward, options));
  return t;
}

absl::Status Trainer::SetData(Dataset data) {
  if (data.rows() < options_.batch) {
    return INVALID_ARGUMENT() << "the data has " << data.rows() << " rows, fewer than --batch " << options_.batch;
  }
  if (tg_.num_classes > 0) {
    RETURN_IF_ERROR(data.CheckLabels(options_.labels, tg_.num_classes, options_.ignore_index));
  }
  data_ = std::move(data);
  return absl::OkStatus();
}

std::map<std::string, ir::Tensor> Trainer::Parameters() const {
  std::map<std::string, ir::Tensor> out;
  for (ir::ValueId p : tg_.params) out[tg_.graph.value(p).name] = *tg_.graph.value(p).constant;
  return out;
}

std::map<std::string, ir::Tensor> Trainer::State() const {
  std::map<std::string, ir::Tensor> out;
  for (const ir::Graph::StateUpdate& u : tg_.graph.state_updates()) {
    out[tg_.graph.value(u.state).name] = *tg_.graph.value(u.state).constant;
  }
  return out;
}

absl::Status Trainer::Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) {
  ir::Graph& g = tg_.graph;
  if (step < 0) return INVALID_ARGUMENT() << "cannot continue at step " << step;
  if (state.size() != g.state_updates().size()) {
    return INVALID_ARGUMENT() << "the state holds " << state.size() << " tensors; the training graph updates "
                              << g.state_updates().size();
  }
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::Value& v = g.value(u.state);
    auto it = state.find(v.name);
    if (it == state.end()) return NOT_FOUND() << "the state has no '" << v.name << "'";
    if (it->second.dtype() != v.constant->dtype() || it->second.dims() != v.constant->dims()) {
      return INVALID_ARGUMENT() << "state '" << v.name << "' is " << ir::DTypeName(it->second.dtype()) << ", expected "
                                << ir::DTypeName(v.constant->dtype()) << " of the same dims";
    }
  }
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    g.value(u.state).constant = state.at(g.value(u.state).name).Clone();
  }
  step_ = step;
  return absl::OkStatus();
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
  absl::StatusOr<runtime::StepResult> r =
      runtime::InterpretStep(g, evaluator_, StepInputs(tg_, *data_, options_, step_, lr), iopts);
  if (!r.ok()) return Annotate(r.status(), "step " + std::to_string(step_));
  return r;
}

absl::StatusOr<std::map<std::string, ir::Tensor>> Trainer::Gradients() {
  // A copy whose outputs are the gradients (constants share their storage, so it is cheap).
  ir::Graph g = tg_.graph;
  g.outputs() = tg_.grads;
  ASSIGN_OR_RETURN(runtime::StepResult r, Run(g, schedule_.At(step_)));
  std::map<std::string, ir::Tensor> out;
  for (size_t i = 0; i < tg_.params.size(); ++i) out[tg_.graph.value(tg_.params[i]).name] = r.outputs[i];
  return out;
}

absl::StatusOr<StepMetrics> Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  StepMetrics m;
  m.step = step_;
  m.lr = schedule_.At(step_);
  ASSIGN_OR_RETURN(runtime::StepResult r, Run(tg_.graph, m.lr));
  m.loss = r.outputs[0].GetAsDouble(0);
  m.grad_norm = r.outputs[1].GetAsDouble(0);
  if (!std::isfinite(m.loss)) {
    return FAILED_PRECONDITION() << "step " << step_ << ": the loss is " << m.loss
                                 << "; rerun with --check-numerics to name the first node that "
                                    "produces a non-finite value";
  }
  RETURN_IF_ERROR(runtime::ApplyStateUpdates(tg_.graph, std::move(r.state)));
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.samples_per_s = m.seconds > 0 ? options_.batch / m.seconds : 0;
  ++step_;
  return m;
}

}  // namespace onnxpipe::train
