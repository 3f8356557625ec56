// What the step loop of `onnxpipe train` (tools/train_loop.h), its checkpoints (train_checkpoint.h), --eval and
// --save need from a trainer. pipeline::PipelineTrainer (the training graph as K stages over M micro-batches; one
// stage by default: what `onnxpipe train` runs) and train::Trainer (the CPU reference, interpreting the same graph)
// both implement it, so one loop drives either and a checkpoint of one resumes the other.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/train/dataset.h"
#include "executor/train/metrics.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::train {

class StepTrainer {
 public:
  virtual ~StepTrainer() = default;

  // Checks the data against the training graph (rows >= batch, labels in [0, classes) or the ignore index) and
  // keeps it.
  virtual absl::Status SetData(Dataset data) = 0;
  // Runs step step() and advances. The metrics' loss is the batch loss before the update.
  virtual absl::StatusOr<StepMetrics> Step() = 0;
  virtual int64_t step() const = 0;

  // The trainable parameters (current values, the training dtype), by initializer name.
  virtual std::map<std::string, ir::Tensor> Parameters() const = 0;
  virtual int64_t num_trainable_parameters() const = 0;
  // Float initializers the loss does not depend on (not trained; worth a warning).
  virtual const std::vector<std::string>& unreachable_parameters() const = 0;

  // Everything a step updates (trainable parameters and optimizer state) by constant name, current values: with
  // step() and the options, all a run needs to continue bit for bit (the data order, the shuffle permutation, the
  // learning rate and the dropout stream are functions of the step).
  virtual std::map<std::string, ir::Tensor> State() const = 0;
  // State()'s names, dtypes and dims for the whole model, where a trainer holds only part of it (one rank of a
  // multi-process run): what a checkpoint must hold. Values may be absent (Tensor::DimsOnly).
  virtual std::map<std::string, ir::Tensor> StateShapes() const { return State(); }
  // Replaces the state (exactly State()'s names, dtypes and dims: an error naming the first difference otherwise)
  // and continues at `step`.
  virtual absl::Status Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) = 0;

 protected:
  StepTrainer() = default;
  StepTrainer(const StepTrainer&) = default;
  StepTrainer(StepTrainer&&) = default;
  StepTrainer& operator=(const StepTrainer&) = default;
  StepTrainer& operator=(StepTrainer&&) = default;
};

}  // namespace onnxpipe::train
