// The CPU reference training loop.
//
// Trainer::Create turns a prepared forward graph (symbols bound to the batch and sequence length,
// folded and fused: tools/model.h's PrepareModel) into one training graph
//   forward -> cross-entropy loss (frontend/autodiff/loss.h) -> gradients (autodiff.h)
//   -> global gradient norm, optional clipping and the optimizer update (optimizer.h)
// whose outputs are the loss and the gradient norm. Each Step() feeds the step's batch rows
// (dataset.h), the learning rate of the host-side schedule (lr_schedule.h) and the 1-based step
// count, runs the graph once on the CPU backend in its static memory plan (EvalContext training =
// dropout on, seed, offset = step), then stores the new parameter and optimizer-state values into
// the graph's constants (Graph::state_updates()). One runtime::PlannedRunner, made on the first
// step, holds the buffers of every step: the state constants are views of its state buffers, and
// from the second step on nothing is allocated (runtime/arena_executor.h, Ownership).
//
// fp64 (TrainOptions::dtype) converts the whole graph to double before the loss is added; float
// data is converted on the fly. bf16 is mixed precision (passes/mixed_precision.h): bf16
// activations, f32 master weights read through a Cast per use, the loss computed in f32 from logits
// cast to f32, so the gradients, their norm, clipping, the optimizer and its state are f32.
// Nothing here reads files except through Dataset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/arena_executor.h"
#include "executor/runtime/interpreter.h"
#include "executor/train/dataset.h"
#include "executor/train/metrics.h"
#include "executor/train/step_trainer.h"
#include "frontend/autodiff/lr_schedule.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/graph.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::train {

struct TrainOptions {
  int64_t batch = 0;
  int64_t steps = 0;
  autodiff::OptimizerOptions optimizer;
  double lr = 0.0;
  autodiff::LrScheduleKind schedule = autodiff::LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  std::string logits;            // the graph value the loss reads
  std::string labels = "labels"; // the labels' name: graph input and <labels>.npy
  std::string freeze_regex;      // initializers never trained (std::regex_search on their names)
  ir::DType dtype = ir::DType::kF32;  // kF32 | kF64 | kBF16 (mixed precision)
  uint64_t seed = 0;
  bool shuffle = false;
  bool dropout = true;           // false: every Dropout is the identity (EvalContext training off)
  bool check_numerics = false;   // name the first node producing NaN/Inf
  double label_smoothing = 0.0;
  int64_t ignore_index = -100;
};

// What the data folder must hold for a forward graph (as imported, before binding): one field per
// graph input (its dtype and dims after the batch dim) and the labels (int64, the logits' dims
// between the batch and the class dim). Float inputs also accept the other float width.
absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward,
                                                  const std::string& logits,
                                                  const std::string& labels);

// Makes a prepared f32 forward graph compute in the training dtype: kF64 converts every f32 value,
// kBF16 applies passes::MixedPrecision (trainable parameters stay f32 masters; `freeze_regex` names
// the frozen ones as GradOptions does); kF32 leaves it. The evaluation of a trained model uses it too.
absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex);

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

  const ir::Graph& graph() const { return graph_; }
  // The trainable parameters (current values in the training dtype; f32 masters under bf16), by
  // initializer name.
  std::map<std::string, ir::Tensor> Parameters() const override;
  // Float initializers the loss does not depend on (not trained; worth a warning) and those
  // frozen by the regex.
  const std::vector<std::string>& unreachable_parameters() const override { return unreachable_; }
  const std::vector<std::string>& frozen_parameters() const { return frozen_; }
  int64_t num_trainable_parameters() const override;
  int64_t optimizer_state_bytes() const { return optimizer_info_.state_bytes; }
  // The training graph's static memory plan (null before the first step) and what the steps
  // measured: the largest arena and workspace high-water marks and the off-plan allocations of any step.
  const partitioner::MemoryPlan* memory_plan() const { return runner_ ? &runner_->plan() : nullptr; }
  const runtime::ArenaStats& measured_memory() const { return measured_; }

  // Everything a step updates (trainable parameters and optimizer state) by constant name, current values: with
  // step() and the options, all a run needs to continue bit for bit (the data order and the dropout stream are
  // functions of the step).
  std::map<std::string, ir::Tensor> State() const override;
  // Replaces the state (exactly State()'s names, dtypes and dims: an error naming the first difference otherwise)
  // and continues at `step`.
  absl::Status Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) override;

 private:
  enum class Feed { kData, kLabels, kLr, kStep };

  std::vector<ir::Tensor> Feeds(double lr) const;
  absl::StatusOr<runtime::StepResult> Run(const ir::Graph& g, double lr);

  TrainOptions options_;
  ir::Graph graph_;
  autodiff::OptimizerGraphInfo optimizer_info_;
  autodiff::LrSchedule schedule_;
  ir::ValueId loss_ = ir::kNoValue;
  std::vector<Feed> feeds_;              // per graph input
  std::vector<ir::ValueId> params_, grads_;
  std::vector<std::string> unreachable_, frozen_;
  int64_t num_classes_ = 0;
  std::optional<Dataset> data_;
  // graph_'s node order, memory plan and buffers, made on the first step: steps change the state's
  // values, never the graph.
  std::optional<runtime::PlannedRunner> runner_;
  runtime::ArenaStats measured_;
  cpu::CpuEvaluator evaluator_;
  int64_t step_ = 0;
};

}  // namespace onnxpipe::train
