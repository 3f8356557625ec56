// Phase 5 of the partitioner, and what the pipeline executor runs: every stage's complete program.
// One builder makes it, from a placement (which stage runs each node, in which order) that comes
// either from stage boundaries (PlaceStages: what the partitioner decides) or from plan.json as
// written (plan_io.h's CompilePlan); the executor interprets the program and derives nothing.
//
// Placement (DESIGN.md: a forward op, its gradient ops and its parameters' updates share a stage;
// analysis.h gives every node a forward position):
// - stage k runs its forward positions' forward nodes and the backward nodes at those positions
//   per micro-batch (phases F and B), and once per step after its last backward the post-step nodes
//   (GraphAnalysis::post_step) of those positions: the parameter-gradient Sums and copies, and the
//   updates of the parameters it owns (phase post, plan.json's "optimizer");
// - a shared parameter (a tied embedding and output projection) is held Megatron style by every
//   stage that reads it: each holder runs the parameter's post-step nodes (Node::origin = the
//   parameter) with its own optimizer state, over the same operands in the same order, so the copies
//   stay bitwise identical without a broadcast. The Sum of a parameter's gradient contributions is a
//   post-step node even when all contributions are on one stage, so the summation order (over the
//   micro-batches first, then over the contributions) is the same for every stage count;
// - the global nodes (the gradient norm, the clip scale: optimizer nodes without an origin) run on
//   one stage, the coordinator (stage 0), over one scalar per gradient (its sum of squares, made by a
//   post node of the gradient's stage) in the graph's order: gradients never cross a cut for the norm.
// Recompute: each region's forward nodes are cloned ("recompute/<name>", Phase::kBackward, origin the
// forward node; Dropout and Attention clones carry attr rng_key = the forward node's name, so with
// the micro-batch's context they draw the forward's mask again) and run just before the region's
// `before` node; the stage's backward nodes read the clones. The backward of a micro-batch is thus
// a sequence of parts (schedule.h): runs of backward nodes and recompute regions.
// Transfers: a value made on stage s and read on stage t != s is sent once per micro-batch in the
// phase that makes it and received before the phase that reads it (forward activations F->F, an
// earlier stage's forward values with the forward's transfers even when only the backward reads them,
// a later stage's F->B, gradients B->B); accumulated gradients and post-step outputs move once per
// step (post->post). Both ends post a channel's values in the order the sender makes them (ValueLists).
// Gradient accumulation: every per-micro-batch value a post-step node reads is summed over the
// micro-batches on the stage that makes it, in micro-batch order. The loss seed (the constant 1
// autodiff seeded the backward with) is fed per micro-batch with the micro-batch's share.
//
// Memory (StageMemory, bytes): the persistent regions from PlanMemory over the stage's whole program,
// the micro-batch memory from the layout the pipeline executor allocates (microbatch_layout.h):
//   parameters       the planner's parameter region (the f32 masters of a bf16 graph; their bf16
//                    compute copies are optimizer state, written by the updates)
//   gradients        the planner's gradient region (persistent, accumulated over micro-batches)
//   optimizer_state  the planner's optimizer-state region
//   constants        the planner's constant region (masks, frozen buffers)
//   saved            arena buffers of one micro-batch live across the forward/backward boundary
//   activations      saved x in_flight (GPipe M, 1F1B min(M, K - stage))
//   arena            the layout's arena: in_flight saved slots (when more than one) + transient
//   workspace        arena - activations: the rest of the arena (transients, recompute)
//   boundary         the values the stage sends per micro-batch, one buffer each (the transport's
//                    copy), and the shared parameters' gradient contributions it receives once per
//                    step (the all-reduce's buffer); the values it receives per micro-batch land in
//                    their planned slots of the arena, counted there
//   total            the sum of the above except `saved` and `arena`
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/analysis.h"
#include "partitioner/memory_planner.h"
#include "partitioner/microbatch_layout.h"
#include "partitioner/recompute.h"
#include "partitioner/schedule.h"

