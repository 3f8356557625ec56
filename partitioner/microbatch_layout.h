// The memory layout of one pipeline stage's micro-batches: what the pipeline executor allocates
// (executor/pipeline/stage_arena.h) and what the partitioner predicts, computed by this one
// function from a description of the stage, so prediction and run agree to the byte.
//
// The planned sequence is one micro-batch: its forward nodes, a producer for each value received
// for the backward (at the first backward position, where the executor receives them), then its
// backward nodes (recompute clones included). `inputs` (data, step feeds, the loss seed, values
// received for the forward) are live from the start; values nobody here reads after their producer
// die there (values sent away: the executor sends a copy at once; the loss: read at its producer).
//
// Layout:
//   saved       the arena buffers one micro-batch keeps from its forward to its backward
//   in_flight   micro-batches forwarded and not yet backwarded at once (the schedule's bound);
//               activations = saved x in_flight
//   With more than one micro-batch in flight the plan is split at the forward/backward boundary
//   (MemoryPlanOptions::split_position): the saved buffers are packed into a slot of
//   `saved_region` bytes, one slot per micro-batch in flight, and everything else of one forward
//   or backward lies in the transient region all micro-batches share (a stage runs one action at
//   a time). With one in flight there is no split (saved_region = 0): the transient region is the
//   whole arena, and saved buffers may reuse bytes of values dead before they are made.
//   arena       saved_region x in_flight + transient
//   accumulators the gradients summed over the micro-batches, one persistent buffer (the planner's
//               gradient region). Micro-batch 0's kernels write their gradients straight into it
//               (plan `first`); micro-batches 1..M-1 write them into the transient region and the
//               executor adds them in (plan `later`, whose transient part may be larger). Both
//               plans place the saved buffers identically.
//   workspace   kernel scratch (the largest need of one node; 0 without a workspace function)
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::partitioner {

struct MicrobatchStage {
  const ir::Graph* graph = nullptr;            // holds every node and value named below
  std::vector<ir::NodeId> forward, backward;   // run order; backward includes recompute clones
  std::vector<ir::ValueId> inputs;             // live from the start (a constant here is fed)
  std::vector<ir::ValueId> recv_backward;      // arrive at the first backward position
  std::vector<ir::ValueId> accumulate;         // gradients summed over the micro-batches
  int32_t in_flight = 1;
  int32_t microbatches = 1;
  int64_t alignment = 64;
  std::function<int64_t(const ir::Graph&, const ir::Node&)> workspace;  // null: no kernel scratch
};

struct MicrobatchLayout {
  ir::Graph graph;                // the stage graph as planned (interface rewritten, see above)
  std::vector<ir::NodeId> order;  // forward, backward receives, backward
  int32_t num_forward = 0;
  int32_t in_flight = 1;
  MemoryPlan first;                 // micro-batch 0
  std::optional<MemoryPlan> later;  // micro-batches 1..M-1 (M > 1 and something to accumulate)
  int64_t saved = 0;         // bytes of the buffers live across the boundary (aligned)
  int64_t saved_region = 0;  // one saved slot: saved when split, else 0
  int64_t transient = 0;     // the shared region (the larger of the two plans')
  std::map<ir::ValueId, int64_t> accumulator_offset;
  int64_t accumulators = 0;
  int64_t workspace = 0;

  const MemoryPlan& plan(int32_t microbatch) const { return microbatch > 0 && later ? *later : first; }
  int64_t activations() const { return saved * in_flight; }
  int64_t arena() const { return saved_region * in_flight + transient; }
};

absl::StatusOr<MicrobatchLayout> PlanMicrobatchLayout(const MicrobatchStage& stage);

}  // namespace onnxpipe::partitioner
