// Training options of `onnxpipe train` (the training graph's spec, frontend/autodiff/training_graph.h, and the run's
// batch, steps, schedule and data order), the data fields a model needs, and the inputs of one step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/train/dataset.h"
#include "frontend/autodiff/lr_schedule.h"
#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

struct TrainOptions : autodiff::TrainingGraphSpec {
  int64_t batch = 0;
  int64_t steps = 0;
  double lr = 0.0;
  autodiff::LrScheduleKind schedule = autodiff::LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  uint64_t seed = 0;
  bool shuffle = false;
  bool check_numerics = false;  // name the first node producing NaN/Inf
};

// What the data folder must hold for a forward graph (as imported, before binding): one field per
// graph input (its dtype and dims after the batch dim) and the labels (int64, the logits' dims
// between the batch and the class dim). Float inputs also accept the other float width.
absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward, const std::string& logits,
                                                  const std::string& labels);

// The inputs of step `step` (0-based) of the training graph, in graph-input order: its batch rows of the data (cast
// to the graph's dtype), the learning rate `lr` and the step count step + 1.
std::vector<ir::Tensor> StepInputs(const autodiff::TrainingGraph& tg, const Dataset& data, const TrainOptions& options,
                                   int64_t step, double lr);

}  // namespace onnxpipe::train
