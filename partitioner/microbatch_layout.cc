#include "partitioner/microbatch_layout.h"

#include <algorithm>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {

absl::StatusOr<MicrobatchLayout> PlanMicrobatchLayout(const MicrobatchStage& s) {
  RET_CHECK(s.graph != nullptr);
  const int64_t align = s.alignment;
  auto align_up = [&](int64_t x) { return (x + align - 1) / align * align; };
  MicrobatchLayout L;
  ir::Graph& g = L.graph;
  g = *s.graph;
  // The layout needs the states' dtypes and dims, not their bytes: holding them would keep the initial parameters
  // and optimizer state alive beside the stage's own (the executor updates those in place).
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    std::optional<ir::Tensor>& c = g.value(u.state).constant;
    if (c) c = ir::Tensor::DimsOnly(c->dtype(), c->dims());
  }
  g.state_updates().clear();
  g.inputs() = s.inputs;
  for (ir::ValueId v : s.inputs) g.value(v).constant.reset();
  // Plan `first`: the accumulated values are the planner's gradients (their own persistent region)
  // whatever autodiff named them (a tied parameter's contributions are not "grad/<param>").
  g.outputs() = s.accumulate;
  for (ir::ValueId v : s.accumulate) {
    if (g.value(v).name.rfind("grad/", 0) != 0) g.RenameValue(v, g.UniqueName("grad/" + g.value(v).name));
  }
  L.order = s.forward;
  L.num_forward = static_cast<int32_t>(L.order.size());
  for (ir::ValueId v : s.recv_backward) {
    const ir::NodeId r = g.AddNode(ir::OpKind::kConstant, "recv/" + g.value(v).name, {}, {v});
    g.value(v).producer = r;
    L.order.push_back(r);
  }
  L.order.insert(L.order.end(), s.backward.begin(), s.backward.end());
  L.in_flight = s.in_flight;
  MemoryPlanOptions po;
  po.alignment = align;
  po.split_position = L.in_flight > 1 ? L.num_forward : -1;
  po.workspace_bytes = s.workspace;
  ASSIGN_OR_RETURN(L.first, PlanMemory(g, L.order, po));
  for (ir::ValueId v : s.accumulate) {
    const ValueMemory& m = L.first.values[v];
    RET_CHECK(m.region == MemoryRegion::kGradients) << "accumulated value '" << g.value(v).name << "' is not a gradient";
    L.accumulator_offset[v] = m.offset;
  }
  L.accumulators = L.first.gradient_bytes;
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const ValueMemory& m = L.first.values[v];
    if (m.region == MemoryRegion::kArena && m.buffer == v && m.bytes > 0 && m.live_begin < L.num_forward &&
        m.live_end >= L.num_forward) {
      L.saved += align_up(m.bytes);
    }
  }
  L.saved_region = L.first.split_bytes;
  RET_CHECK(po.split_position < 0 || L.saved_region == L.saved) << "the saved slot is not packed";
  L.transient = L.first.arena_bytes - L.saved_region;
  L.workspace = L.first.workspace_bytes;
  if (s.microbatches > 1 && !s.accumulate.empty()) {
    // Plan `later`: the gradients are ordinary values of the micro-batch, read by the addition
    // into their accumulators right where they are made.
    g.outputs().clear();
    ASSIGN_OR_RETURN(MemoryPlan later, PlanMemory(g, L.order, po));
    RET_CHECK(later.split_bytes == L.saved_region) << "the two plans save different bytes";
    for (ir::ValueId v = 0; v < g.num_values(); ++v) {
      const ValueMemory& a = L.first.values[v];
      if (a.region == MemoryRegion::kArena && a.offset < L.saved_region && a.bytes > 0) {
        RET_CHECK(later.values[v].offset == a.offset) << "'" << g.value(v).name << "' is saved at two offsets";
      }
    }
    L.transient = std::max(L.transient, later.arena_bytes - L.saved_region);
    L.workspace = std::max(L.workspace, later.workspace_bytes);
    L.later = std::move(later);
  }
  return L;
}

}  // namespace onnxpipe::partitioner
