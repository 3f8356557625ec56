#include "frontend/ir/verifier.h"

#include <vector>

#include "frontend/ir/status.h"

namespace onnxpipe::ir {

absl::Status Verify(const Graph& g) {
  std::vector<bool> defined(g.num_values(), false);
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Value& val = g.value(v);
    if (val.constant) {
      defined[v] = true;
      if (val.constant->dtype() != val.dtype || FromInts(val.constant->dims()) != val.shape) {
        return INVALID_ARGUMENT() << "constant '" << val.name << "' holds "
                                  << val.constant->DebugString(0) << " but is declared "
                                  << DTypeName(val.dtype) << ShapeToString(val.shape);
      }
    }
  }
  for (ValueId v : g.inputs()) {
    if (v < 0 || v >= g.num_values()) return INVALID_ARGUMENT() << "graph input id out of range";
    defined[v] = true;
  }
  std::vector<int> producers(g.num_values(), 0);
  for (NodeId id : g.LiveNodes()) {
    const Node& n = g.node(id);
    const OpInfo& info = GetOpInfo(n.op);
    const int nin = static_cast<int>(n.inputs.size()), nout = static_cast<int>(n.outputs.size());
    if (nin < info.min_inputs || nin > info.max_inputs) {
      return INVALID_ARGUMENT() << "node '" << n.name << "' (" << info.name << ") has " << nin
                                << " inputs; expected " << info.min_inputs << ".."
                                << info.max_inputs;
    }
    if (nout < info.min_outputs || nout > info.max_outputs) {
      return INVALID_ARGUMENT() << "node '" << n.name << "' (" << info.name << ") has " << nout
                                << " outputs; expected " << info.min_outputs << ".."
                                << info.max_outputs;
    }
    for (ValueId v : n.inputs) {
      if (v == kNoValue) continue;
      if (v < 0 || v >= g.num_values())
        return INVALID_ARGUMENT() << "node '" << n.name << "' has an input id out of range";
      if (!defined[v]) {
        return INVALID_ARGUMENT() << "node '" << n.name << "' (" << info.name << ") uses '"
                                  << g.value(v).name
                                  << "' before it is defined (dangling input or cycle)";
      }
    }
    for (ValueId v : n.outputs) {
      if (v == kNoValue) continue;
      if (++producers[v] > 1 || g.value(v).constant) {
        return INVALID_ARGUMENT() << "value '" << g.value(v).name
                                  << "' is defined more than once (second definition by node '"
                                  << n.name << "')";
      }
      if (g.value(v).producer != id) {
        return INVALID_ARGUMENT() << "value '" << g.value(v).name
                                  << "' does not record node '" << n.name << "' as producer";
      }
      defined[v] = true;
    }
  }
  for (ValueId v : g.outputs()) {
    if (v < 0 || v >= g.num_values() || !defined[v]) {
      return INVALID_ARGUMENT() << "graph output '" << (v >= 0 ? g.value(v).name : "?")
                                << "' is not produced by any node";
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::ir
