#include "executor/pipeline/memory.h"

#include <algorithm>

#include "frontend/ir/align.h"

namespace onnxpipe::pipeline {

StageMemoryPrediction PredictStageMemory(const partitioner::StageProgram& sp, const StageLayout& L) {
  StageMemoryPrediction p;
  p.saved = L.saved;
  p.in_flight = L.in_flight;
  p.activations = L.activations();
  p.arena = L.arena();
  p.transient = p.arena - p.activations;
  p.peak = std::max(L.first.peak_bytes, L.later ? L.later->peak_bytes : 0);
  p.accumulators = L.accumulators;
  p.workspace = L.workspace;
  for (const ir::Graph::StateUpdate& u : sp.state_updates) {
    const ir::Value& s = sp.graph.value(u.state);
    if (s.constant) (s.is_initializer ? p.parameters : p.optimizer_state) += ir::AlignUp(s.constant->num_bytes());
  }
  p.total = p.arena + p.accumulators + p.workspace + p.parameters + p.optimizer_state;
  return p;
}

}  // namespace onnxpipe::pipeline
