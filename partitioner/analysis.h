// Phase 2 of the partitioner: the training graph seen as one line of forward positions.
//
// Every forward node gets a position (its index in the graph's topological order restricted to
// forward nodes). Every backward node takes the position of the forward node it differentiates
// (Node::origin), every optimizer node the position of the parameter it updates, and a parameter
// belongs to the position of its first forward consumer: so a forward op, its gradient ops and its
// parameters' updates always land on one stage (the ORT rule; DESIGN.md). Gradient accumulation
// Sums follow their origin too (the activation's producer, or the parameter's owner). Optimizer nodes without an origin
// (SumScalars, the norm's Sqrt, ClipScale: the global gradient norm) are "global": they run once per
// step over the per-gradient sums of squares (a SumSquares per gradient, on its parameter's stage)
// and belong to no stage.
// Post-step nodes: a backward Sum or Identity whose outputs only optimizer nodes and other post-step
// nodes read (the Sum of a parameter's gradient contributions, its copy) runs once per step after
// the last micro-batch, over the contributions accumulated over the micro-batches, like the
// optimizer nodes (stage_program.h).
// Shared parameters (Megatron style): a parameter read on several stages (a tied input embedding
// and output projection) is held — parameter, optimizer state — on every stage that reads it or
// makes one of its gradient contributions. Each such stage accumulates its own contributions over
// the micro-batches and sends them once per step to the other holders; every holder runs the
// parameter's post-step nodes (the accumulation Sum, its copy, the update: the parameter's
// "gradient tail", Node::origin = the parameter) over the same operands in the same order, so
// contributions never cross a cut per micro-batch and the copies stay identical.
// A stage is a contiguous range of positions. A cut c (between positions c-1 and c) has the bytes
// that cross it per micro-batch: activations forward, gradients backward (constants are replicated
// and graph inputs are fed to each stage that reads them, so neither crosses). Cut candidates are
// the cuts whose crossing bytes are no more than (1 + cut_slack) times the smallest crossing found
// in the middle half of the model (between transformer layers: one (B, S, D) tensor each way).
// The ranges between consecutive candidates are the units the search assigns to stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/device.h"

namespace onnxpipe::partitioner {

struct AnalysisOptions {
  double cut_slack = 0.05;
};

struct GraphAnalysis {
  const ir::Graph* graph = nullptr;
  std::vector<ir::NodeId> order;          // live nodes in graph order (topological)
  std::vector<ir::NodeId> forward;        // forward nodes in order; index = position
  std::vector<int32_t> position;          // per node id; -1 for removed and global nodes
  std::vector<ir::NodeId> global_nodes;   // in order
  std::vector<bool> is_param;             // per value: a trained parameter (state-updated initializer)
  std::vector<bool> is_param_grad;        // per value: the `grad` operand of an update op
  std::vector<int32_t> param_owner;       // per value: owner position of a parameter, else -1
  // Per node: the parameter whose gradient tail it is (backward/optimizer node whose origin is the
  // parameter), else kNoValue. Per value: the parameter it is a gradient contribution of (an input
  // of a tail node made by a node outside the tail), else kNoValue.
  std::vector<ir::ValueId> tail_param, contribution_param;
  // Per parameter: the positions of its owner, of the nodes that read it outside the optimizer and of
  // its contributions' producers (ascending, distinct): where it is held.
  std::vector<std::vector<int32_t>> holder_positions;
  std::vector<bool> post_step;            // per node: runs once per step (optimizer and post-step nodes)
  std::vector<bool> is_input;             // per value: a graph input
  std::vector<ir::ValueId> alias_root;    // per value: the value whose buffer it shares
  std::vector<int64_t> value_bytes;       // per value, at its dtype (a bf16 training graph's activations: 2 bytes)
  std::vector<std::vector<ir::NodeId>> uses;  // per value: live consumer nodes
  // Per cut c in [0, F]: bytes crossing between positions c-1 and c per micro-batch.
  std::vector<int64_t> cross_fwd_bytes, cross_bwd_bytes;
  std::vector<int32_t> cut_candidates;    // ascending, in (0, F)
  std::vector<int32_t> unit_begin;        // unit u = positions [unit_begin[u], unit_begin[u+1]); size U+1
  // Layer key of each forward node: LayerKey(scope); for scopeless nodes (torch.export names) the
  // module path of a parameter it reads ("layers.3.linear1.weight" -> "/layers.3"), or the layer of
  // its neighbours when the previous and next keyed nodes agree; else "(top) <first node of the run>".
  std::vector<std::string> layer_of_position;

  int32_t num_positions() const { return static_cast<int32_t>(forward.size()); }
  int32_t num_units() const { return static_cast<int32_t>(unit_begin.size()) - 1; }
  int32_t unit_of_position(int32_t p) const;
  bool IsForward(ir::NodeId id) const;
  // A parameter held outside the positions [p0, p1) too: the stages that hold it (Holds) replicate
  // it Megatron style.
  bool IsSharedOutside(ir::ValueId param, int32_t p0, int32_t p1) const;
  // One of the positions [p0, p1) holds the parameter (holder_positions).
  bool Holds(ir::ValueId param, int32_t p0, int32_t p1) const;
};

// Fails when the graph is not a shape-bound training graph in topological order, naming the
// node or value.
absl::StatusOr<GraphAnalysis> AnalyzeTrainingGraph(const ir::Graph& g, const AnalysisOptions& options);

// The layer a node belongs to, from its scope: up to the first component that ends in an index
// ("/encoder/layers.3/self_attn" -> "/encoder/layers.3"), else the first component, else "(top)".
std::string LayerKey(const std::string& scope);

}  // namespace onnxpipe::partitioner
