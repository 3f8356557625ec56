// Runs a graph in the memory layout of a static plan (partitioner/memory_planner.h), zero-copy, in
// buffers that live as long as the PlannedRunner: one arena of exactly plan.arena_bytes holds every
// arena value at its planned offset, one buffer of plan.gradient_bytes the gradients, and the new
// parameter / optimizer-state values (a state update's output) go to buffers of
// plan.parameter_bytes / plan.optimizer_state_bytes at their states' offsets; kernel scratch comes
// from one workspace of plan.workspace_bytes (plan it with the backend's workspace function). The
// parameter store itself stays the graph's constants: the updates are returned as InterpretStep
// returns them, for ApplyStateUpdates.
//
// Kernels write their outputs directly into the planned slots (ir::OutputAllocator, handed to the
// evaluator's EvaluateInto); outputs the planner makes views of their input (Reshape, Squeeze, ...)
// are views. Nothing is copied but the graph inputs into their arena slots. Every output is checked
// to be exactly where the plan put it, so a kernel that allocates its own output, or a plan that
// lets two live values share bytes, is an error or a result that differs from Interpret (tests
// compare them bit for bit), never silent. An arena is filled with 0xFF (NaN in every float type)
// when it is allocated, not per run, so a value read before it is written shows on the first run;
// every output slot is zeroed when handed out.
//
// Ownership. Every tensor a Run returns is a view sharing ownership of one of the runner's buffers,
// and it never changes: a run writes only into buffers that nothing outside the runner holds. Each
// of the arena, gradient, parameter and optimizer-state buffers is one of a pool of at most two; a
// run takes one whose views are all gone and allocates another only while both are still held (the
// runner then lets go of the older one, which its holders keep alive). Holding results across runs
// thus costs memory, never correctness. A training loop that applies each run's state to the graph
// (ApplyStateUpdates: the graph's constants become views of the state buffers) and drops the rest,
// as train::Trainer does, alternates between two parameter and two optimizer-state buffers and
// reuses one arena and one gradient buffer: it allocates nothing after its second run.
#pragma once

#include <cstdint>
#include <memory>
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

class PlannedRunner {
 public:
  // `plan` must have been made for `order` (PlanMemory(g, order, ...) with this alignment).
  PlannedRunner(std::vector<ir::NodeId> order, partitioner::MemoryPlan plan, int64_t alignment = 64);

  // One evaluation of g, the graph the plan was made for (its constants may change between runs:
  // ApplyStateUpdates; it is not kept, so an object owning both the graph and the runner may move),
  // with `ev`. inputs: one per graph input, in order. stats: this run's. One run at a time.
  absl::StatusOr<StepResult> Run(const ir::Graph& g, const ir::OpEvaluator& ev,
                                 const std::vector<ir::Tensor>& inputs,
                                 const InterpreterOptions& options = {}, ArenaStats* stats = nullptr);

  const std::vector<ir::NodeId>& order() const { return order_; }
  const partitioner::MemoryPlan& plan() const { return plan_; }
  // Buffers allocated so far (the workspace and every pooled buffer; see Ownership).
  int64_t buffer_allocations() const { return buffer_allocations_; }

 private:
  class Slots;  // the ir::OutputAllocator of one run over these buffers
  using Pool = std::vector<std::shared_ptr<uint8_t>>;  // back(): the current run's buffer

  std::shared_ptr<uint8_t> Allocate(int64_t bytes, bool nan_fill);
  // Moves to the back of `pool` a buffer of `bytes` that nothing outside the runner holds.
  void Claim(Pool& pool, int64_t bytes, bool nan_fill);

  std::vector<ir::NodeId> order_;
  partitioner::MemoryPlan plan_;
  int64_t alignment_;
  int64_t buffer_allocations_ = 0;
  Pool arena_, grads_, params_, opt_state_;
  std::shared_ptr<uint8_t> workspace_;  // scratch: no result views it
};

// One Run of a PlannedRunner made for this call, which allocates all its buffers: for a one-off
// run (a check, a gradient). `order` must be the order the plan was made for.
absl::StatusOr<StepResult> InterpretPlanned(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                            const partitioner::MemoryPlan& plan,
                                            const ir::OpEvaluator& ev,
                                            const std::vector<ir::Tensor>& inputs,
                                            const InterpreterOptions& options = {},
                                            ArenaStats* stats = nullptr,
                                            int64_t alignment = 64);

}  // namespace onnxpipe::runtime
