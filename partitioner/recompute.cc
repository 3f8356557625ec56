// Phase 4: recompute sets and regions. The "needed" pass runs backwards over the forward
// positions so that a node is marked once any consumer that matters (a backward node of the same
// stage, or another needed recomputed node) is known.
#include "partitioner/recompute.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {

const char* RecomputePolicyName(RecomputePolicy p) {
  return std::array{"none", "full", "selective", "auto"}[static_cast<int>(p)];
}

absl::StatusOr<RecomputePolicy> ParseRecomputePolicy(std::string_view s) {
  for (RecomputePolicy p :
       {RecomputePolicy::kNone, RecomputePolicy::kFull, RecomputePolicy::kSelective, RecomputePolicy::kAuto}) {
    if (s == RecomputePolicyName(p)) return p;
  }
  return INVALID_ARGUMENT() << "unknown recompute policy '" << s << "'; expected none, full, selective or auto";
}

const char* UnitRecomputeName(UnitRecompute r) {
  return std::array{"none", "selective", "unit", "full"}[static_cast<int>(r)];
}

bool IsCheapOp(ir::OpKind op) { return !ir::HasProp(op, ir::kOpCostly); }

std::vector<bool> RecomputeSet(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end, bool stage_full,
                               const std::vector<UnitRecompute>& choice) {
  const ir::Graph& g = *a.graph;
  std::vector<bool> candidate(g.num_node_slots(), false), needed(g.num_node_slots(), false);
  const int32_t p0 = a.unit_begin[unit_begin], p1 = a.unit_begin[unit_end];
  for (int32_t p = p0; p < p1; ++p) {
    const ir::NodeId id = a.forward[p];
    const ir::Node& n = g.node(id);
    bool ok = true;
    for (ir::ValueId v : n.outputs)
      if (v != ir::kNoValue && g.IsGraphOutput(v)) ok = false;
    if (!ok) continue;
    if (!stage_full) {
      const int32_t u = a.unit_of_position(p);
      const UnitRecompute c = choice.empty() ? UnitRecompute::kNone : choice[u - unit_begin];
      if (c == UnitRecompute::kNone) continue;
      if (c == UnitRecompute::kSelective && !IsCheapOp(n.op)) continue;
      // A value another unit's forward reads stays: each unit recomputes from what it holds.
      const int32_t lo = a.unit_begin[u], hi = a.unit_begin[u + 1];
      for (ir::ValueId v : n.outputs) {
        if (v == ir::kNoValue) continue;
        for (ir::NodeId w : a.uses[v]) {
          if (a.IsForward(w) && (a.position[w] < lo || a.position[w] >= hi)) ok = false;
        }
      }
      if (!ok) continue;
    }
    candidate[id] = true;
  }
  for (int32_t p = p1 - 1; p >= p0; --p) {
    const ir::NodeId id = a.forward[p];
    if (!candidate[id]) continue;
    bool need = false;
    for (ir::ValueId v : g.node(id).outputs) {
      if (v == ir::kNoValue) continue;
      for (ir::NodeId w : a.uses[v]) {
        const ir::Node& wn = g.node(w);
        if (wn.phase == ir::Phase::kBackward && a.position[w] >= p0 && a.position[w] < p1) need = true;
        if (needed[w]) need = true;
      }
    }
    needed[id] = need;
  }
  return needed;
}

std::vector<RecomputeRegion> BuildRegions(const GraphAnalysis& a, const std::vector<bool>& recompute, int32_t p0,
                                          int32_t p1, const std::vector<ir::NodeId>& backward_order) {
  const ir::Graph& g = *a.graph;
  std::vector<ir::NodeId> parent(g.num_node_slots());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](ir::NodeId x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  auto marked = [&](ir::NodeId id) {
    return id != ir::kNoNode && recompute[id] && a.position[id] >= p0 && a.position[id] < p1 && a.IsForward(id);
  };
  std::vector<ir::NodeId> members;
  for (int32_t p = p0; p < p1; ++p) {
    const ir::NodeId id = a.forward[p];
    if (!marked(id)) continue;
    members.push_back(id);
    for (ir::ValueId v : g.node(id).inputs) {
      if (v == ir::kNoValue) continue;
      const ir::NodeId m = g.value(v).producer;
      if (marked(m)) parent[find(id)] = find(m);
    }
  }
  std::vector<int32_t> region_of(g.num_node_slots(), -1);
  std::vector<RecomputeRegion> regions;
  for (ir::NodeId id : members) {  // forward order, so each region's nodes stay in graph order
    const ir::NodeId root = find(id);
    if (region_of[root] < 0) {
      region_of[root] = static_cast<int32_t>(regions.size());
      regions.emplace_back();
    }
    regions[region_of[root]].nodes.push_back(id);
  }
  for (ir::NodeId b : backward_order) {
    for (ir::ValueId v : g.node(b).inputs) {
      if (v == ir::kNoValue) continue;
      const ir::NodeId m = g.value(v).producer;
      if (!marked(m)) continue;
      RecomputeRegion& r = regions[region_of[find(m)]];
      if (r.before == ir::kNoNode) r.before = b;
    }
  }
  regions.erase(
      std::remove_if(regions.begin(), regions.end(), [](const RecomputeRegion& r) { return r.before == ir::kNoNode; }),
      regions.end());
  return regions;
}

}  // namespace onnxpipe::partitioner
