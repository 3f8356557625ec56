// The memory of a stage as the executor allocates it: its micro-batch layout
// (partitioner::PlanStageLayout, the very function the partitioner predicts with, allocated by
// stage_arena.h) and the persistent state of its program. A run measures what was predicted.
#pragma once

#include <cstdint>

#include "partitioner/microbatch_layout.h"
#include "partitioner/stage_program.h"

namespace onnxpipe::pipeline {

using StageLayout = partitioner::MicrobatchLayout;

struct StageMemoryPrediction {
  int64_t saved = 0, in_flight = 0, activations = 0;
  int64_t arena = 0, transient = 0;  // transient = arena - activations
  int64_t peak = 0;                  // the liveness lower bound of one micro-batch's arena (largest over the plans)
  int64_t accumulators = 0, workspace = 0, parameters = 0, optimizer_state = 0;
  int64_t total = 0;  // arena + accumulators + workspace + parameters + optimizer_state
};

StageMemoryPrediction PredictStageMemory(const partitioner::StageProgram& sp, const StageLayout& layout);

}  // namespace onnxpipe::pipeline
