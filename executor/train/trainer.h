// The CPU reference training loop: the training graph (training_graph.h) interpreted node by node on host tensors
// (runtime/interpreter.h), the new parameter and optimizer-state values stored back into the graph's constants
// (Graph::state_updates()). Each Step() feeds the step's batch rows (dataset.h), the learning rate of the host-side
// schedule (lr_schedule.h) and the 1-based step count, with EvalContext training = dropout on, seed, offset = step.
//
// It is the independent reference that the planned executors are checked against bit for bit (tests/pipeline) and
// that the golden tests check against PyTorch. `onnxpipe train` runs the same graph through the stage executor
// (executor/pipeline; one stage unless asked), which holds the parameters and optimizer state once, in planned
// memory; this reference holds the old and the new state during a step. Nothing here reads files except through
// Dataset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/interpreter.h"
#include "executor/train/dataset.h"
#include "executor/train/metrics.h"
#include "executor/train/step_trainer.h"
#include "executor/train/training_graph.h"
#include "frontend/autodiff/lr_schedule.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

class Trainer : public StepTrainer {
 public:
  static absl::StatusOr<Trainer> Create(const ir::Graph& forward, const TrainOptions& options);

  // Checks the data against the training graph (rows >= batch, labels in [0, classes) or the
  // ignore index) and keeps it.
  absl::Status SetData(Dataset data) override;

  // Runs step step() and advances. The metrics' loss is the batch loss before the update.
  absl::StatusOr<StepMetrics> Step() override;
  int64_t step() const override { return step_; }

  // The gradient of every trainable parameter for step step()'s batch, without updating
  // anything (for checks against a reference; Step() computes them as part of the update).
  absl::StatusOr<std::map<std::string, ir::Tensor>> Gradients();

  const ir::Graph& graph() const { return tg_.graph; }
  // The trainable parameters (current values in the training dtype; f32 masters under bf16), by
  // initializer name.
  std::map<std::string, ir::Tensor> Parameters() const override;
  // Float initializers the loss does not depend on (not trained; worth a warning).
  const std::vector<std::string>& unreachable_parameters() const override { return tg_.unreachable; }
  int64_t num_trainable_parameters() const override { return tg_.num_trainable_parameters(); }
  int64_t optimizer_state_bytes() const { return tg_.optimizer.state_bytes; }

  // Everything a step updates (trainable parameters and optimizer state) by constant name, current values: with
  // step() and the options, all a run needs to continue bit for bit (the data order and the dropout stream are
  // functions of the step).
  std::map<std::string, ir::Tensor> State() const override;
  // Replaces the state (exactly State()'s names, dtypes and dims: an error naming the first difference otherwise)
  // and continues at `step`.
  absl::Status Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) override;

 private:
  absl::StatusOr<runtime::StepResult> Run(const ir::Graph& g, double lr);

  TrainOptions options_;
  autodiff::TrainingGraph tg_;
  autodiff::LrSchedule schedule_;
  std::optional<Dataset> data_;
  cpu::CpuEvaluator evaluator_;
  int64_t step_ = 0;
};

}  // namespace onnxpipe::train
