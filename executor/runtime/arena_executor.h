// Runs a graph in the memory layout of a static plan (partitioner/memory_planner.h), zero-copy:
// one arena of exactly plan.arena_bytes holds every arena value at its planned offset, one buffer
// of plan.gradient_bytes the gradients, and the new parameter / optimizer-state values (a state
// update's output) go to buffers of plan.parameter_bytes / plan.optimizer_state_bytes at their
// states' offsets. The parameter store itself stays the graph's constants: the updates are
// returned as InterpretStep returns them (views of the new-state buffers) for ApplyStateUpdates.
//
// Kernels write their outputs directly into the planned slots (ir::OutputAllocator, handed to the
// evaluator's EvaluateInto); outputs the planner makes views of their input (Reshape, Squeeze, ...)
// are views; kernel scratch comes from one workspace buffer of plan.workspace_bytes (plan it with
// the backend's workspace function). Nothing is copied but the graph inputs into their arena slots. Every output is checked
// to be exactly where the plan put it, so a kernel that allocates its own output, or a plan that
// lets two live values share bytes, is an error or a result that differs from Interpret (tests
// compare them bit for bit), never silent. The arena starts filled with 0xFF (NaN in every float
// type) and every output slot is zeroed when handed out.
//
// The returned tensors are views that share ownership of the buffers, so they stay valid after the
// call; the buffers are freed with the last of them.
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
  int64_t state_bytes = 0;          // allocated for new parameters + optimizer state
  int64_t arena_high_water = 0;     // max over slots handed out of offset + aligned size
  int64_t workspace_bytes = 0;      // allocated for kernel scratch (= plan.workspace_bytes)
  int64_t workspace_high_water = 0; // the largest aligned scratch request
  // ir::Tensor allocations made during the run (kernel outputs or temporaries outside the plan):
  // 0 for a run where every byte is planned. Counts every thread of the process.
  int64_t off_plan_allocations = 0;
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
