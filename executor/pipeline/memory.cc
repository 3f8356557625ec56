// The prediction graph is the stage graph with the stage's interface rewritten so that the planner
// sees the executor's lifetimes: forward-received values, data and step feeds and the loss seed are
// graph inputs (live from position 0); backward-received values get a producer at the first
// backward position (a Constant node without data, which the planner treats as any computed value);
// the graph outputs are the accumulated gradients (alive to the end of the backward), not the
// loss, which the executor reads and drops right after the forward.
#include "executor/pipeline/memory.h"

#include <algorithm>
#include <set>

#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::pipeline {
namespace {

int64_t AlignUp(int64_t x) { return (x + 63) / 64 * 64; }

}  // namespace

absl::StatusOr<StageMemoryPrediction> PredictStageMemory(const StageProgram& sp, ScheduleKind kind, int32_t num_stages,
                                                         int32_t microbatches) {
  ir::Graph g = sp.graph;
  g.state_updates().clear();
  std::vector<ir::ValueId> inputs = sp.data_inputs;
  inputs.insert(inputs.end(), sp.step_inputs.begin(), sp.step_inputs.end());
  if (sp.loss_scale != ir::kNoValue) inputs.push_back(sp.loss_scale);
  for (const auto& [peer, vs] : sp.recv_forward) inputs.insert(inputs.end(), vs.begin(), vs.end());
  g.inputs() = inputs;
  g.outputs() = sp.accumulate;
  // Accumulated values are the planner's gradients (their own persistent region) whatever autodiff
  // named them (a tied parameter's contributions are not "grad/<param>").
  for (ir::ValueId v : sp.accumulate) {
    if (g.value(v).name.rfind("grad/", 0) != 0) g.RenameValue(v, g.UniqueName("grad/" + g.value(v).name));
  }
  std::vector<ir::NodeId> order = sp.forward;
  const int32_t num_forward = static_cast<int32_t>(order.size());
  for (const auto& [peer, vs] : sp.recv_backward) {
    for (ir::ValueId v : vs) {
      const ir::NodeId r = g.AddNode(ir::OpKind::kConstant, "recv/" + g.value(v).name, {}, {v});
      g.value(v).producer = r;
      order.push_back(r);
    }
  }
  order.insert(order.end(), sp.backward.begin(), sp.backward.end());
  partitioner::MemoryPlanOptions po;
  po.alignment = 64;
  absl::StatusOr<partitioner::MemoryPlan> plan = partitioner::PlanMemory(g, order, po);
  if (!plan.ok()) return Annotate(plan.status(), "planning stage " + std::to_string(sp.stage));
  StageMemoryPrediction p;
  p.arena = plan->arena_bytes;
  p.peak = plan->peak_bytes;
  std::set<ir::ValueId> seen;
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const partitioner::ValueMemory& m = plan->values[v];
    if (m.region != partitioner::MemoryRegion::kArena || !seen.insert(m.buffer).second) continue;
    if (m.live_begin < num_forward && m.live_end >= num_forward) p.saved += AlignUp(plan->values[m.buffer].bytes);
  }
  for (ir::ValueId v : sp.accumulate) {
    p.accumulators += AlignUp(plan->values[v].bytes);
    p.largest_gradient = std::max(p.largest_gradient, AlignUp(plan->values[v].bytes));
  }
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
  p.in_flight = InFlightBound(kind, num_stages, sp.stage, microbatches);
  p.activations = p.saved * p.in_flight;
  for (const auto& [peer, vs] : sp.recv_post) {
    for (ir::ValueId v : vs) {
      const ir::Value& val = sp.graph.value(v);
      if (val.shape_known && ir::IsConcrete(val.shape)) {
        p.post_received += AlignUp(ir::NumElements(val.shape).value() * ir::DTypeSize(val.dtype));
      }
    }
  }
  p.planned = p.saved * (p.in_flight - 1) + p.arena + p.accumulators;
  p.total = std::max(p.planned + 2 * p.largest_gradient, p.accumulators + p.post_received);
  return p;
}

}  // namespace onnxpipe::pipeline
