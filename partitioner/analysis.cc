// Phase 2: positions, parameter ownership, crossing bytes per cut, cut candidates. Everything is
// linear in the graph size (one pass over the nodes, difference arrays for the crossings) so that
// a 96-layer model is analysed in milliseconds.
#include "partitioner/analysis.h"

#include <algorithm>
#include <regex>
#include <unordered_map>

#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::partitioner {

std::string LayerKey(const std::string& scope) {
  static const std::regex indexed(R"(.*[._]\d+$)");
  std::string first;
  size_t begin = 0;
  while (begin < scope.size()) {
    if (scope[begin] == '/') {
      ++begin;
      continue;
    }
    size_t end = scope.find('/', begin);
    if (end == std::string::npos) end = scope.size();
    const std::string prefix = scope.substr(0, end);
    if (first.empty()) first = prefix;
    if (std::regex_match(scope.substr(begin, end - begin), indexed)) return prefix;
    begin = end;
  }
  return first.empty() ? "(top)" : first;
}

int32_t GraphAnalysis::unit_of_position(int32_t p) const {
  auto it = std::upper_bound(unit_begin.begin(), unit_begin.end(), p);
  return static_cast<int32_t>(it - unit_begin.begin()) - 1;
}

bool GraphAnalysis::IsForward(ir::NodeId id) const {
  return graph->node(id).phase == ir::Phase::kForward;
}

bool GraphAnalysis::Holds(ir::ValueId param, int32_t p0, int32_t p1) const {
  const std::vector<int32_t>& ps = holder_positions[param];
  return std::any_of(ps.begin(), ps.end(), [&](int32_t p) { return p >= p0 && p < p1; });
}

bool GraphAnalysis::IsSharedOutside(ir::ValueId param, int32_t p0, int32_t p1) const {
  const std::vector<int32_t>& ps = holder_positions[param];
  return std::any_of(ps.begin(), ps.end(), [&](int32_t p) { return p >= 0 && (p < p0 || p >= p1); });
}