namespace onnxpipe::partitioner {

// What one stage runs, by node id of the training graph, in execution order: what plan.json's
// stages[k].nodes and recompute_regions say.
struct StageNodes {
  std::vector<ir::NodeId> forward;   // per micro-batch
  std::vector<ir::NodeId> backward;  // per micro-batch, without the recompute clones
  std::vector<ir::NodeId> post;      // once per step, after the last backward
  std::vector<RecomputeRegion> regions;
};

// Stage k runs the forward positions [bounds[k], bounds[k+1]) (bounds: K+1 increasing positions from
// 0 to the number of forward nodes) and recomputes the nodes `recompute` marks among them (per node
// id; RecomputeSet), in regions placed before their first backward reader.
std::vector<StageNodes> PlaceStages(const GraphAnalysis& a, const std::vector<int32_t>& bounds,
                                    const std::vector<bool>& recompute);

// Per peer stage: values in the order they travel, which both sides post in (NCCL matches by order): a micro-batch's
// in the order the sending stage makes them, the optimizer phase's in the order it sends them (ProveTransferOrder).
using ValueLists = std::map<int32_t, std::vector<ir::ValueId>>;

struct BackwardPart {
  ActionKind kind = ActionKind::kBackward;  // kBackward or kRecompute
  int32_t begin = 0, end = 0;               // StageProgram::backward[begin, end)
};

struct StageProgram {
  int32_t stage = 0;
  // A copy of the training graph (value and node ids unchanged) plus this stage's recompute clones.
  // Constants no node of this stage reads are dropped, so a stage holds only its own parameters;
  // the loss seed is no constant here (it is fed). Inputs: the feeds and every received value.
  ir::Graph graph;
  std::vector<ir::NodeId> forward, backward, post;  // run order; backward with the clones
  std::vector<BackwardPart> parts;                  // the backward, part by part
  std::vector<RecomputeRegion> regions;             // forward node ids
  std::vector<ir::NodeId> recompute_clones;
  std::vector<ir::NodeId> cloned_from;  // per clone: the forward node it recomputes

  std::vector<ir::ValueId> data_inputs;   // graph inputs sliced to the micro-batch's rows
  std::vector<ir::ValueId> step_inputs;   // graph inputs fed once per step (lr, step)
  ir::ValueId loss_scale = ir::kNoValue;  // the loss seed, fed with the micro-batch's share

  ValueLists send_forward, recv_forward;    // made in F (recv_forward: read in F)
  ValueLists send_backward, recv_backward;  // made in B, or made in F and read in B (recv_backward)
  ValueLists send_post, recv_post;          // once per step
  std::vector<ir::ValueId> accumulate;      // per-micro-batch values summed over the micro-batches

  // State updates this stage applies after its post nodes: the parameters it owns or holds and
  // their optimizer state.
  std::vector<ir::Graph::StateUpdate> state_updates;
  std::vector<ir::ValueId> parameters;         // held here, shared ones included
  std::vector<ir::ValueId> shared_parameters;  // held on other stages too

