#include "executor/pipeline/memory.h"

#include <algorithm>
#include <set>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

using ir::AlignUp;

}  // namespace

absl::StatusOr<StageLayout> PlanStageLayout(const StageProgram& sp, partitioner::ScheduleKind kind, int32_t num_stages,
                                            int32_t microbatches, const WorkspaceFn& workspace) {
  partitioner::MicrobatchStage m;
  m.graph = &sp.graph;
  m.forward = sp.forward;
  m.backward = sp.backward;
  m.inputs = sp.data_inputs;
  for (ir::ValueId v : sp.step_inputs)
    if (sp.uses[v] > 0) m.inputs.push_back(v);  // the forward or backward reads it (else: post only)
  if (sp.loss_scale != ir::kNoValue) m.inputs.push_back(sp.loss_scale);
  for (const auto& [peer, vs] : sp.recv_forward) m.inputs.insert(m.inputs.end(), vs.begin(), vs.end());
  for (const auto& [peer, vs] : sp.recv_backward) m.recv_backward.insert(m.recv_backward.end(), vs.begin(), vs.end());
  m.accumulate = sp.accumulate;
  m.in_flight = static_cast<int32_t>(partitioner::InFlightMicrobatches(kind, num_stages, sp.stage, microbatches));
  m.microbatches = microbatches;
  m.alignment = 64;
  m.workspace = workspace;
  absl::StatusOr<StageLayout> layout = partitioner::PlanMicrobatchLayout(m);
  if (!layout.ok()) return Annotate(layout.status(), "planning the memory of stage " + std::to_string(sp.stage));
  return layout;
}

StageMemoryPrediction PredictStageMemory(const StageProgram& sp, const StageLayout& L) {
  StageMemoryPrediction p;
  p.saved = L.saved;
  p.in_flight = L.in_flight;
  p.activations = L.activations();
  p.arena = L.arena();
  p.transient = p.arena - p.activations;
  p.peak = std::max(L.first.peak_bytes, L.later ? L.later->peak_bytes : 0);
  p.accumulators = L.accumulators;
  p.workspace = L.workspace;
  std::set<ir::ValueId> states;
  for (const ir::Graph::StateUpdate& u : sp.state_updates) {
    const ir::Value& s = sp.graph.value(u.state);
    if (!s.constant) continue;
    (s.is_initializer ? p.parameters : p.optimizer_state) += AlignUp(s.constant->num_bytes());
    states.insert(u.state);
  }
  for (const auto& [peer, vs] : sp.recv_replica)
    for (ir::ValueId v : vs)
      if (sp.graph.value(v).constant && states.insert(v).second) p.parameters += AlignUp(sp.graph.value(v).constant->num_bytes());
  p.total = p.arena + p.accumulators + p.workspace + p.parameters + p.optimizer_state;
  return p;
}

absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, partitioner::ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches, const WorkspaceFn& workspace) {
  ASSIGN_OR_RETURN(StageLayout L, PlanStageLayout(sp, kind, num_stages, microbatches, workspace));
  return PredictStageMemory(sp, L);
}

}  // namespace onnxpipe::pipeline
