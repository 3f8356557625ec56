// Runs a graph with the memory layout of a static plan (partitioner/memory_planner.h): one arena
// of exactly plan.arena_bytes holds every arena value at its planned offset, one buffer of
// plan.gradient_bytes the gradients; parameters, optimizer state and constants stay in the graph's
// constants (the parameter store), their updates are returned as InterpretStep does.
//
// The CPU kernels still allocate their own outputs (ir::Tensor owns its storage): this executor
// copies each output into its planned slot and gives kernels copies of their operands read back
// from the arena. So it proves a plan rather than saves memory: a plan that let two values live at
// the same time share bytes changes the results (tests compare them bit for bit with Interpret),
// and the high-water mark it reports, the highest planned byte it wrote, equals arena_bytes. The
// arena starts filled with NaN-pattern bytes so that reading a slot before it is written shows.
// Running kernels directly in the arena needs kernels that write into preallocated outputs.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::runtime {

struct ArenaStats {
  int64_t arena_bytes = 0;          // allocated for the arena (= plan.arena_bytes)
  int64_t gradient_bytes = 0;       // allocated for the gradients (= plan.gradient_bytes)
  int64_t arena_high_water = 0;     // max over written values of offset + aligned size
};

// `order` must be the order the plan was made for. inputs: one per graph input, in order.
absl::StatusOr<StepResult> InterpretPlanned(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                            const partitioner::MemoryPlan& plan,
                                            const ir::OpEvaluator& ev,
                                            const std::vector<ir::Tensor>& inputs,
                                            const InterpreterOptions& options = {},
                                            ArenaStats* stats = nullptr,
                                            int64_t alignment = 64);

}  // namespace onnxpipe::runtime
