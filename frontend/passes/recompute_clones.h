// Recompute cloning: the graph rewrite behind a recompute region. A stage's backward runs, in order,
// backward nodes and clones of forward nodes (a region's forward nodes again, just before the backward
// node that needs them). Each clone reads the clones of its region's earlier nodes and writes fresh
// values ("recompute/<name>"), and every later backward node reads the clones instead of the forward
// values, so the forward's activations need not live until the backward. Dropout and Attention clones
// carry the forward's rng_key, so they replay its random stream exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "frontend/ir/graph.h"

namespace onnxpipe::passes {

struct BackwardStep {
  ir::NodeId node = ir::kNoNode;  // a backward node of `g`, or the forward node to recompute
  int32_t region = -1;            // >= 0: recompute `node` as part of that region
};

struct ClonedBackward {
  std::vector<ir::NodeId> order;        // the backward in run order, clones included (ids of the rewritten graph)
  std::vector<ir::NodeId> clones;       // the clones, in run order
  std::vector<ir::NodeId> cloned_from;  // per clone: the forward node it recomputes
};

// The name a clone of the forward node (or value) `name` gets; a node clone's origin is `name`.
inline std::string RecomputeCloneName(const std::string& name) { return "recompute/" + name; }

// Rewrites `g` (node and value ids kept; clones appended) for `steps`; see the file comment.
ClonedBackward CloneRecomputeRegions(ir::Graph& g, const std::vector<BackwardStep>& steps);

}  // namespace onnxpipe::passes
