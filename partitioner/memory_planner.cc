// Static memory planning (see memory_planner.h for the contract). The arena placement is the
// greedy-by-size offset assignment that TFLite's and ONNX Runtime's planners use: large buffers
// are the hard ones to fit, so they go first, and each lands in the tightest gap left by the
// buffers it is live together with.
#include "partitioner/memory_planner.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {
namespace {

using ir::AlignUp;

struct Interval {
  int32_t begin = std::numeric_limits<int32_t>::max();
  int32_t end = -1;
  bool valid() const { return end >= begin; }
  bool Intersects(const Interval& o) const { return begin <= o.end && o.begin <= end; }
};

struct Placed {
  int64_t offset, size;
  Interval live;
};

}  // namespace

const char* MemoryRegionName(MemoryRegion r) {
  return std::array{"none", "arena", "parameters", "gradients", "optimizer_state", "constants"}[static_cast<int>(r)];
}

bool IsShapeOnlyOperand(const ir::Node& n, int i) { return ir::IsShapeOnlyOperand(n.op, i); }

bool IsAliasOp(ir::OpKind op) { return ir::HasProp(op, ir::kOpView); }

bool IsUpdateOp(ir::OpKind op) { return op == ir::OpKind::kSGDUpdate || op == ir::OpKind::kAdamWUpdate; }

