// plan.json: the partition plan that `onnxpipe partition` writes and `onnxpipe train --plan DIR`
// loads. Schema version 1 (keys in this order; sizes in bytes, times in milliseconds):
//   {
//     "schema_version": 1,
//     "generator": "onnxpipe partition",
//     "model": "m.onnx",
//     "device": {name, source, memory, reserved, peak_tflops{fp32,bf16}, ..., "capacity"},
//     "config": {batch, microbatches, microbatch_size, num_stages, stages_auto, objective,
//                schedule, recompute, dtype, optimizer},
//     "predicted": {step_ms, bubble_fraction, samples_per_s, analytic_step_ms, cost_source,
//                   measured_nodes, roofline_nodes},
//     "stages": [ {
//        "index": k, "units": [begin, end), "positions": [begin, end), "layers": [...],
//        "nodes": {"forward": [...], "backward": [...], "optimizer": [...],  schedule order
//                  "replicated": [...]},  shared parameters' gradient tails owned by another
//                                          stage and run here too (analysis.h)
//        "parameters": [...], "parameter_count": n,   held here, shared ones included
//        "boundary_inputs":  [{name, kind, dtype, shape, bytes, from: [stages]}],
//        "boundary_outputs": [{name, kind, dtype, shape, bytes, to: [stages]}],
//            kind: activation | gradient (between stages), data (graph inputs: tokens,
//            labels), step (lr, step, clip scale), global (gradients the global norm reads),
//            shared_gradient (a shared parameter's gradient, all-reduced with the holders
//            named in `from` once per step; one receive buffer)
//        "recompute": "none|full|selective|auto", "unit_recompute": [per unit],
//        "recompute_regions": [{nodes: [...], before: "<backward node>", ms}],
//        "memory": {parameters, gradients, optimizer_state, activations, workspace, total,
//                   constants, boundary, saved_per_microbatch, in_flight,
//                   arena, capacity},
//        "predicted": {forward_ms, backward_ms, recompute_ms, optimizer_ms, send_forward_ms,
//                      send_backward_ms}   (per micro-batch; optimizer per step)
//     } ],
//     "global_nodes": [...],   optimizer nodes over all stages' gradients (the global norm)
//     "layers": [{name, stages, forward_ms, backward_ms, parameter_bytes}],
//     "search": {...}, "warnings": [...]
//   }
// memory.total = parameters + gradients + optimizer_state + constants + activations + workspace
// + boundary; activations = saved_per_microbatch * in_flight.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "nlohmann/json.hpp"
#include "partitioner/partitioner.h"

namespace onnxpipe::partitioner {

inline constexpr int kPlanSchemaVersion = 1;

nlohmann::ordered_json PlanToJson(const PartitionPlan& plan);
// Validates while parsing: schema version, required keys and types, stage indices 0..K-1 in
// order, contiguous units, each node on one stage, memory totals adding up. Errors name `what`
// (the file) and the field.
absl::StatusOr<PartitionPlan> PlanFromJson(const nlohmann::json& j, const std::string& what);
// Reads DIR/plan.json.
absl::StatusOr<PartitionPlan> LoadPlan(const std::string& dir);
// Checks a loaded plan against the training graph it is meant for: every node it names exists
// with the phase it is listed under, and every live node is on exactly one stage or global.
absl::Status CheckPlanMatchesGraph(const PartitionPlan& plan, const ir::Graph& training_graph);

}  // namespace onnxpipe::partitioner
