// The memory of a stage program: its micro-batch layout (partitioner/microbatch_layout.h, the same
// function the partitioner predicts with), which the executor allocates (stage_arena.h), so what a
// run measures is what was predicted. The stage's interface, as the executor runs it: data and step
// feeds, the loss seed (fed with the micro-batch's share) and the values received for the forward
// are inputs; values received for the backward arrive at the first backward position; the
// accumulated values are the gradients.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "executor/pipeline/program.h"
#include "partitioner/microbatch_layout.h"

namespace onnxpipe::pipeline {

using WorkspaceFn = std::function<int64_t(const ir::Graph&, const ir::Node&)>;
using StageLayout = partitioner::MicrobatchLayout;

absl::StatusOr<StageLayout> PlanStageLayout(const StageProgram& sp, partitioner::ScheduleKind kind, int32_t num_stages,
                                            int32_t microbatches, const WorkspaceFn& workspace = nullptr);

struct StageMemoryPrediction {
  int64_t saved = 0, in_flight = 0, activations = 0;
  int64_t arena = 0, transient = 0;  // transient = arena - activations
  int64_t peak = 0;  // the liveness lower bound of one micro-batch's arena (largest over the plans)
  int64_t accumulators = 0, workspace = 0, parameters = 0, optimizer_state = 0;
  int64_t total = 0;  // arena + accumulators + workspace + parameters + optimizer_state
};

StageMemoryPrediction PredictStageMemory(const StageProgram& sp, const StageLayout& layout);
absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, partitioner::ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches, const WorkspaceFn& workspace = nullptr);

}  // namespace onnxpipe::pipeline
