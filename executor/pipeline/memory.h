// The memory of a stage program: one static layout (partitioner/memory_planner.h) that the
// prediction reports and the executor allocates, so what a run measures is what was predicted.
//
// The planned graph is one micro-batch of the stage: its forward, a producer for each value
// received for the backward (at the first backward position, where the executor receives them),
// then its backward (recompute clones included). Values received for the forward, data and step
// feeds and the loss seed are inputs (live from the start); values sent away die at their producer
// (the executor sends a copy as soon as they exist); the loss dies at its producer (read there).
//
// Layout, split at the forward/backward boundary (MemoryPlanOptions::split_position):
//   saved       the buffers one micro-batch keeps from its forward to its backward, packed; the
//               stage holds one such slot per micro-batch in flight (in_flight = the schedule's
//               bound: GPipe M, 1F1B min(M, K - s)): activations = saved x in_flight
//   transient   everything else of one forward or backward: shared by all micro-batches, as a
//               stage runs one action at a time
//   arena       activations + transient: the stage's micro-batch memory
//   accumulators the gradients summed over the micro-batches, one persistent buffer. Micro-batch
//               0's kernels write their gradients straight into it (plan `first`); micro-batches
//               1..M-1 write them into the transient region and the executor adds them in (plan
//               `later`, whose transient part may be larger). Both plans place the saved buffers
//               identically.
//   workspace   the backend's kernel scratch (largest need of one node)
//   parameters, optimizer_state  the stage's own parameters and optimizer state (replicas included)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "executor/pipeline/program.h"
#include "executor/pipeline/schedule.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::pipeline {

using WorkspaceFn = std::function<int64_t(const ir::Graph&, const ir::Node&)>;

struct StageLayout {
  ir::Graph graph;               // the stage graph with its interface rewritten (above)
  std::vector<ir::NodeId> order; // forward, backward receives, backward
  int32_t num_forward = 0;       // the split position
  int32_t in_flight = 1;
  partitioner::MemoryPlan first;                 // micro-batch 0
  std::optional<partitioner::MemoryPlan> later;  // micro-batches 1..M-1 (M > 1)
  int64_t saved = 0, transient = 0;
  std::map<ir::ValueId, int64_t> accumulator_offset;
  int64_t accumulators = 0;
  int64_t workspace = 0;

  const partitioner::MemoryPlan& plan(int32_t microbatch) const { return microbatch > 0 && later ? *later : first; }
};

absl::StatusOr<StageLayout> PlanStageLayout(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                            int32_t microbatches, const WorkspaceFn& workspace = nullptr);

struct StageMemoryPrediction {
  int64_t saved = 0, in_flight = 0, activations = 0, transient = 0, arena = 0;
  int64_t peak = 0;  // the liveness lower bound of one micro-batch's arena (largest over the plans)
  int64_t accumulators = 0, workspace = 0, parameters = 0, optimizer_state = 0;
  int64_t total = 0;  // arena + accumulators + workspace + parameters + optimizer_state
};

StageMemoryPrediction PredictStageMemory(const StageProgram& sp, const StageLayout& layout);
absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches, const WorkspaceFn& workspace = nullptr);

}  // namespace onnxpipe::pipeline
