// Internal to the stage executor (executor.cc drives steps, executor_create.cc builds the executor): what a stage
// keeps between steps, and helpers both sides use. Not for other callers.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/pipeline/executor.h"

namespace onnxpipe::pipeline {

// A run of micro-batch nodes recorded as one graph: each node's outputs as the recording returned
// them (a replay writes the same slots) and the arena's high-water marks after it.
struct PipelineExecutor::Segment {
  std::unique_ptr<backend::Graph> graph;
  bool eager = false;  // its recording failed: its nodes run one by one
  std::vector<std::vector<ir::Tensor>> outputs;
  StageArenaStats stats;
  int64_t scratch = 0;  // the optimizer phase's scratch bytes its outputs took (PostSlots)
};

// What a stage keeps from step to step besides its arena: the step inputs on the backend (written
// each step) and the optimizer phase's own outputs (PostSlots).
struct PipelineExecutor::StepBuffers {
  ir::Tensor lr, step;
  std::map<ir::ValueId, ir::Tensor> post;
  std::map<ir::ValueId, ir::Tensor> received;  // the optimizer phase's receives
};

struct PipelineExecutor::StageGraphs {
  std::map<std::array<int32_t, 4>, Segment> segments;  // by (phase, micro-batch, backward part, index)
  bool post_eager = false;                             // an optimizer segment's recording failed
  bool warned = false;                                 // about a failed recording
  std::vector<const void*> constants;                  // the constants' addresses the segments hold
  ir::Tensor offset;                                   // the step, on the backend (device_offset)
  std::vector<ir::Tensor> losses;                      // per micro-batch, read after the stage's actions
};

// A value's concrete dims (to receive it or allocate its buffer): an error naming it when a dim is symbolic.
absl::StatusOr<std::vector<int64_t>> ConcreteDims(const ir::Value& val);

}  // namespace onnxpipe::pipeline