absl::StatusOr<MemoryPlan> PlanMemory(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                      const MemoryPlanOptions& options) {
  RET_CHECK(options.alignment > 0);
  const int64_t align = options.alignment;
  const int32_t n = static_cast<int32_t>(order.size());
  const int32_t nv = g.num_values();
  MemoryPlan plan;
  plan.values.resize(nv);

  // Phase 1: the order is a schedule: live nodes, each once, every operand available.
  std::vector<int32_t> produced_at(nv, -1);  // position of the producer in the order
  std::vector<bool> is_input(nv, false);
  for (ir::ValueId v : g.inputs()) is_input[v] = true;
  {
    std::set<ir::NodeId> seen;
    for (int32_t t = 0; t < n; ++t) {
      const ir::NodeId id = order[t];
      if (id < 0 || id >= g.num_node_slots() || g.node(id).removed)
        return INVALID_ARGUMENT() << "memory plan: position " << t << " holds no live node";
      if (!seen.insert(id).second)
        return INVALID_ARGUMENT() << "memory plan: node '" << g.node(id).name << "' is scheduled twice";
      const ir::Node& node = g.node(id);
      for (ir::ValueId v : node.inputs) {
        if (v == ir::kNoValue || g.value(v).constant || is_input[v]) continue;
        if (produced_at[v] < 0) {
          return INVALID_ARGUMENT() << "memory plan: node '" << node.name << "' (" << ir::OpName(node.op) << ") reads '"
                                    << g.value(v).name << "' before any scheduled node produces it";
        }
      }
      for (ir::ValueId v : node.outputs)
        if (v != ir::kNoValue) produced_at[v] = t;
    }
  }

  // Phase 2: what every value is. Only values the scheduled nodes touch (and graph outputs, and
  // the states they update) get storage: a pipeline stage holds its own share.
  std::vector<bool> used(nv, false);
  for (ir::NodeId id : order) {
    for (ir::ValueId v : g.node(id).inputs)
      if (v != ir::kNoValue) used[v] = true;
    for (ir::ValueId v : g.node(id).outputs)
      if (v != ir::kNoValue) used[v] = true;
  }
  for (ir::ValueId v : g.outputs()) used[v] = true;
  for (ir::ValueId v : g.inputs()) used[v] = true;      // fed whether or not a node reads it
  std::vector<ir::ValueId> state_of(nv, ir::kNoValue);  // new value -> the state it overwrites
  std::vector<bool> is_param(nv, false), is_opt_state(nv, false), is_grad(nv, false);
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    if (produced_at[u.new_value] < 0) continue;  // updated on another stage
    state_of[u.new_value] = u.state;
    used[u.state] = true;
    (g.value(u.state).is_initializer ? is_param : is_opt_state)[u.state] = true;
  }
  bool has_updates = false;
  for (ir::NodeId id : order) {
    const ir::Node& node = g.node(id);
    if (!IsUpdateOp(node.op)) continue;
    has_updates = true;
    if (node.inputs.size() > 1 && node.inputs[1] != ir::kNoValue) is_grad[node.inputs[1]] = true;
  }
  if (g.state_updates().empty()) {
    for (ir::ValueId v = 0; v < nv; ++v) {
      const ir::Value& val = g.value(v);
      if (val.constant && val.is_initializer && ir::IsFloat(val.dtype)) is_param[v] = true;
    }
  }
  if (!has_updates) {
    for (ir::ValueId v : g.outputs()) {
      const ir::Value& val = g.value(v);
      if (!val.constant && ir::IsFloat(val.dtype) && val.name.rfind("grad/", 0) == 0) is_grad[v] = true;
    }
  }

  // In-place updates are only sound when nothing after the update reads the old state.
  std::vector<int32_t> updated_at(nv, -1);
  for (ir::ValueId v = 0; v < nv; ++v)
    if (state_of[v] != ir::kNoValue) updated_at[state_of[v]] = produced_at[v];
  for (int32_t t = 0; t < n; ++t) {
    const ir::Node& node = g.node(order[t]);
    for (ir::ValueId v : node.inputs) {
      if (v != ir::kNoValue && updated_at[v] >= 0 && t > updated_at[v]) {
        return INVALID_ARGUMENT() << "memory plan: node '" << node.name << "' reads state '" << g.value(v).name
                                  << "' after the node updating it in place ('" << g.node(order[updated_at[v]]).name
                                  << "')";
      }
    }
  }

  // Phase 3: sizes.
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!used[v]) continue;
    const ir::Value& val = g.value(v);
    if (!val.shape_known || !ir::IsConcrete(val.shape)) {
      return INVALID_ARGUMENT() << "memory plan: value '" << val.name << "' has shape "
                                << (val.shape_known ? ir::ShapeToString(val.shape) : "unknown")
                                << "; bind the batch and sequence dims (--batch/--seq) first";
    }
    plan.values[v].bytes = ir::NumElements(val.shape).value() * ir::DTypeSize(val.dtype);
    plan.values[v].buffer = v;
  }

  // Phase 4: buffer sharing. Nodes are visited in schedule order, so an alias input's buffer is
  // already resolved to its root.
  for (ir::ValueId v = 0; v < nv; ++v)
    if (state_of[v] != ir::kNoValue) plan.values[v].buffer = state_of[v];
  for (ir::NodeId id : order) {
    const ir::Node& node = g.node(id);
    if (!IsAliasOp(node.op) || node.inputs.empty() || node.inputs[0] == ir::kNoValue) continue;
    const ir::ValueId out = node.outputs[0];
    if (out == ir::kNoValue || is_grad[out] || state_of[out] != ir::kNoValue) continue;
    plan.values[out].buffer = plan.values[node.inputs[0]].buffer;
  }

  // Phase 5: regions of buffer roots, and liveness of the arena ones.
  auto region_of_root = [&](ir::ValueId r) {
    const ir::Value& val = g.value(r);
    if (is_grad[r]) return MemoryRegion::kGradients;
    if (val.constant) {
      if (is_param[r]) return MemoryRegion::kParameters;
      if (is_opt_state[r]) return MemoryRegion::kOptimizerState;
      return MemoryRegion::kConstants;
    }
    return MemoryRegion::kArena;
  };
  std::vector<Interval> live(nv);
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!used[v]) continue;
    if (is_input[v]) live[v].begin = 0;
    if (produced_at[v] >= 0) live[v].begin = produced_at[v];
    live[v].end = std::max(live[v].end, live[v].begin == std::numeric_limits<int32_t>::max() ? -1 : live[v].begin);
  }
  for (int32_t t = 0; t < n; ++t) {
    const ir::Node& node = g.node(order[t]);
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ir::ValueId v = node.inputs[i];
      if (v == ir::kNoValue || IsShapeOnlyOperand(node, static_cast<int>(i))) continue;
      live[v].end = std::max(live[v].end, t);
    }
  }
  for (ir::ValueId v : g.outputs()) live[v].end = std::max(live[v].end, n - 1);
  std::vector<Interval> root_live(nv);
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!used[v] || !live[v].valid()) continue;
    Interval& r = root_live[plan.values[v].buffer];
    r.begin = std::min(r.begin, live[v].begin);
    r.end = std::max(r.end, live[v].end);
  }

  // Phase 6: arena placement, largest first, best fit among the buffers live at the same time.
  std::vector<ir::ValueId> roots;
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (used[v] && plan.values[v].buffer == v && region_of_root(v) == MemoryRegion::kArena && root_live[v].valid() &&
        plan.values[v].bytes > 0) {
      roots.push_back(v);
    }
  }
  std::sort(roots.begin(), roots.end(), [&](ir::ValueId a, ir::ValueId b) {
    const int64_t sa = AlignUp(plan.values[a].bytes, align), sb = AlignUp(plan.values[b].bytes, align);
    if (sa != sb) return sa > sb;
    if (root_live[a].begin != root_live[b].begin) return root_live[a].begin < root_live[b].begin;
    return a < b;
  });
  // With a split, the buffers live across it go first, packed from 0 (they are all live at the
  // split, so they cannot share bytes), and every other buffer is placed above them.
  const int32_t split = options.split_position;
  auto crosses = [&](ir::ValueId r) { return split >= 0 && root_live[r].begin < split && root_live[r].end >= split; };
  if (split >= 0) std::stable_partition(roots.begin(), roots.end(), crosses);
  std::vector<Placed> placed;
  std::vector<int64_t> root_offset(nv, -1);
  std::vector<const Placed*> overlapping;
  for (ir::ValueId r : roots) {
    const int64_t size = AlignUp(plan.values[r].bytes, align);
    const bool saved = crosses(r);
    overlapping.clear();
    for (const Placed& p : placed)
      if (p.live.Intersects(root_live[r]) && (saved || p.offset >= plan.split_bytes)) overlapping.push_back(&p);
    std::sort(overlapping.begin(), overlapping.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    int64_t best = -1, best_gap = std::numeric_limits<int64_t>::max(), prev_end = saved ? 0 : plan.split_bytes;
    for (const Placed* p : overlapping) {
      const int64_t gap = p->offset - prev_end;
      if (gap >= size && gap < best_gap) {
        best = prev_end;
        best_gap = gap;
      }
      prev_end = std::max(prev_end, p->offset + p->size);
    }
    if (best < 0) best = prev_end;
    placed.push_back({best, size, root_live[r]});
    root_offset[r] = best;
    plan.arena_bytes = std::max(plan.arena_bytes, best + size);
    if (saved) plan.split_bytes = plan.arena_bytes;
  }
  // The liveness lower bound: the largest sum of live aligned buffers at one position.
  if (n > 0) {
    std::vector<int64_t> delta(n + 1, 0);
    for (const Placed& p : placed) {
      delta[std::max(0, p.live.begin)] += p.size;
      delta[std::min(n - 1, p.live.end) + 1] -= p.size;
    }
    int64_t cur = 0;
    for (int32_t t = 0; t < n; ++t) {
      cur += delta[t];
      if (cur > plan.peak_bytes) {
        plan.peak_bytes = cur;
        plan.peak_position = t;
      }
    }
  }

  // Phase 7: the persistent regions, in value-id order; the workspace.
  if (options.workspace_bytes) {
    for (ir::NodeId id : order) {
      plan.workspace_bytes = std::max(plan.workspace_bytes, AlignUp(options.workspace_bytes(g, g.node(id)), align));
    }
  }
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!used[v] || plan.values[v].buffer != v) continue;
    int64_t* region_bytes = nullptr;
    switch (region_of_root(v)) {
      case MemoryRegion::kParameters:
        region_bytes = &plan.parameter_bytes;
        break;
      case MemoryRegion::kGradients:
        region_bytes = &plan.gradient_bytes;
        break;
      case MemoryRegion::kOptimizerState:
        region_bytes = &plan.optimizer_state_bytes;
        break;
      case MemoryRegion::kConstants:
        region_bytes = &plan.constant_bytes;
        break;
      default:
        continue;
    }
    root_offset[v] = *region_bytes;
    *region_bytes += AlignUp(plan.values[v].bytes, align);
  }

  // Phase 8: every value takes its buffer's region and offset.
  for (ir::ValueId v = 0; v < nv; ++v) {
    ValueMemory& m = plan.values[v];
    if (!used[v]) continue;
    const ir::ValueId r = m.buffer;
    m.region = region_of_root(r);
    if (m.region == MemoryRegion::kArena) {
      if (!root_live[r].valid()) {  // never produced by the scheduled nodes
        m.region = MemoryRegion::kNone;
        continue;
      }
      m.offset = plan.values[r].bytes > 0 ? root_offset[r] : 0;
      m.live_begin = root_live[r].begin;
      m.live_end = root_live[r].end;
    } else {
      m.offset = root_offset[r];
    }
  }
  return plan;
}

}  // namespace onnxpipe::partitioner