absl::StatusOr<GraphAnalysis> AnalyzeTrainingGraph(const ir::Graph& g, const AnalysisOptions& options) {
  GraphAnalysis a;
  a.graph = &g;
  a.order = g.LiveNodes();
  const int32_t nv = g.num_values();
  a.is_input.assign(nv, false);
  for (ir::ValueId v : g.inputs()) a.is_input[v] = true;

  // The stored order must be a schedule: every computed operand produced earlier.
  {
    std::vector<bool> produced(nv, false);
    for (ir::NodeId id : a.order) {
      const ir::Node& n = g.node(id);
      for (ir::ValueId v : n.inputs) {
        if (v == ir::kNoValue || g.value(v).constant || a.is_input[v]) continue;
        if (!produced[v]) {
          return INVALID_ARGUMENT() << "training graph: node '" << n.name << "' (" << ir::OpName(n.op)
                                    << ") reads '" << g.value(v).name
                                    << "' before it is produced; the graph is not topologically sorted";
        }
      }
      for (ir::ValueId v : n.outputs)
        if (v != ir::kNoValue) produced[v] = true;
    }
  }

  // Parameters and their gradients.
  a.is_param.assign(nv, false);
  a.is_param_grad.assign(nv, false);
  bool has_updates = false;
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::Value& s = g.value(u.state);
    if (s.constant && s.is_initializer && ir::IsFloat(s.dtype)) a.is_param[u.state] = true;
  }
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    if (!IsUpdateOp(n.op)) continue;
    has_updates = true;
    if (n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue) a.is_param_grad[n.inputs[1]] = true;
  }
  if (!has_updates) {  // a backward-only graph: BuildGradients' "grad/<param>" outputs
    for (ir::ValueId v : g.outputs()) {
      const std::string& name = g.value(v).name;
      if (name.rfind("grad/", 0) != 0) continue;
      a.is_param_grad[v] = true;
      const ir::ValueId p = g.FindValue(name.substr(5));
      if (p != ir::kNoValue && g.value(p).constant) a.is_param[p] = true;
    }
  }

  // Sizes: every value a node touches must have a concrete shape.
  a.value_bytes.assign(nv, 0);
  a.uses = g.ComputeUses();
  for (ir::ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g.value(v);
    const bool touched = !a.uses[v].empty() || val.producer != ir::kNoNode || a.is_input[v];
    if (!touched) continue;
    if (!val.shape_known || !ir::IsConcrete(val.shape)) {
      return INVALID_ARGUMENT() << "training graph: value '" << val.name << "' has shape "
                                << (val.shape_known ? ir::ShapeToString(val.shape) : "unknown")
                                << "; bind the batch and sequence dims (--batch, --seq) first";
    }
    a.value_bytes[v] = ir::NumElements(val.shape).value() * ir::DTypeSize(val.dtype);
  }

  // Forward positions.
  a.position.assign(g.num_node_slots(), -1);
  std::unordered_map<std::string, int32_t> forward_by_name;
  for (ir::NodeId id : a.order) {
    if (g.node(id).phase != ir::Phase::kForward) continue;
    const int32_t p = static_cast<int32_t>(a.forward.size());
    a.position[id] = p;
    a.forward.push_back(id);
    forward_by_name.emplace(g.node(id).name, p);
  }
  const int32_t F = a.num_positions();
  if (F == 0) return INVALID_ARGUMENT() << "training graph '" << g.name << "' has no forward nodes";

  // A parameter's compute copy (autodiff/optimizer.h: compute_copies), which its update writes, is read in its
  // stead: the copy's readers are the parameter's.
  std::vector<ir::ValueId> copy_of(nv, ir::kNoValue);
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::NodeId m = g.value(u.new_value).producer;
    if (m == ir::kNoNode || !IsUpdateOp(g.node(m).op)) continue;
    if (g.value(u.new_value).producer_output == ir::UpdateComputeCopyOutput(g.node(m).op)) {
      copy_of[g.node(m).inputs[0]] = u.state;
    }
  }
  auto readers = [&](ir::ValueId param) {
    std::vector<ir::NodeId> r = a.uses[param];
    if (const ir::ValueId c = copy_of[param]; c != ir::kNoValue) r.insert(r.end(), a.uses[c].begin(), a.uses[c].end());
    return r;
  };

  // Parameter owners: the first forward consumer.
  a.param_owner.assign(nv, -1);
  std::unordered_map<std::string, ir::ValueId> param_by_name;
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!a.is_param[v]) continue;
    param_by_name.emplace(g.value(v).name, v);
    int32_t owner = -1;
    for (ir::NodeId u : readers(v)) {
      const int32_t p = a.position[u];
      if (p >= 0 && g.node(u).phase == ir::Phase::kForward && (owner < 0 || p < owner)) owner = p;
    }
    a.param_owner[v] = owner;
  }

  // Backward and optimizer nodes, in order (so that a Sum's contributions are placed already).
  auto latest_input = [&](const ir::Node& n) {
    int32_t p = -1;
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue || g.value(v).producer == ir::kNoNode) continue;
      p = std::max(p, a.position[g.value(v).producer]);
    }
    return p;
  };
  auto origin_position = [&](const ir::Node& n) -> int32_t {
    if (n.origin.empty()) return -1;
    if (auto it = forward_by_name.find(n.origin); it != forward_by_name.end()) return it->second;
    if (auto it = param_by_name.find(n.origin); it != param_by_name.end()) return a.param_owner[it->second];
    return -1;
  };
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::kForward) continue;
    int32_t p = -1;
    if (n.phase == ir::Phase::kBackward) {
      p = origin_position(n);
      if (p < 0) p = latest_input(n);
      if (p < 0) p = F - 1;
    } else {
      p = origin_position(n);
      if (p < 0) {
        a.global_nodes.push_back(id);
        continue;
      }
    }
    a.position[id] = p;
  }

  // Post-step nodes: the optimizer, then (to a fixed point, in reverse order so that chains settle
  // in one pass) the backward Sums and copies read only by post-step nodes.
  a.post_step.assign(g.num_node_slots(), false);
  for (ir::NodeId id : a.order) a.post_step[id] = g.node(id).phase == ir::Phase::kOptimizer;
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = a.order.rbegin(); it != a.order.rend(); ++it) {
      const ir::Node& n = g.node(*it);
      if (a.post_step[*it] || n.phase != ir::Phase::kBackward) continue;
      if (n.op != ir::OpKind::kSum && n.op != ir::OpKind::kIdentity) continue;
      bool any = false, only_post = true;
      for (ir::ValueId o : n.outputs) {
        if (o == ir::kNoValue) continue;
        for (ir::NodeId c : a.uses[o]) {
          any = true;
          only_post = only_post && a.post_step[c];
        }
      }
      if (any && only_post) a.post_step[*it] = changed = true;
    }
  }

  // Gradient tails of the parameters, their contributions, and where each parameter is held.
  a.tail_param.assign(g.num_node_slots(), ir::kNoValue);
  a.contribution_param.assign(nv, ir::kNoValue);
  a.holder_positions.assign(nv, {});
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::kForward || n.origin.empty()) continue;
    if (auto it = param_by_name.find(n.origin); it != param_by_name.end()) a.tail_param[id] = it->second;
  }
  for (ir::NodeId id : a.order) {
    const ir::ValueId param = a.tail_param[id];
    if (param == ir::kNoValue) continue;
    for (ir::ValueId v : g.node(id).inputs) {
      if (v == ir::kNoValue || g.value(v).constant) continue;
      const ir::NodeId m = g.value(v).producer;
      if (m == ir::kNoNode || a.tail_param[m] != ir::kNoValue || a.position[m] < 0) continue;
      a.contribution_param[v] = param;
      a.holder_positions[param].push_back(a.position[m]);
    }
  }
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (!a.is_param[v]) continue;
    std::vector<int32_t>& ps = a.holder_positions[v];
    if (a.param_owner[v] >= 0) ps.push_back(a.param_owner[v]);
    for (ir::NodeId u : readers(v))
      if (!a.post_step[u] && a.position[u] >= 0) ps.push_back(a.position[u]);
    std::sort(ps.begin(), ps.end());
    ps.erase(std::unique(ps.begin(), ps.end()), ps.end());
  }

  // Buffer sharing of views (as the memory planner does it).
  a.alias_root.resize(nv);
  for (ir::ValueId v = 0; v < nv; ++v) a.alias_root[v] = v;
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    if (!IsAliasOp(n.op) || n.inputs.empty() || n.inputs[0] == ir::kNoValue || n.outputs.empty()) continue;
    const ir::ValueId out = n.outputs[0];
    if (out == ir::kNoValue || a.is_param_grad[out] || n.phase == ir::Phase::kOptimizer) continue;
    a.alias_root[out] = a.alias_root[n.inputs[0]];
  }

  // Crossing bytes per cut: a value produced at position p and read at positions lo..hi crosses
  // the cuts (p, hi] forward and (lo, p] backward.
  std::vector<int64_t> dfwd(F + 2, 0), dbwd(F + 2, 0);
  for (ir::ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g.value(v);
    if (val.constant || val.producer == ir::kNoNode) continue;
    const int32_t p = a.position[val.producer];
    if (p < 0) continue;
    int32_t lo = p, hi = p;
    for (ir::NodeId u : a.uses[v]) {
      const int32_t q = a.position[u];
      if (q < 0) continue;
      const ir::Node& un = g.node(u);
      if (a.tail_param[u] != ir::kNoValue) continue;  // a contribution: all-reduced once per step
      bool data_use = false;
      for (size_t i = 0; i < un.inputs.size(); ++i)
        if (un.inputs[i] == v && !IsShapeOnlyOperand(un, static_cast<int>(i))) data_use = true;
      if (!data_use) continue;
      lo = std::min(lo, q);
      hi = std::max(hi, q);
    }
    if (hi > p) {
      dfwd[p + 1] += a.value_bytes[v];
      dfwd[hi + 1] -= a.value_bytes[v];
    }
    if (lo < p) {
      dbwd[lo + 1] += a.value_bytes[v];
      dbwd[p + 1] -= a.value_bytes[v];
    }
  }
  a.cross_fwd_bytes.assign(F + 1, 0);
  a.cross_bwd_bytes.assign(F + 1, 0);
  int64_t f = 0, b = 0;
  for (int32_t c = 0; c <= F; ++c) {
    f += dfwd[c];
    b += dbwd[c];
    a.cross_fwd_bytes[c] = f;
    a.cross_bwd_bytes[c] = b;
  }
  a.cross_fwd_bytes[0] = a.cross_bwd_bytes[0] = 0;
  a.cross_fwd_bytes[F] = a.cross_bwd_bytes[F] = 0;

  // Cut candidates.
  if (F > 1) {
    int32_t lo = 1, hi = F - 1;
    if (F >= 8) {
      lo = std::max(1, F / 4);
      hi = std::min(F - 1, (3 * F) / 4);
    }
    int64_t smallest = -1;
    for (int32_t c = lo; c <= hi; ++c) {
      const int64_t t = a.cross_fwd_bytes[c] + a.cross_bwd_bytes[c];
      if (smallest < 0 || t < smallest) smallest = t;
    }
    const double limit = static_cast<double>(smallest) * (1.0 + options.cut_slack);
    for (int32_t c = 1; c < F; ++c) {
      if (static_cast<double>(a.cross_fwd_bytes[c] + a.cross_bwd_bytes[c]) <= limit) {
        a.cut_candidates.push_back(c);
      }
    }
  }
  a.unit_begin.push_back(0);
  for (int32_t c : a.cut_candidates) a.unit_begin.push_back(c);
  a.unit_begin.push_back(F);

  // Layers: from the node's scope; exporters that leave no scopes (torch.export names nodes
  // "add_48") still name parameters by module ("layers.3.linear1.weight"), so a scopeless node
  // takes the layer of a parameter it reads, and one between two nodes of the same layer takes
  // that layer.
  auto from_parameter = [&](const ir::Node& n) -> std::string {
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue || !g.value(v).is_initializer) continue;
      const std::string& name = g.value(v).name;
      std::string key;
      size_t pos = 0;
      while (pos <= name.size()) {
        size_t dot = name.find('.', pos);
        if (dot == std::string::npos) dot = name.size();
        const std::string part = name.substr(pos, dot - pos);
        key += (key.empty() ? "" : ".") + part;
        const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
        if (digits) return "/" + key;
        pos = dot + 1;
      }
      const size_t first = name.find('.');
      return "/" + name.substr(0, first);
    }
    return "";
  };
  a.layer_of_position.reserve(F);
  for (ir::NodeId id : a.forward) {
    std::string key = LayerKey(g.node(id).scope);
    if (key == "(top)") {
      const std::string p = from_parameter(g.node(id));
      if (!p.empty()) key = p;
    }
    a.layer_of_position.push_back(key);
  }
  std::vector<std::string> next_known(F + 1, "(top)");
  for (int32_t p = F - 1; p >= 0; --p) {
    next_known[p] = a.layer_of_position[p] != "(top)" ? a.layer_of_position[p] : next_known[p + 1];
  }
  std::string prev_known = "(top)";
  for (int32_t p = 0; p < F; ++p) {
    if (a.layer_of_position[p] == "(top)" && prev_known != "(top)" && next_known[p] == prev_known) {
      a.layer_of_position[p] = prev_known;
    }
    if (a.layer_of_position[p] != "(top)") prev_known = a.layer_of_position[p];
  }
  // What is left outside every layer (embedding scale, pooling, the loss) is named by the first
  // node of each run, so that the runs before and after the layers stay apart.
  for (int32_t p = 0; p < F;) {
    if (a.layer_of_position[p] != "(top)") {
      ++p;
      continue;
    }
    std::string name = g.node(a.forward[p]).name;
    while (!name.empty() && name[0] == '/') name.erase(0, 1);
    const std::string key = name.empty() ? "(top)" : "(top) " + name;
    for (; p < F && a.layer_of_position[p] == "(top)"; ++p) a.layer_of_position[p] = key;
  }
  return a;
}

}  // namespace onnxpipe::partitioner