  ir::ValueId loss = ir::kNoValue;       // produced here in F
  ir::ValueId grad_norm = ir::kNoValue;  // produced here in post (the coordinator)
};

struct PipelineProgram {
  int32_t num_stages = 1;
  std::vector<StageProgram> stages;
  ir::ValueId loss = ir::kNoValue, grad_norm = ir::kNoValue, loss_seed = ir::kNoValue;
  int32_t loss_stage = -1, grad_norm_stage = -1;
  // Parameter -> the stage that owns it (runs its first forward reader).
  std::map<ir::ValueId, int32_t> parameter_owner;
  // Per stage, its post Sums that run as all-reduces (AllReducedSums); and the distinct groups of stages any stage
  // all-reduces over, in stage order (each process prepares every group of the run, the same list everywhere).
  std::vector<std::map<ir::NodeId, std::vector<int32_t>>> all_reduced;
  std::vector<std::vector<int32_t>> shared_groups;
};

// Checks the placement and builds every stage's program. Errors name the node and the stage: a node
// on no stage or on two (other than a shared parameter's post-step nodes on its holders), a node
// listed under another phase, a gradient away from its forward node, a forward node reading a later
// stage or a backward value, a backward value flowing to a later stage, a node reading a value
// before its stage makes it, a post-step node reading a forward value, a stage reading a parameter
// it does not hold.
absl::StatusOr<PipelineProgram> BuildPipelineProgram(const GraphAnalysis& a, const std::vector<StageNodes>& placement);
// Stage k alone (the same checks; the other stages' graphs are not copied).
absl::StatusOr<StageProgram> BuildStageProgram(const GraphAnalysis& a, const std::vector<StageNodes>& placement,
                                               int32_t k);

// The stage's place in the schedule: its transfer peers and the parts of its backward.
StageShape ShapeOf(const StageProgram& sp);
std::vector<StageShape> ShapesOf(const PipelineProgram& p);

// The post Sums of stage k that add a shared parameter's gradient contributions and run as one
// all-reduce over the parameter's holders (comm::Comm::AllReduce), each with its group: the stages
// making the Sum's operands, in operand order. A Sum qualifies when its operands (all of its output's
// dtype and shape) are made on distinct stages, those stages are exactly the ones running it, and
// each contribution is read by the Sum alone and sent to group members alone; each member's
// contribution is then all-reduced in place and not sent. The all-reduce folds in the group's order
// as the Sum kernel adds its operands left to right: the same bits on every holder, and the same as
// the unpartitioned run. Other Sums (a holder without a contribution, a holder making two) keep
// exchanging the contributions as the post transfers say.
std::map<ir::NodeId, std::vector<int32_t>> AllReducedSums(const PipelineProgram& p, int32_t k);

// Simulates the action lists (schedule.h) and the optimizer phase with one message per transferred
// value in its real order, an all-reduce as a barrier of its group: OK means the executor cannot
// deadlock on this program.
absl::Status ProveDeadlockFree(const PipelineProgram& p, const std::vector<ActionList>& lists);

// The stage's forward subgraph, what stage_<k>.onnx holds: the forward nodes of the units
// [unit_begin, unit_end); its inputs are the graph inputs and earlier stages' values they read, its
// outputs the values that leave the stage (read by another stage, or graph outputs such as the
// loss). Everything else is removed; constants keep their data.
absl::StatusOr<ir::Graph> BuildStageForwardGraph(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end);

// The micro-batch memory layout of the stage (what the executor allocates): `workspace` is the
// backend's kernel scratch function (null: none).
using WorkspaceFn = std::function<int64_t(const ir::Graph&, const ir::Node&)>;
absl::StatusOr<MicrobatchLayout> PlanStageLayout(const StageProgram& sp, int64_t in_flight, int64_t microbatches,
                                                 int64_t alignment, const WorkspaceFn& workspace = nullptr);

struct StageMemory {
  int64_t parameters = 0, gradients = 0, optimizer_state = 0, constants = 0;
  int64_t saved = 0, activations = 0, boundary = 0, total = 0;
  int64_t transient = 0;       // the arena's shared region beside the saved activations (arena - activations)
  int64_t kernel_scratch = 0;  // the largest scratch one forward/backward kernel takes (0 when not counted)
  int64_t arena = 0;  // the planner's arena for one micro-batch
  int64_t in_flight = 0;
};

// `workspace`: the backend's kernel scratch per node (null: kernel_scratch stays 0).
absl::StatusOr<StageMemory> PlanStageMemory(const GraphAnalysis& a, const StageProgram& program, int64_t in_flight,
                                            int64_t microbatches, int64_t alignment,
                                            const WorkspaceFn& workspace = nullptr);

}  // namespace onnxpipe::partitioner
