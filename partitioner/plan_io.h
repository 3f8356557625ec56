// plan.json: the partition plan that `onnxpipe partition` writes and `onnxpipe train --plan DIR`
// runs as written. Schema version 3 (keys in this order; sizes in bytes, times in milliseconds):
//   {
//     "schema_version": 3,
//     "generator": "onnxpipe partition",
//     "model": "m.onnx",
//     "device": {name, source, memory, reserved, peak_tflops{fp32,bf16}, ..., "capacity"},
//     "config": {batch, data_parallel, world, microbatches, microbatch_size, num_stages, stages_auto,
//                objective, schedule, recompute, dtype, optimizer, kernel_scratch_counted},
//         batch is one replica's (microbatches x microbatch_size); the step trains batch x
//         data_parallel samples on world = num_stages x data_parallel ranks. data_parallel may be
//         absent (plans written before it: 1).
//     "predicted": {step_ms, bubble_fraction, samples_per_s, data_parallel_allreduce_ms,
//                   analytic_step_ms, cost_source, measured_nodes, roofline_nodes},
//         step_ms = the simulated pipeline + data_parallel_allreduce_ms (the slowest stage's);
//         samples_per_s counts the global batch
//     "stages": [ {
//        "index": k, "units": [begin, end), "positions": [begin, end), "layers": [...],
//        "nodes": {"forward": [...],    per micro-batch, in run order
//                  "backward": [...],   per micro-batch, in run order (recompute clones: below)
//                  "optimizer": [...],  once per step after the last backward, in run order: the
//                                       parameter-gradient Sums, the updates, and on the
//                                       coordinator the global norm (stage_program.h)
//                  "replicated": [...]},  the optimizer nodes of shared parameters owned by
//                                          another stage, run here too (also under "optimizer")
//        "parameters": [...], "parameter_count": n,   held here, shared ones included
//        "boundary_inputs":  [{name, kind, dtype, shape, bytes, from: [stages]}],
//        "boundary_outputs": [{name, kind, dtype, shape, bytes, to: [stages]}],
//            kind: activation | gradient (between stages), data (graph inputs: tokens,
//            labels), step (lr, step, clip scale), global (gradients the global norm reads),
//            shared_gradient (a shared parameter's gradient, all-reduced with the holders
//            named in `from` once per step; one receive buffer)
//        "recompute": "none|full|selective|auto", "unit_recompute": [per unit],
//        "recompute_regions": [{nodes: [...], before: "<backward node>", ms}],
//        "actions": ["F0", "SEND_ACT0>1", "RECV_GRAD0<1", "R0", "B0.1", ..., "O"],  the stage's
//            schedule (schedule.h's ActionToString), what the executor runs
//        "memory": {parameters, gradients, optimizer_state, activations, transient, kernel_scratch, total,
//                   constants, boundary, saved_per_microbatch, in_flight,
//                   arena, capacity},
//        "predicted": {forward_ms, backward_ms, recompute_ms, optimizer_ms, send_forward_ms,
//                      send_backward_ms,   (per micro-batch; optimizer per step)
//                      data_parallel_allreduce_ms, data_parallel_bytes, data_parallel_tensors}
//            (per step: the accumulated gradients all-reduced in place over the D replicas, one
//            ring all-reduce per tensor; 0 for D = 1; absent in older plans)
//     } ],
//     "global_nodes": [...],   optimizer nodes over all stages' gradients (the global norm), run
//                              on the coordinator (listed under its "optimizer" too)
//     "layers": [{name, stages, forward_ms, backward_ms, parameter_bytes}],
//     "search": {...}, "warnings": [...]
//   }
// Data parallelism adds no memory: the all-reduce runs in place on the gradients (no bucket).
// memory.total = parameters + gradients + optimizer_state + constants + activations + transient
// + kernel_scratch + boundary; activations = saved_per_microbatch * in_flight; transient = arena -
// activations (the region one forward or backward shares); kernel_scratch = the largest scratch one
// forward or backward kernel of the stage takes, from the backend's WorkspaceBytes when
// config.kernel_scratch_counted (the CPU device; a GPU device with a profile measured on the cuda
// backend, cost_model.h), else 0 (a GPU target without one: cuBLASLt and cuDNN sizes need the
// device).
// Version 1 (which listed the post-step gradient Sums under "backward" and had no "actions") and
// version 2 (no kernel scratch; "workspace" was the transient region) are refused with a message to
// re-run onnxpipe partition.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "nlohmann/json.hpp"
#include "partitioner/partitioner.h"

namespace onnxpipe::partitioner {

inline constexpr int kPlanSchemaVersion = 3;

nlohmann::ordered_json PlanToJson(const PartitionPlan& plan);
// Validates while parsing: schema version, required keys and types, stage indices 0..K-1 in
// order, contiguous units, each node on one stage (a replicated one on its holders), actions that
// parse, memory totals adding up. Errors name `what` (the file) and the field.
absl::StatusOr<PartitionPlan> PlanFromJson(const nlohmann::json& j, const std::string& what);
// Reads DIR/plan.json.
absl::StatusOr<PartitionPlan> LoadPlan(const std::string& dir);

// A plan made executable against its training graph: the stage programs built from the plan's node
// lists and recompute regions as written (stage_program.h) and the plan's action lists.
struct CompiledPlan {
  PipelineProgram program;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  int32_t microbatches = 1;
  std::vector<ActionList> actions;
};
// Nothing is re-derived: errors name what the plan and the graph disagree on — a node the graph does
// not have, a node on two stages or on none, a node under the wrong phase, a dependency that flows
// backwards, stage actions that are not the plan's schedule for this program.
absl::StatusOr<CompiledPlan> CompilePlan(const ir::Graph& training_graph, const PartitionPlan& plan);

}  // namespace onnxpipe::partitioner
