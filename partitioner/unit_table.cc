// Builds the unit table in a few linear passes. The saved-activation attribution mirrors how the
// stage program keeps values: a buffer (alias root) made by the forward is kept when a backward
// node reads it, or when a recomputed node reads it while its producer is not recomputed; it is
// counted at the first unit that keeps it, so a stage holding several of those units counts it
// once, and a stage holding any of them at least once.
#include "partitioner/unit_table.h"

#include <algorithm>
#include <set>

#include "frontend/ir/align.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::partitioner {
using ir::AlignUp;

UnitTable BuildUnitTable(const GraphAnalysis& a, const std::vector<double>& node_seconds,
                         const DeviceProfile& device, int64_t alignment) {
  const ir::Graph& g = *a.graph;
  const int32_t U = a.num_units();
  const int32_t nv = g.num_values();
  UnitTable t;
  t.num_units = U;
  auto zeros_d = [&] { return std::vector<double>(U, 0.0); };
  auto zeros_i = [&] { return std::vector<int64_t>(U, 0); };
  t.forward_s = t.backward_s = t.optimizer_s = t.full_recompute_s = zeros_d();
  for (int c = 0; c < 3; ++c) {
    t.recompute_s[c] = zeros_d();
    t.saved[c] = t.rematerialised[c] = zeros_i();
  }
  t.parameters = t.gradients = t.optimizer_state = t.constants = zeros_i();
  auto unit_of_node = [&](ir::NodeId id) { return a.unit_of_position(a.position[id]); };

  // Times and persistent bytes.
  std::vector<int32_t> const_unit(nv, U);
  std::vector<bool> is_opt_state(nv, false);
  for (const ir::Graph::StateUpdate& su : g.state_updates())
    if (!a.is_param[su.state]) is_opt_state[su.state] = true;
  for (ir::NodeId id : a.order) {
    if (a.position[id] < 0) continue;
    const ir::Node& n = g.node(id);
    const int32_t u = unit_of_node(id);
    switch (n.phase) {
      case ir::Phase::kForward: {
        t.forward_s[u] += node_seconds[id];
        bool graph_output = false;
        for (ir::ValueId v : n.outputs)
          if (v != ir::kNoValue && g.IsGraphOutput(v)) graph_output = true;
        if (!graph_output) t.full_recompute_s[u] += node_seconds[id];
        break;
      }
      case ir::Phase::kBackward: t.backward_s[u] += node_seconds[id]; break;
      case ir::Phase::kOptimizer: t.optimizer_s[u] += node_seconds[id]; break;
    }
    if (IsUpdateOp(n.op) && n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue) {
      t.gradients[u] += AlignUp(a.value_bytes[n.inputs[1]], alignment);
    }
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue || !g.value(v).constant || a.is_param[v] || is_opt_state[v]) continue;
      const_unit[v] = std::min(const_unit[v], u);
    }
  }
  bool has_updates = false;
  for (ir::NodeId id : a.order) has_updates |= IsUpdateOp(g.node(id).op);
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (const_unit[v] < U) t.constants[const_unit[v]] += AlignUp(a.value_bytes[v], alignment);
    if (a.is_param[v] && a.param_owner[v] >= 0) {
      t.parameters[a.unit_of_position(a.param_owner[v])] += AlignUp(a.value_bytes[v], alignment);
    }
    if (!has_updates && a.is_param_grad[v] && g.value(v).producer != ir::kNoNode &&
        a.position[g.value(v).producer] >= 0) {
      t.gradients[unit_of_node(g.value(v).producer)] += AlignUp(a.value_bytes[v], alignment);
    }
  }
  for (const ir::Graph::StateUpdate& su : g.state_updates()) {
    if (a.is_param[su.state]) continue;
    const ir::NodeId p = g.value(su.new_value).producer;
    if (p == ir::kNoNode || a.position[p] < 0) continue;
    t.optimizer_state[unit_of_node(p)] += AlignUp(a.value_bytes[su.state], alignment);
  }

  // Saved activations per recompute choice.
  auto keepable = [&](ir::ValueId r) {
    const ir::Value& val = g.value(r);
    if (val.constant) return false;
    if (val.producer == ir::kNoNode) return static_cast<bool>(a.is_input[r]);
    return g.node(val.producer).phase == ir::Phase::kForward && a.position[val.producer] >= 0;
  };
  for (int c = 0; c < 3; ++c) {
    const std::vector<UnitRecompute> choice(U, static_cast<UnitRecompute>(c));
    const std::vector<bool> rec = c == 0 ? std::vector<bool>(g.num_node_slots(), false)
                                         : RecomputeSet(a, 0, U, /*stage_full=*/false, choice);
    auto recomputed = [&](ir::ValueId r) {
      const ir::NodeId p = g.value(r).producer;
      return p != ir::kNoNode && rec[p];
    };
    std::vector<int32_t> keep_unit(nv, U);
    std::vector<bool> remat(nv, false);
    for (ir::NodeId id : a.order) {
      if (a.position[id] < 0) continue;
      const ir::Node& n = g.node(id);
      const bool backward = n.phase == ir::Phase::kBackward;
      if (!backward && !(n.phase == ir::Phase::kForward && rec[id])) continue;
      if (rec[id]) t.recompute_s[c][unit_of_node(id)] += node_seconds[id];
      const int32_t u = unit_of_node(id);
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ir::ValueId v = n.inputs[i];
        if (v == ir::kNoValue || IsShapeOnlyOperand(n, static_cast<int>(i))) continue;
        const ir::ValueId r = a.alias_root[v];
        if (!keepable(r)) continue;
        if (recomputed(r)) {
          if (backward) remat[r] = true;
          continue;
        }
        keep_unit[r] = std::min(keep_unit[r], u);
      }
    }
    for (ir::ValueId r = 0; r < nv; ++r) {
      if (keep_unit[r] < U) t.saved[c][keep_unit[r]] += AlignUp(a.value_bytes[r], alignment);
      if (remat[r]) t.rematerialised[c][unit_of_node(g.value(r).producer)] += AlignUp(a.value_bytes[r], alignment);
    }
  }

  // Boundary buffers certain for a stage starting or ending at each unit boundary.
  t.in_forward.assign(U + 1, 0);
  t.out_backward.assign(U + 1, 0);
  t.out_forward.assign(U + 1, 0);
  t.in_backward.assign(U + 1, 0);
  for (ir::ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g.value(v);
    if (val.constant || val.producer == ir::kNoNode || a.position[val.producer] < 0) continue;
    const int32_t pu = unit_of_node(val.producer);
    const int64_t bytes = AlignUp(a.value_bytes[v], alignment);
    std::set<int32_t> reader_units;
    for (ir::NodeId w : a.uses[v]) {
      if (a.position[w] < 0 || a.tail_param[w] != ir::kNoValue) continue;  // (contributions: all-reduced)
      const ir::Node& wn = g.node(w);
      bool data_use = false;
      for (size_t i = 0; i < wn.inputs.size(); ++i)
        if (wn.inputs[i] == v && !IsShapeOnlyOperand(wn, static_cast<int>(i))) data_use = true;
      if (data_use) reader_units.insert(unit_of_node(w));
    }
    if (reader_units.empty()) continue;
    const int32_t lo = *reader_units.begin(), hi = *reader_units.rbegin();
    for (int32_t ru : reader_units) {
      if (ru > pu) t.in_forward[ru] += bytes;        // a stage starting at ru reads it from before
      if (ru < pu) t.in_backward[ru + 1] += bytes;   // a stage ending after ru reads it from after
    }
    if (hi > pu) t.out_forward[pu + 1] += bytes;   // a stage ending after pu sends it on
    // (a value also sent forward is one boundary buffer: counted there only)
    if (lo < pu && hi <= pu) t.out_backward[pu] += bytes;  // a stage starting at pu sends it back
  }
  t.cross_forward_bytes.assign(U + 1, 0);
  t.cross_backward_bytes.assign(U + 1, 0);
  t.send_forward_s.assign(U + 1, 0);
  t.send_backward_s.assign(U + 1, 0);
  for (int32_t c = 1; c < U; ++c) {
    const int32_t p = a.unit_begin[c];
    t.cross_forward_bytes[c] = a.cross_fwd_bytes[p];
    t.cross_backward_bytes[c] = a.cross_bwd_bytes[p];
    auto transfer = [&](int64_t bytes) {
      return bytes > 0 ? device.link_latency_s + static_cast<double>(bytes) / device.link_bandwidth : 0.0;
    };
    t.send_forward_s[c] = transfer(t.cross_forward_bytes[c]);
    t.send_backward_s[c] = transfer(t.cross_backward_bytes[c]);
  }
  return t;
}

}  // namespace onnxpipe::partitioner
