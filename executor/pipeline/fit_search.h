// The smallest change that makes a training run fit its device, found by the partitioner: when the plan of a run
// needs more memory than the backend has free (memory_check.h), the same training graph is planned again with
// recompute and more micro-batches, in the order of how much each changes the run, and the first that fits is
// named as the flags to pass.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/train/training_graph.h"
#include "frontend/ir/graph.h"
#include "partitioner/partitioner.h"

namespace onnxpipe::pipeline {

struct FitQuery {
  const ir::Graph* imported = nullptr;  // the model as imported (PipelineTrainer::Create's)
  const std::map<std::string, int64_t>* other_bindings = nullptr;
  const train::TrainOptions* options = nullptr;  // options->batch is the global batch
  int32_t stages = 1, microbatches = 1;          // the run's
  partitioner::ScheduleKind schedule = partitioner::ScheduleKind::k1F1B;
  partitioner::RecomputePolicy recompute = partitioner::RecomputePolicy::kNone;
  std::string device = "cpu", model_name;
  std::shared_ptr<const backend::Backend> backend;
  int64_t budget = 0;  // --memory-budget (memory_check.h's AvailableBytes)
};

// Candidates, smallest change first: recompute (selective, then full) at the run's micro-batches, then 2x, 4x, ...
// the micro-batches (each dividing the batch) with the run's recompute, selective and full. Returns the flags of
// the first whose plan fits the backend's free memory ("--recompute selective", "--microbatches 8 --recompute
// full"), or "" when none does (a smaller --batch or more devices are then needed).
absl::StatusOr<std::string> SmallestChangeThatFits(const FitQuery& q);

// `oom` (memory_check.h's error) with the smallest change that fits, or with what to change when none does.
absl::Status AddFitAdvice(const absl::Status& oom, const FitQuery& q);

}  // namespace onnxpipe::pipeline
