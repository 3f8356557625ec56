// Phase 5 of the partitioner: one stage as a program the static memory planner can plan, and the
// stage's memory from that plan.
//
// The stage program is a copy of the training graph in which
// - the values the stage reads but other stages (or the global gradient-norm nodes) produce are
//   graph inputs, and the values it produces for others are graph outputs;
// - each recompute region is cloned ("recompute/<node>") and the stage's backward nodes read the
//   clones, which run just before the region's first backward consumer;
// - with bf16, activations and activation gradients are bf16 (parameters, their gradients and the
//   optimizer state stay fp32);
// and `order` is: the stage's forward nodes, then its backward nodes with the clones inserted,
// then its optimizer nodes — what the stage runs for one micro-batch (plus the step's update).
//
// Memory (StageMemory, bytes): the persistent regions from PlanMemory(program.graph,
// program.order), the micro-batch memory from the layout the pipeline executor allocates
// (microbatch_layout.h) for the stage's forward and backward:
//   parameters       the planner's parameter region (bf16: plus a bf16 working copy, +50%)
//   gradients        the planner's gradient region (persistent, accumulated over micro-batches)
//   optimizer_state  the planner's optimizer-state region
//   constants        the planner's constant region (masks, frozen buffers)
//   saved            arena buffers of one micro-batch live across the forward/backward boundary
//                    — what a micro-batch in flight keeps
//   activations      saved x in_flight (GPipe M, 1F1B min(M, K - stage))
//   arena            the layout's arena: in_flight saved slots (when more than one) + transient
//   workspace        arena - activations: the rest of the arena (transients, recompute)
//   boundary         send/receive buffers: the stage's boundary inputs and outputs, one each, and
//                    one receive buffer per shared-parameter gradient (the all-reduce)
//   total            the sum of the above except `saved` and `arena`
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/analysis.h"
#include "partitioner/memory_planner.h"
#include "partitioner/recompute.h"

namespace onnxpipe::partitioner {

struct StageProgram {
  ir::Graph graph;
  std::vector<ir::NodeId> order;
  int32_t num_forward = 0;  // order[0, num_forward) are forward nodes
  // Node ids of the training graph (the same ids in `graph`).
  std::vector<ir::NodeId> forward, backward, optimizer;
  std::vector<RecomputeRegion> regions;
  std::vector<ir::NodeId> recompute_clones;  // ids in `graph` only, in order
  // Value ids (the same in both graphs).
  std::vector<ir::ValueId> inputs_forward;    // activations from earlier stages
  std::vector<ir::ValueId> inputs_backward;   // gradients from later stages
  std::vector<ir::ValueId> outputs_forward;   // activations for later stages
  std::vector<ir::ValueId> outputs_backward;  // gradients for earlier stages
  std::vector<ir::ValueId> data_inputs;       // graph inputs the stage's forward/backward read
  std::vector<ir::ValueId> step_inputs;       // lr, step, and the global clip scale
  std::vector<ir::ValueId> global_outputs;    // gradients the global norm reads
  std::vector<ir::ValueId> parameters;        // owned parameters and the shared ones held here
  // Shared parameters held here (analysis.h) and their gradients, which the holders all-reduce
  // once per step (one receive buffer each, counted as a boundary buffer).
  std::vector<ir::ValueId> shared_parameters, shared_gradients;
};

// The program of units [unit_begin, unit_end) with `recompute` (per node id, from RecomputeSet).
absl::StatusOr<StageProgram> BuildStageProgram(const GraphAnalysis& a, int32_t unit_begin,
                                               int32_t unit_end, const std::vector<bool>& recompute);

// The stage's forward subgraph, what stage_<k>.onnx holds: the forward nodes of the units
// [unit_begin, unit_end); its inputs are the graph inputs and earlier stages' values they read, its
// outputs the values that leave the stage (read by another stage, or graph outputs such as the
// loss). Everything else is removed; constants keep their data.
absl::StatusOr<ir::Graph> BuildStageForwardGraph(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end);

struct StageMemory {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, constants = 0;
  int64_t saved = 0, activations = 0, workspace = 0, boundary = 0, total = 0;
  int64_t arena = 0;      // the planner's arena for one micro-batch
  int64_t in_flight = 0;
};

absl::StatusOr<StageMemory> PlanStageMemory(const GraphAnalysis& a, const StageProgram& program,
                                            int64_t in_flight, int64_t microbatches, int64_t alignment,
                                            MemoryPlan* plan_out = nullptr);

}  // namespace onnxpipe::partitioner
