// Memory of a stage program, predicted with the static memory planner (partitioner/memory_planner.h)
// for exactly what the executor runs: one micro-batch's forward then backward (recompute clones
// included), values received for the forward fed from the start, values received for the backward
// arriving when it starts, values sent away dying at their producer (the executor sends eagerly),
// and the per-micro-batch gradients kept to the end of the backward (they go into accumulators).
//
//   saved        bytes of one micro-batch live across its forward/backward boundary: what a
//                micro-batch in flight keeps (arena buffers, 64-byte aligned, aliases shared)
//   activations  saved x in_flight, in_flight = the schedule's bound (GPipe M, 1F1B min(M, K-s))
//   arena, peak  the planner's arena for one micro-batch (with placement gaps) and its liveness
//                lower bound
//   accumulators the gradients summed over the micro-batches (aligned), held through the step
//   parameters, optimizer_state  the stage's own parameters and optimizer state (replicas included)
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "executor/pipeline/program.h"
#include "executor/pipeline/schedule.h"

namespace onnxpipe::pipeline {

struct StageMemoryPrediction {
  int64_t saved = 0, in_flight = 0, activations = 0;
  int64_t arena = 0, peak = 0;
  int64_t accumulators = 0, parameters = 0, optimizer_state = 0;
  int64_t largest_gradient = 0;  // one micro-batch's largest gradient (aligned)
  int64_t post_received = 0;     // values received in the optimizer phase (gradients for the norm...)
  // The planner's own total: the other in-flight micro-batches' activations, one micro-batch's
  // arena, the accumulators. It assumes kernels add each gradient into its accumulator in place.
  int64_t planned = 0;
  // What the executor can hold at once: the planner's total plus two gradients in flight (its CPU
  // kernels return new tensors, so a micro-batch's gradient exists beside its accumulator until
  // added, and the first addition makes a new accumulator), or, in the optimizer phase, the
  // accumulators plus what the stage receives.
  int64_t total = 0;
};

absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches);

}  // namespace onnxpipe::pipeline
