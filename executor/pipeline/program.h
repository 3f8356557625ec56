// Stage programs: the training graph of one micro-batch cut into the pieces each pipeline stage
// runs, with every value that crosses stages named as a transfer.
//
// Input: a training graph (forward + loss + backward + norm/clipping + optimizer, as
// executor/train's Trainer builds it, with the batch dim bound to the micro-batch size) and a
// StageAssignment (which stage runs each forward node, which forward nodes are recomputed).
//
// Placement (DESIGN.md: a forward op, its gradient ops and its parameters' updates share a stage):
// - a backward node goes to the stage of its Node::origin (the forward node it differentiates, or
//   the parameter whose gradient it accumulates); gradient Sums of an activation therefore run on
//   the stage of the activation's producer, which is the last to run its backward;
// - a parameter belongs to the stage of its first forward consumer (its owner), and so do its
//   optimizer update and its optimizer state;
// - a parameter other stages read too (a GPT's tied input embedding and output projection) is held
//   Megatron style: every holder runs the parameter's post nodes (the Sum of its gradient
//   contributions, its update) with its own optimizer state, over the same operands in the same
//   order, so the copies stay bitwise identical without a broadcast;
// - optimizer nodes without an origin (the global gradient norm: SumSquares, Sqrt, ClipScale) run
//   once, on the coordinator stage, over every gradient in the graph's order — so the norm is
//   computed with exactly the unpartitioned summation order.
// Step phases: every forward node runs per micro-batch in the stage's forward (F), every backward
// node in its backward (B), optimizer and global nodes once per step after the last backward (post).
// A parameter-gradient Sum (a parameter read in several places, e.g. a tied embedding read on the
// first and the last stage) moves to post: each stage accumulates its own contribution over the
// micro-batches, sends the sum once to every other holder, and each holder adds them (Megatron's
// tied-embedding all-reduce, as one Sum node with the graph's operand order). It moves even when
// all contributions are on one stage, so the summation order does not depend on the stage count.
// Gradient accumulation: every per-micro-batch value a post node reads (the parameter gradients and
// tied contributions) is summed over the micro-batches on the stage that computes it, in
// micro-batch order, acc = ((g0 + g1) + g2) + ... . The loss seed dLoss (the constant autodiff
// seeded with 1) becomes a per-micro-batch input fed with the micro-batch's share of the batch mean
// (see microbatch.h), so the accumulated gradients equal the full batch's.
//
// Recompute: each recomputed forward node whose output a backward node of its stage reads is
// cloned ("recompute/<name>", Phase::kBackward, origin = the forward node); connected clones form a
// region that runs just before the first backward node reading one of its outputs. Dropout and
// Attention clones carry attr rng_key = the forward node's name, so with the micro-batch's
// EvalContext they draw the forward's mask again: recompute is bit-identical.
//
// Transfers: a value produced on stage s and read on stage t != s is sent once per micro-batch in
// the phase that produces it and received before the phase that reads it (forward activations
// F->F, saved forward values F->B, gradients B->B); accumulated values and post outputs move once
// per step (post->post). Per (peer, phase) the values travel in ascending value-id order on both
// ends. A backward value flowing to a later stage, or a forward node reading a backward value,
// is rejected (it cannot be scheduled); ProveDeadlockFree simulates the concrete action lists.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/schedule.h"

namespace onnxpipe::pipeline {

enum class RecomputePolicy { kNone, kFull, kSelective, kAuto };
const char* RecomputePolicyName(RecomputePolicy p);
absl::StatusOr<RecomputePolicy> ParseRecomputePolicy(std::string_view s);  // none|full|selective|auto

struct StageAssignment {
  int32_t num_stages = 1;
  std::vector<int32_t> forward_stage;  // per node id of the training graph: stage of a forward node, else -1
  std::vector<bool> recompute;         // per node id: a forward node its stage recomputes
};

// Forward nodes in graph order, the positions AssignContiguous cuts.
std::vector<ir::NodeId> ForwardNodes(const ir::Graph& g);

// Stage s runs the forward positions [cuts[s-1], cuts[s]) (cuts: K-1 increasing positions in
// (0, #forward)). Empty cuts: balanced by an estimate of each forward node's work (GEMM-class ops by
// their multiply-adds, others by their output size), minimising the largest stage.
absl::StatusOr<StageAssignment> AssignContiguous(const ir::Graph& g, int32_t num_stages,
                                                 std::vector<int32_t> cuts = {});

// From a partition plan: the stage of each forward node by name. Every forward node of `g` must be
// named exactly once.
absl::StatusOr<StageAssignment> AssignByName(const ir::Graph& g, int32_t num_stages,
                                             const std::map<std::string, int32_t>& forward_stage);

// Marks the recomputed forward nodes of every stage:
//   none      nothing;
//   full      every forward node (the stage keeps only its inputs, as GPipe/Pipe checkpointing);
//   selective every node but the GEMM-class ones (MatMul, Gemm, Linear, FusedMatMul, Attention) and
//             the loss: softmax, dropout, GELU, LayerNorm, elementwise and shape ops are re-run,
//             GEMM outputs are kept (Korthikanti et al., arXiv 2205.05198);
//   auto      needs a memory budget, i.e. a partition plan: an error here (use the plan's regions).
// Only nodes whose outputs the stage's backward reads (directly or through other recomputed nodes)
// are actually re-run; BuildPipelineProgram works that out.
absl::Status MarkRecompute(const ir::Graph& g, RecomputePolicy policy, StageAssignment* a);
// By name (a plan's recompute regions). Unknown or non-forward names are errors.
absl::Status MarkRecomputeByName(const ir::Graph& g, const std::vector<std::string>& nodes, StageAssignment* a);

enum class StepPhase : uint8_t { kForward, kBackward, kPost };
const char* StepPhaseName(StepPhase p);

struct StageProgram {
  int32_t stage = 0;
  // A copy of the training graph (value and node ids unchanged) plus this stage's recompute clones.
  // Constants no node of this stage reads are dropped, so a stage holds only its own parameters and
  // replicas; the loss seed is no constant here (it is fed).
  ir::Graph graph;
  std::vector<ir::NodeId> forward, backward, post;  // run order; backward includes the clones
  std::vector<ir::NodeId> recompute_clones;
  int32_t recompute_regions = 0;

