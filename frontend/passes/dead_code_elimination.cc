#include "frontend/passes/dead_code_elimination.h"

#include <vector>

#include "frontend/ir/status.h"

namespace onnxpipe::passes {

absl::StatusOr<bool> DeadCodeElimination::Run(ir::Graph* g) {
  // One backward sweep suffices because the stored order is topological: every consumer of a
  // node's outputs has been visited (and marked its operands live) before the node itself.
  std::vector<bool> live(g->num_values(), false);
  for (ir::ValueId v : g->outputs()) live[v] = true;
  // Values carried across training steps stay live too (forward graphs have none).
  for (const ir::Graph::StateUpdate& u : g->state_updates()) {
    if (u.new_value != ir::kNoValue) live[u.new_value] = true;
  }
  bool changed = false;
  const std::vector<ir::NodeId> order = g->LiveNodes();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Node& n = g->node(*it);
    bool needed = false;
    for (ir::ValueId v : n.outputs) needed |= (v != ir::kNoValue && live[v]);
    if (!needed) {
      g->RemoveNode(*it);
      changed = true;
      continue;
    }
    for (ir::ValueId v : n.inputs)
      if (v != ir::kNoValue) live[v] = true;
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
