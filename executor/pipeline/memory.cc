#include "executor/pipeline/memory.h"

#include <algorithm>
#include <set>

#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

int64_t AlignUp(int64_t x) { return (x + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<StageLayout> PlanStageLayout(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                            int32_t microbatches, const WorkspaceFn& workspace) {
  StageLayout L;
  ir::Graph& g = L.graph;
  g = sp.graph;
  g.state_updates().clear();
  std::vector<ir::ValueId> inputs = sp.data_inputs;
  inputs.insert(inputs.end(), sp.step_inputs.begin(), sp.step_inputs.end());
  if (sp.loss_scale != ir::kNoValue) inputs.push_back(sp.loss_scale);
  for (const auto& [peer, vs] : sp.recv_forward) inputs.insert(inputs.end(), vs.begin(), vs.end());
  g.inputs() = inputs;
  // Plan `first`: the accumulated values are the planner's gradients (their own persistent region)
  // whatever autodiff named them (a tied parameter's contributions are not "grad/<param>").
  g.outputs() = sp.accumulate;
  for (ir::ValueId v : sp.accumulate) {
    if (g.value(v).name.rfind("grad/", 0) != 0) g.RenameValue(v, g.UniqueName("grad/" + g.value(v).name));
  }
  L.order = sp.forward;
  L.num_forward = static_cast<int32_t>(L.order.size());
  for (const auto& [peer, vs] : sp.recv_backward) {
    for (ir::ValueId v : vs) {
      const ir::NodeId r = g.AddNode(ir::OpKind::kConstant, "recv/" + g.value(v).name, {}, {v});
      g.value(v).producer = r;
      L.order.push_back(r);
    }
  }
  L.order.insert(L.order.end(), sp.backward.begin(), sp.backward.end());
  partitioner::MemoryPlanOptions po;
  po.alignment = 64;
  po.split_position = L.num_forward;
  po.workspace_bytes = workspace;
  const std::string where = "planning the memory of stage " + std::to_string(sp.stage);
  absl::StatusOr<partitioner::MemoryPlan> first = partitioner::PlanMemory(g, L.order, po);
  if (!first.ok()) return Annotate(first.status(), where);
  L.first = std::move(*first);
  for (ir::ValueId v : sp.accumulate) {
    const partitioner::ValueMemory& m = L.first.values[v];
    RET_CHECK(m.region == partitioner::MemoryRegion::kGradients)
        << where << ": accumulated value '" << g.value(v).name << "' is not a gradient";
    L.accumulator_offset[v] = m.offset;
  }
  L.accumulators = L.first.gradient_bytes;
  L.saved = L.first.split_bytes;
  L.transient = L.first.arena_bytes - L.saved;
  L.workspace = L.first.workspace_bytes;
  if (microbatches > 1 && !sp.accumulate.empty()) {
    // Plan `later`: the gradients are ordinary values of the micro-batch, read by the addition
    // into their accumulators right where they are made.
    g.outputs().clear();
    absl::StatusOr<partitioner::MemoryPlan> later = partitioner::PlanMemory(g, L.order, po);
    if (!later.ok()) return Annotate(later.status(), where);
    RET_CHECK(later->split_bytes == L.saved) << where << ": the two plans save different bytes";
    for (ir::ValueId v = 0; v < g.num_values(); ++v) {
      const partitioner::ValueMemory& a = L.first.values[v];
      if (a.region == partitioner::MemoryRegion::kArena && a.offset < L.saved && a.bytes > 0) {
        RET_CHECK(later->values[v].offset == a.offset) << where << ": '" << g.value(v).name << "' is saved at two offsets";
      }
    }
    L.transient = std::max(L.transient, later->arena_bytes - L.saved);
    L.workspace = std::max(L.workspace, later->workspace_bytes);
    L.later = std::move(*later);
  }
  L.in_flight = InFlightBound(kind, num_stages, sp.stage, microbatches);
  return L;
}

StageMemoryPrediction PredictStageMemory(const StageProgram& sp, const StageLayout& L) {
  StageMemoryPrediction p;
  p.saved = L.saved;
  p.in_flight = L.in_flight;
  p.activations = L.saved * L.in_flight;
  p.transient = L.transient;
  p.arena = p.activations + p.transient;
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

absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches, const WorkspaceFn& workspace) {
  ASSIGN_OR_RETURN(StageLayout L, PlanStageLayout(sp, kind, num_stages, microbatches, workspace));
  return PredictStageMemory(sp, L);
}

}  // namespace onnxpipe::pipeline