  // Per micro-batch feeds.
  std::vector<ir::ValueId> data_inputs;  // graph inputs sliced to the micro-batch's rows
  std::vector<ir::ValueId> step_inputs;  // graph inputs fed once per step (lr, step)
  ir::ValueId loss_scale = ir::kNoValue; // the loss seed, fed with the micro-batch's share

  // Transfers per peer stage, values in ascending id order.
  std::map<int32_t, std::vector<ir::ValueId>> send_forward, recv_forward;    // made in F
  std::map<int32_t, std::vector<ir::ValueId>> send_backward, recv_backward;  // made in B (recv: read in B)
  std::map<int32_t, std::vector<ir::ValueId>> send_post, recv_post;          // once per step
  // recv_forward holds what F reads; recv_backward what B reads (from another stage's F or B).

  // Per-micro-batch values summed over the micro-batches (ascending id).
  std::vector<ir::ValueId> accumulate;
  // Uses of each value by one micro-batch on this stage (node operands, pending sends,
  // accumulation, the loss read): a value is freed when its count reaches 0. data_uses leaves out
  // the shape-only operands (memory_planner.h's IsShapeOnlyOperand): once it reaches 0 the executor
  // keeps only the value's dims (ir::Tensor::DimsOnly), as the static memory planner assumes.
  std::vector<int32_t> uses, data_uses;

  // State updates this stage applies after its post nodes (parameters it owns or holds as a shared
  // parameter, their optimizer state), and parameter replicas (parameters another stage updates
  // that this one reads): new values sent to / received from other stages after the step.
  std::vector<ir::Graph::StateUpdate> state_updates;
  std::map<int32_t, std::vector<ir::ValueId>> send_replica, recv_replica;

  ir::ValueId loss = ir::kNoValue;       // produced here in F (the last stage, usually)
  ir::ValueId grad_norm = ir::kNoValue;  // produced here in post (the coordinator)
};

struct PipelineProgram {
  int32_t num_stages = 1;
  int32_t coordinator = 0;
  std::vector<StageProgram> stages;
  ir::ValueId loss = ir::kNoValue, grad_norm = ir::kNoValue, loss_seed = ir::kNoValue;
  int32_t loss_stage = -1, grad_norm_stage = -1;
  // Parameter (state-updated initializer) -> the stage that owns and updates it.
  std::map<ir::ValueId, int32_t> parameter_owner;
  // Parameter-gradient Sums moved to post (tied and shared parameters), by name.
  std::vector<std::string> post_sums;
};

struct ProgramOptions {
  int32_t coordinator = 0;  // the stage that runs the global (norm) nodes
};

absl::StatusOr<PipelineProgram> BuildPipelineProgram(const ir::Graph& training_graph, const StageAssignment& a,
                                                     const ProgramOptions& options = {});

// The stage's shape in the schedule: the peers it receives from and sends to in its forward and
// backward (from the transfer tables), one backward part.
partitioner::StageShape ShapeOf(const StageProgram& sp);

// The per-stage action lists the executor runs: the schedule's (partitioner/schedule.h) with every
// stage's shape.
absl::StatusOr<std::vector<partitioner::ActionList>> ConcreteActionLists(const PipelineProgram& p,
                                                                         partitioner::ScheduleKind kind,
                                                                         int32_t microbatches);

// Simulates the lists and the optimizer phase with one message per transferred value in its real
// order (partitioner/schedule.h's simulator): OK means the executor cannot deadlock on this program.
absl::Status ProveDeadlockFree(const PipelineProgram& p, const std::vector<partitioner::ActionList>& lists);

}  // namespace onnxpipe::pipeline
