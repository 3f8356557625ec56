// Static memory planner: a pure function from a graph and a node order (the schedule a stage will
// run) to the byte offset of every value, so that an executor can allocate everything up front and
// the partitioner can predict a stage's memory without running it.
//
// Regions (each its own allocation; offsets are relative to the region's start):
// - kParameters: trainable parameters (Graph::state_updates() states that are initializers) and,
//   in a graph without state updates, every float initializer. Laid out once, in value-id order.
// - kOptimizerState: the other state_updates() states (momentum, Adam moments).
// - kGradients: the parameter gradients, i.e. the `grad` operand (input 1) of SGDUpdate /
//   AdamWUpdate; in a graph without optimizer nodes, float values named "grad/<...>" that are graph
//   outputs (BuildGradients' convention). Persistent: never shared with another value.
// - kConstants: every other constant (folded shape tensors, masks, frozen buffers).
// - kArena: graph inputs and every other computed value, packed by liveness (below).
// A state update's new value (p', m', v') is written in place over its state: it gets the
// state's region and offset.
//
// Liveness over `order` (positions 0..n-1): an arena value is live from the position of its
// producer (graph inputs: 0) to its last use (graph outputs: n-1). Shape-only operands (the `like`
// inputs of the *Like ops and of GatherGrad/SliceGrad/ConcatGrad, Shape's input; see op.h) are not
// uses. A value nobody reads is still live at its producer's position. At one position the inputs
// and outputs of the node are live together, so an output never overlaps an input.
//
// Aliases: the output of Reshape, Flatten, Squeeze, Unsqueeze, Identity and ReshapeLike shares
// its input 0's buffer (one buffer per alias chain, live over the union of its members' ranges),
// unless the output is a gradient or a state update's new value (then it gets its own buffer: the
// copy lands in the persistent region).
//
// Placement: arena buffers are sized in multiples of `alignment` and placed greedily, largest
// first (ties: earlier producer first), each at the best-fitting (smallest sufficient) gap among
// the buffers already placed whose live ranges intersect its own, or above them all. arena_bytes
// is the end of the highest buffer; peak_bytes, the largest sum of live aligned buffer sizes at one
// position, is a lower bound that a perfect packing would reach.
//
// Split (MemoryPlanOptions::split_position, e.g. the first backward position of one pipeline
// micro-batch): the buffers live across the split (live_begin < split <= live_end: what a
// micro-batch keeps from its forward to its backward) are packed into [0, split_bytes) and every
// other buffer lies above split_bytes. An executor can then give each micro-batch in flight its
// own copy of the low part while all of them share the high part.
//
// Workspace: kernels' scratch (MemoryPlanOptions::workspace_bytes, e.g. cpu::CpuWorkspaceBytes)
// is one buffer of the largest aligned need of any scheduled node, reused by every node (nodes run
// one at a time): workspace_bytes. Without the option it is 0.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::partitioner {

enum class MemoryRegion : uint8_t {
  kNone,  // no storage: absent, or never produced by the planned nodes
  kArena,
  kParameters,
  kGradients,
  kOptimizerState,
  kConstants,
};
const char* MemoryRegionName(MemoryRegion r);

struct ValueMemory {
  MemoryRegion region = MemoryRegion::kNone;
  int64_t offset = -1;                     // within the region
  int64_t bytes = 0;                       // the value's own size (unaligned)
  ir::ValueId buffer = ir::kNoValue;       // the value whose buffer this one uses (itself if none)
  int32_t live_begin = -1, live_end = -1;  // arena values: positions in the order, inclusive
};

struct MemoryPlan {
  int64_t arena_bytes = 0;
  int64_t peak_bytes = 0;      // liveness lower bound of arena_bytes
  int32_t peak_position = -1;  // a position where it is reached
  int64_t split_bytes = 0;     // with a split: the arena buffers live across it, at [0, split_bytes)
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t constant_bytes = 0;
  int64_t workspace_bytes = 0;
  std::vector<ValueMemory> values;  // indexed by ValueId
};

struct MemoryPlanOptions {
  int64_t alignment = 64;
  int32_t split_position = -1;  // >= 0: see "Split" above
  // Scratch bytes a node's kernel needs besides its outputs (a backend's function); null: none.
  std::function<int64_t(const ir::Graph&, const ir::Node&)> workspace_bytes;
};

// `order` lists live nodes of `g`, each once, producers before consumers (the graph's LiveNodes()
// order qualifies). Fails naming the value when a stored value has a symbolic or unknown shape,
// and naming the node when the order is not a valid schedule.
absl::StatusOr<MemoryPlan> PlanMemory(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                      const MemoryPlanOptions& options = {});

// Operand `i` of `n` is read for its dims only (never its data): op.h's OpShapeOnly column.
bool IsShapeOnlyOperand(const ir::Node& n, int i);
// The op's output 0 is a view of its input 0 (same bytes, other dims): op.h's kOpView.
bool IsAliasOp(ir::OpKind op);
// The op applies an optimizer update to a parameter (input 1: its gradient).
bool IsUpdateOp(ir::OpKind op);

}  // namespace onnxpipe::partitioner
