// Running what the partitioner planned (partitioner/partitioner.h, plan.json via plan_io.h): the
// stage of every forward node and the recompute regions come from the plan; backward and optimizer
// nodes follow their origin (program.h), which is the plan's rule as well. The plan's predicted
// numbers are kept for the report, next to what the executor measures.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "executor/pipeline/program.h"
#include "frontend/ir/graph.h"
#include "partitioner/partitioner.h"

namespace onnxpipe::pipeline {

partitioner::RecomputePolicy ToPlanRecompute(RecomputePolicy p);
RecomputePolicy FromPlanRecompute(partitioner::RecomputePolicy p);

// The plan's stages and recompute regions on `g`, the training graph of one micro-batch built the
// way `onnxpipe partition` built it. Errors name the node the plan and the graph disagree on.
absl::StatusOr<StageAssignment> AssignFromPlan(const ir::Graph& g, const partitioner::PartitionPlan& plan);

// Partitions `g` in-process (what `onnxpipe partition` would write), for `--stages K` runs that ask
// for --recompute auto (which needs the planner's memory budget) or want the partitioner's cuts.
// `device`: a built-in profile name or a JSON file (partitioner/device.h).
absl::StatusOr<partitioner::PartitionPlan> PartitionInProcess(const ir::Graph& g, int32_t num_stages, int64_t batch,
                                                              int32_t microbatches, partitioner::ScheduleKind schedule,
                                                              RecomputePolicy recompute, const std::string& device,
                                                              const std::string& model_name);

}  // namespace onnxpipe::pipeline
