// Phase 5: the stage programs and their memory. The builder works in three passes: (1) index the
// placement (which stages run each node, in which phase) and check it; (2) walk every stage's
// nodes in run order, recompute clones included, checking that each operand is available where
// and when it is read and recording what crosses stages; (3) copy the training graph for the
// stages asked for and materialise the clones. Passes 1 and 2 touch no graph copy, so the search
// can build one stage of a candidate split cheaply. Stage graphs keep the training graph's value
// and node ids, so plans, transfers, reports and tests name things by one id.
#include "partitioner/stage_program.h"

#include <algorithm>
#include <array>
#include <functional>
#include <optional>
#include <set>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"
#include "frontend/passes/recompute_clones.h"

namespace onnxpipe::partitioner {
namespace {

using ir::AlignUp;

enum class Phase : uint8_t { kNone, kForward, kBackward, kPost };

// plan.json's name of the list a phase's nodes are under.
const char* ListName(Phase p) { return std::array{"?", "forward", "backward", "optimizer"}[static_cast<int>(p)]; }

bool Contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::string Desc(const ir::Node& n) { return "'" + n.name + "' (" + std::string(ir::OpName(n.op)) + ")"; }

// Placement pass 1: where every node runs.
struct Index {
  std::vector<Phase> phase;                  // per node id
  std::vector<std::vector<int32_t>> stages;  // per node id: the stages running it, ascending
  std::vector<int32_t> primary;              // per node id: the stage whose outputs other stages read
  bool RunsOn(ir::NodeId id, int32_t k) const { return std::binary_search(stages[id].begin(), stages[id].end(), k); }
};

absl::StatusOr<Index> IndexPlacement(const GraphAnalysis& a, const std::vector<StageNodes>& placement) {
  const ir::Graph& g = *a.graph;
  const int32_t K = static_cast<int32_t>(placement.size());
  if (K < 1) return INVALID_ARGUMENT() << "a pipeline needs at least one stage";
  Index x;
  x.phase.assign(g.num_node_slots(), Phase::kNone);
  x.stages.assign(g.num_node_slots(), {});
  x.primary.assign(g.num_node_slots(), -1);
  for (int32_t k = 0; k < K; ++k) {
    const StageNodes& sn = placement[k];
    if (sn.forward.empty()) return INVALID_ARGUMENT() << "stage " << k << " has no forward node";
    for (Phase ph : {Phase::kForward, Phase::kBackward, Phase::kPost}) {
      const std::vector<ir::NodeId>& list = ph == Phase::kForward    ? sn.forward
                                            : ph == Phase::kBackward ? sn.backward
                                                                     : sn.post;
      for (ir::NodeId id : list) {
        if (id < 0 || id >= g.num_node_slots() || g.node(id).removed) {
          return INVALID_ARGUMENT() << "stage " << k << " lists node id " << id << ", not a node of the training graph";
        }
        const ir::Node& n = g.node(id);
        const Phase want = n.phase == ir::Phase::kForward ? Phase::kForward
                           : a.post_step[id]              ? Phase::kPost
                                                          : Phase::kBackward;
        if (ph != want) {
          return INVALID_ARGUMENT() << "stage " << k << " lists node " << Desc(n) << " under " << ListName(ph)
                                    << ", but it is "
                                    << (want == Phase::kPost ? std::string("run once per step after the accumulation")
                                                             : "a " + std::string(ListName(want)) + " node")
                                    << ": list it under " << ListName(want);
        }
        if (!x.stages[id].empty() && x.stages[id].back() == k) {
          return INVALID_ARGUMENT() << "stage " << k << " lists node " << Desc(n) << " twice";
        }
        x.stages[id].push_back(k);
        x.phase[id] = ph;
      }
    }
  }
  int32_t coordinator = -1;
  ir::NodeId first_global = ir::kNoNode;
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    const std::vector<int32_t>& on = x.stages[id];
    if (on.empty()) return INVALID_ARGUMENT() << "node " << Desc(n) << " of the training graph is on no stage";
    if (on.size() > 1 && !(x.phase[id] == Phase::kPost && a.tail_param[id] != ir::kNoValue)) {
      return INVALID_ARGUMENT() << "node " << Desc(n) << " is on stages " << on[0] << " and " << on[1]
                                << "; only a shared parameter's optimizer nodes run on several stages (its holders)";
    }
    const int32_t p = a.position[id];
    if (p < 0) {  // a global node: the coordinator's
      if (coordinator >= 0 && on[0] != coordinator) {
        return INVALID_ARGUMENT() << "the global optimizer nodes " << Desc(g.node(first_global)) << " and " << Desc(n)
                                  << " are on stages " << coordinator << " and " << on[0]
                                  << ": the gradient norm runs on one stage";
      }
      coordinator = on[0];
      first_global = id;
      x.primary[id] = on[0];
      continue;
    }
    // Everything at a forward position runs where that forward node runs (replicas besides).
    const ir::NodeId f = a.forward[p];
    const int32_t home = x.stages[f].empty() ? -1 : x.stages[f][0];
    if (!x.RunsOn(id, home)) {
      const std::string what = n.phase == ir::Phase::kForward    ? ""
                               : n.phase == ir::Phase::kBackward ? "backward "
                                                                 : "optimizer ";
      return INVALID_ARGUMENT() << what << "node " << Desc(n) << " is on stage " << on[0] << ", but the forward node "
                                << Desc(g.node(f)) << " it belongs to is on stage " << home
                                << ": a node's gradient and its parameters' updates run where the node runs";
    }
    x.primary[id] = home;
  }
  return x;
}

struct Tables {
  std::map<int32_t, std::set<ir::ValueId>> send_f, recv_f, send_b, recv_b, send_p, recv_p;
  std::set<ir::ValueId> accumulate, data, step;
  ir::ValueId loss_scale = ir::kNoValue;
};

// One step of a stage's run order: a node, or the clone of a region's forward node.
struct Item {
  ir::NodeId node;
  int32_t region = -1;  // >= 0: a clone of `node` in that region
};

struct Walked {
  std::vector<Tables> tables;
  std::vector<std::vector<Item>> backward;  // per stage, clones included
  std::vector<std::vector<BackwardPart>> parts;
  std::vector<std::vector<bool>> cloned;  // per stage, per value: recomputed there
  std::vector<std::vector<ir::Graph::StateUpdate>> updates;
  std::vector<std::set<ir::ValueId>> updated;
  ir::ValueId loss = ir::kNoValue, loss_seed = ir::kNoValue, grad_norm = ir::kNoValue;
};

// Placement pass 2: every stage's run order, checked, and what crosses stages.
absl::StatusOr<Walked> Walk(const GraphAnalysis& a, const std::vector<StageNodes>& placement, const Index& x) {
  const ir::Graph& g = *a.graph;
  const int32_t K = static_cast<int32_t>(placement.size());
  const int32_t nv = g.num_values();
  Walked w;
  w.tables.resize(K);
  w.backward.resize(K);
  w.parts.resize(K);
  w.cloned.assign(K, std::vector<bool>(nv, false));
  w.updates.resize(K);
  w.updated.resize(K);

  // The loss (the graph output a forward node makes), its seed and the gradient norm.
  for (ir::ValueId v : g.outputs()) {
    const ir::NodeId p = g.value(v).producer;
    if (p == ir::kNoNode) continue;
    if (g.node(p).phase == ir::Phase::kForward && w.loss == ir::kNoValue) w.loss = v;
    if (g.node(p).phase == ir::Phase::kOptimizer && w.grad_norm == ir::kNoValue) w.grad_norm = v;
  }
  if (w.loss == ir::kNoValue) return INVALID_ARGUMENT() << "the training graph has no loss output";
  w.loss_seed = g.FindValue("grad/" + g.value(w.loss).name);
  if (w.loss_seed == ir::kNoValue || !g.value(w.loss_seed).constant ||
      g.value(w.loss_seed).constant->num_elements() != 1 || g.value(w.loss_seed).constant->GetAsDouble(0) != 1.0) {
    return INVALID_ARGUMENT() << "cannot find the loss seed 'grad/" << g.value(w.loss).name
                              << "' (a constant 1 from autodiff) to scale per micro-batch";
  }

  // Graph inputs: read per micro-batch (data) or by the optimizer (lr, step); never both.
  std::vector<int> input_use(nv, 0);  // bit 0: F/B, bit 1: post
  for (ir::NodeId id : a.order)
    for (ir::ValueId v : g.node(id).inputs)
      if (v != ir::kNoValue && a.is_input[v]) input_use[v] |= a.post_step[id] ? 2 : 1;
  for (ir::ValueId v = 0; v < nv; ++v) {
    if (input_use[v] == 3) {
      return INVALID_ARGUMENT() << "graph input '" << g.value(v).name
                                << "' is read per micro-batch and by the optimizer; it cannot be fed both ways";
    }
  }

  for (int32_t k = 0; k < K; ++k) {
    const StageNodes& sn = placement[k];
    Tables& t = w.tables[k];
    std::vector<bool> made(nv, false), clone_made(nv, false);
    std::vector<bool>& cloned = w.cloned[k];
    // Recompute regions: forward nodes of this stage, each in one region, before a backward node here.
    std::vector<int32_t> region_of(g.num_node_slots(), -1);
    std::map<ir::NodeId, std::vector<int32_t>> regions_before;
    for (size_t r = 0; r < sn.regions.size(); ++r) {
      const RecomputeRegion& region = sn.regions[r];
      if (region.nodes.empty()) return INVALID_ARGUMENT() << "stage " << k << ": recompute region " << r << " is empty";
      for (ir::NodeId id : region.nodes) {
        if (id < 0 || id >= g.num_node_slots() || x.phase[id] != Phase::kForward || !x.RunsOn(id, k)) {
          return INVALID_ARGUMENT() << "stage " << k << ": recompute region " << r << " names "
                                    << (id >= 0 && id < g.num_node_slots() ? Desc(g.node(id)) : "a node")
                                    << ", not a forward node of this stage";
        }
        if (region_of[id] >= 0) {
          return INVALID_ARGUMENT() << "stage " << k << ": node " << Desc(g.node(id)) << " is in two recompute regions";
        }
        region_of[id] = static_cast<int32_t>(r);
        for (ir::ValueId o : g.node(id).outputs)
          if (o != ir::kNoValue) cloned[o] = true;
      }
      const ir::NodeId b = region.before;
      if (b < 0 || b >= g.num_node_slots() || x.phase[b] != Phase::kBackward || !x.RunsOn(b, k)) {
        return INVALID_ARGUMENT() << "stage " << k << ": recompute region " << r
                                  << " runs before a node that is not a backward node of this stage";
      }
      regions_before[b].push_back(static_cast<int32_t>(r));
    }
    for (ir::NodeId b : sn.backward) {
      if (auto it = regions_before.find(b); it != regions_before.end()) {
        // (regions placed before the same node run as one part)
        w.parts[k].push_back({ActionKind::kRecompute, static_cast<int32_t>(w.backward[k].size()), 0});
        for (int32_t r : it->second)
          for (ir::NodeId id : sn.regions[r].nodes) w.backward[k].push_back({id, r});
        w.parts[k].back().end = static_cast<int32_t>(w.backward[k].size());
      }
      if (w.parts[k].empty() || w.parts[k].back().kind != ActionKind::kBackward) {
        w.parts[k].push_back({ActionKind::kBackward, static_cast<int32_t>(w.backward[k].size()), 0});
      }
      w.backward[k].push_back({b, -1});
      w.parts[k].back().end = static_cast<int32_t>(w.backward[k].size());
    }
    if (w.parts[k].empty()) w.parts[k].push_back({ActionKind::kBackward, 0, 0});

    auto where = [&](const ir::Node& n) { return "stage " + std::to_string(k) + ": node " + Desc(n); };
    auto feed = [&](ir::ValueId v, Phase ph, const ir::Node& n) -> absl::Status {
      if (v == w.loss_seed) {
        if (ph == Phase::kPost) return INVALID_ARGUMENT() << where(n) << " reads the loss seed in the optimizer";
        t.loss_scale = v;
      } else if (input_use[v] & 2) {
        t.step.insert(v);
      } else {
        t.data.insert(v);
      }
      return absl::OkStatus();
    };
    // One operand read in phase `ph`; region >= 0: read by a recompute clone of that region.
    auto read = [&](const ir::Node& n, ir::ValueId v, Phase ph, int32_t region) -> absl::Status {
      if (v == ir::kNoValue) return absl::OkStatus();
      const ir::Value& val = g.value(v);
      if (v == w.loss_seed) return feed(v, ph, n);
      if (val.constant) return absl::OkStatus();
      if (val.producer == ir::kNoNode) {
        if (!a.is_input[v]) return INVALID_ARGUMENT() << where(n) << " reads '" << val.name << "', which nothing makes";
        return feed(v, ph, n);
      }
      const ir::NodeId p = val.producer;
      if (region >= 0 && region_of[p] == region) {  // an earlier clone of the same region
        if (!clone_made[v]) {
          return INVALID_ARGUMENT() << "stage " << k << ": recompute region " << region << " lists " << Desc(n)
                                    << " before " << Desc(g.node(p)) << ", whose output it reads";
        }
        return absl::OkStatus();
      }
      if (ph == Phase::kBackward && region < 0 && cloned[v]) {  // the recomputed value
        if (!clone_made[v]) {
          return INVALID_ARGUMENT() << where(n) << " reads the recomputed '" << val.name
                                    << "' before its recompute region runs";
        }
        return absl::OkStatus();
      }
      const Phase pp = x.phase[p];
      const int32_t ps = x.primary[p];
      const bool here = x.RunsOn(p, k);
      const std::string name = "'" + val.name + "'";
      if (ph != Phase::kPost && pp == Phase::kPost) {
        return INVALID_ARGUMENT() << where(n) << " reads " << name << ", an optimizer output";
      }
      if (pp == Phase::kBackward && ph == Phase::kForward) {
        return INVALID_ARGUMENT() << where(n) << " (forward) reads " << name << ", a backward value";
      }
      if (here && !made[v]) {
        return INVALID_ARGUMENT() << where(n) << " reads " << name << " before " << Desc(g.node(p))
                                  << " makes it (the stage's " << ListName(ph) << " order)";
      }
      if (ph != Phase::kPost) {
        if (here) return absl::OkStatus();
        if (pp == Phase::kForward && ph == Phase::kForward && ps > k) {
          return INVALID_ARGUMENT() << where(n) << " reads " << name << " from the later stage " << ps
                                    << ": stages must follow the forward order (a dependency flows backwards)";
        }
        if (pp == Phase::kBackward && ps < k) {
          return INVALID_ARGUMENT() << where(n) << " reads " << name << ", a backward value of stage " << ps
                                    << ", whose backward runs later: a gradient cannot flow to a later stage";
        }
        if (ph == Phase::kBackward) {  // a value the forward received stays for the backward
          auto it = t.recv_f.find(ps);
          if (it != t.recv_f.end() && it->second.count(v)) return absl::OkStatus();
        }
        (pp == Phase::kForward ? w.tables[ps].send_f : w.tables[ps].send_b)[k].insert(v);
        // An earlier stage's forward value arrives with the forward's transfers even when only the backward reads it:
        // the channel then carries the sender's messages in the order it makes them (NCCL matches by order).
        (ph == Phase::kForward || (pp == Phase::kForward && ps < k) ? t.recv_f : t.recv_b)[ps].insert(v);
        return absl::OkStatus();
      }
      if (pp == Phase::kForward) {
        return INVALID_ARGUMENT() << where(n) << " (optimizer) reads the forward value " << name
                                  << "; only gradients can be accumulated over micro-batches";
      }
      if (pp == Phase::kBackward) w.tables[ps].accumulate.insert(v);
      if (!here) {
        w.tables[ps].send_p[k].insert(v);
        t.recv_p[ps].insert(v);
      }
      return absl::OkStatus();
    };
    auto made_by = [&](const ir::Node& n, std::vector<bool>& into) {
      for (ir::ValueId o : n.outputs)
        if (o != ir::kNoValue) into[o] = true;
    };
    for (ir::NodeId id : sn.forward) {
      for (ir::ValueId v : g.node(id).inputs) RETURN_IF_ERROR(read(g.node(id), v, Phase::kForward, -1));
      made_by(g.node(id), made);
    }
    for (const Item& it : w.backward[k]) {
      const ir::Node& n = g.node(it.node);
      for (ir::ValueId v : n.inputs) RETURN_IF_ERROR(read(n, v, Phase::kBackward, it.region));
      made_by(n, it.region >= 0 ? clone_made : made);
    }
    for (ir::NodeId id : sn.post) {
      for (ir::ValueId v : g.node(id).inputs) RETURN_IF_ERROR(read(g.node(id), v, Phase::kPost, -1));
      made_by(g.node(id), made);
    }
  }

  // State updates: on every stage running the update; every stage reading a parameter updates it.
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::NodeId p = g.value(u.new_value).producer;
    if (p == ir::kNoNode || x.phase[p] != Phase::kPost) {
      return INVALID_ARGUMENT() << "state '" << g.value(u.state).name << "' is not updated by an optimizer node";
    }
    for (int32_t k : x.stages[p]) {
      w.updates[k].push_back(u);
      w.updated[k].insert(u.state);
    }
  }
  for (int32_t k = 0; k < K; ++k) {
    for (const std::vector<ir::NodeId>* list : {&placement[k].forward, &placement[k].backward, &placement[k].post}) {
      for (ir::NodeId id : *list) {
        for (ir::ValueId v : g.node(id).inputs) {
          if (v == ir::kNoValue || !a.is_param[v] || w.updated[k].count(v)) continue;
          return INVALID_ARGUMENT() << "stage " << k << ": node " << Desc(g.node(id)) << " reads the parameter '"
                                    << g.value(v).name << "', which this stage does not update: every stage reading "
                                    << "a parameter holds it and runs its optimizer nodes (listed as replicated)";
        }
      }
    }
  }
  return w;
}

// Transfer lists (per peer) in the order their sender posts them: `order(s)` lists stage s's values in that order
// (duplicates and values of no list allowed); `sender` is the stage sending, or each list's peer.
ValueLists InSendOrder(const std::map<int32_t, std::set<ir::ValueId>>& m, std::optional<int32_t> sender,
                       const std::function<std::vector<ir::ValueId>(int32_t)>& order) {
  ValueLists out;
  for (const auto& [peer, vs] : m) {
    std::vector<ir::ValueId>& list = out[peer];
    for (ir::ValueId v : order(sender.value_or(peer)))
      if (vs.count(v) && std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
    for (ir::ValueId v : vs)  // none should be left; kept in the lists all the same
      if (std::find(list.begin(), list.end(), v) == list.end()) list.push_back(v);
  }
  return out;
}

// The micro-batch transfers go as the sender makes them: its forward, then its backward, a node's outputs in order.
std::vector<ir::ValueId> MadeOrder(const ir::Graph& g, const std::vector<StageNodes>& placement, const Walked& w,
                                   int32_t s) {
  std::vector<ir::ValueId> out;
  for (ir::NodeId id : placement[s].forward) out.insert(out.end(), g.node(id).outputs.begin(), g.node(id).outputs.end());
  for (const Item& it : w.backward[s])
    if (it.region < 0) out.insert(out.end(), g.node(it.node).outputs.begin(), g.node(it.node).outputs.end());
  return out;
}

// The optimizer phase's go as the sender sends them: the accumulated values as the phase begins, then what its post
// nodes make, in node order.
std::vector<ir::ValueId> PostOrder(const ir::Graph& g, const std::vector<StageNodes>& placement, const Walked& w,
                                   int32_t s) {
  std::vector<ir::ValueId> out(w.tables[s].accumulate.begin(), w.tables[s].accumulate.end());
  for (ir::NodeId id : placement[s].post) out.insert(out.end(), g.node(id).outputs.begin(), g.node(id).outputs.end());
  return out;
}

// Pass 3: stage k's graph and tables.
StageProgram MakeStage(const GraphAnalysis& a, const std::vector<StageNodes>& placement, const Index& x,
                       const Walked& w, int32_t k) {
  const StageNodes& sn = placement[k];
  const ir::Graph& g = *a.graph;
  StageProgram sp;
  sp.stage = k;
  sp.graph = g;
  ir::Graph& sg = sp.graph;
  sp.regions = sn.regions;
  // Recompute regions: clones of their forward nodes in the backward, which reads them.
  std::vector<passes::BackwardStep> steps;
  for (const Item& it : w.backward[k]) steps.push_back({it.node, it.region});
  passes::ClonedBackward cloned = passes::CloneRecomputeRegions(sg, steps);
  sp.backward = std::move(cloned.order);
  sp.recompute_clones = std::move(cloned.clones);
  sp.cloned_from = std::move(cloned.cloned_from);
  sp.parts = w.parts[k];
  sp.forward = sn.forward;
  sp.post = sn.post;

  const Tables& t = w.tables[k];
  auto made = [&](int32_t s) { return MadeOrder(g, placement, w, s); };
  auto post = [&](int32_t s) { return PostOrder(g, placement, w, s); };
  sp.send_forward = InSendOrder(t.send_f, k, made);
  sp.recv_forward = InSendOrder(t.recv_f, std::nullopt, made);
  sp.send_backward = InSendOrder(t.send_b, k, made);
  sp.recv_backward = InSendOrder(t.recv_b, std::nullopt, made);
  sp.send_post = InSendOrder(t.send_p, k, post);
  sp.recv_post = InSendOrder(t.recv_p, std::nullopt, post);
  sp.accumulate.assign(t.accumulate.begin(), t.accumulate.end());
  sp.data_inputs.assign(t.data.begin(), t.data.end());
  sp.step_inputs.assign(t.step.begin(), t.step.end());
  sp.loss_scale = t.loss_scale;
  sp.state_updates = w.updates[k];
  for (const ir::Graph::StateUpdate& u : sp.state_updates) {
    if (!a.is_param[u.state]) continue;
    sp.parameters.push_back(u.state);
    if (x.stages[g.value(u.new_value).producer].size() > 1) sp.shared_parameters.push_back(u.state);
  }
  std::sort(sp.parameters.begin(), sp.parameters.end());
  std::sort(sp.shared_parameters.begin(), sp.shared_parameters.end());
  const ir::NodeId loss_producer = g.value(w.loss).producer;
  if (x.primary[loss_producer] == k) sp.loss = w.loss;
  if (w.grad_norm != ir::kNoValue && x.RunsOn(g.value(w.grad_norm).producer, k)) sp.grad_norm = w.grad_norm;

  // Constants no node here reads are dropped: a stage keeps its own parameters and optimizer state
  // (never stale copies of other stages'); the loss seed is fed.
  std::vector<bool> read(sg.num_values(), false);
  for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward, &sp.post})
    for (ir::NodeId id : *list)
      for (ir::ValueId v : sg.node(id).inputs)
        if (v != ir::kNoValue) read[v] = true;
  for (const ir::Graph::StateUpdate& u : sp.state_updates) read[u.state] = true;
  for (ir::ValueId v = 0; v < sg.num_values(); ++v) {
    if (sg.value(v).constant && (!read[v] || v == w.loss_seed)) sg.value(v).constant.reset();
  }
  // The stage's interface: what it is fed and what it receives; the training graph's outputs it makes.
  std::set<ir::ValueId> inputs(sp.data_inputs.begin(), sp.data_inputs.end());
  inputs.insert(sp.step_inputs.begin(), sp.step_inputs.end());
  if (sp.loss_scale != ir::kNoValue) inputs.insert(sp.loss_scale);
  for (const ValueLists* m : {&sp.recv_forward, &sp.recv_backward, &sp.recv_post})
    for (const auto& [peer, vs] : *m) inputs.insert(vs.begin(), vs.end());
  sg.inputs().assign(inputs.begin(), inputs.end());
  std::vector<ir::ValueId> outputs;
  for (ir::ValueId v : g.outputs()) {
    const ir::NodeId p = g.value(v).producer;
    if (p != ir::kNoNode && x.RunsOn(p, k)) outputs.push_back(v);
  }
  sg.outputs() = std::move(outputs);
  return sp;
}

// The MicrobatchStage of a stage program over `graph`.
MicrobatchStage MicrobatchOf(const ir::Graph& graph, const StageProgram& sp, int64_t in_flight, int64_t microbatches,
                             int64_t alignment, const WorkspaceFn& workspace) {
  MicrobatchStage m;
  m.graph = &graph;
  m.forward = sp.forward;
  m.backward = sp.backward;
  m.inputs = sp.data_inputs;
  if (sp.loss_scale != ir::kNoValue) m.inputs.push_back(sp.loss_scale);
  for (const auto& [peer, vs] : sp.recv_forward) m.inputs.insert(m.inputs.end(), vs.begin(), vs.end());
  for (const auto& [peer, vs] : sp.recv_backward) m.recv_backward.insert(m.recv_backward.end(), vs.begin(), vs.end());
  m.accumulate = sp.accumulate;
  m.in_flight = static_cast<int32_t>(in_flight);
  m.microbatches = static_cast<int32_t>(microbatches);
  m.alignment = alignment;
  m.workspace = workspace;
  return m;
}

}  // namespace

std::vector<StageNodes> PlaceStages(const GraphAnalysis& a, const std::vector<int32_t>& bounds,
                                    const std::vector<bool>& recompute) {
  const ir::Graph& g = *a.graph;
  const int32_t K = static_cast<int32_t>(bounds.size()) - 1;
  std::vector<StageNodes> out(std::max(K, 0));
  auto stage_of = [&](int32_t p) {
    return static_cast<int32_t>(std::upper_bound(bounds.begin(), bounds.end(), p) - bounds.begin()) - 1;
  };
  // holder[k][param]: stage k holds a parameter that other stages hold too.
  std::vector<std::vector<bool>> holder(K, std::vector<bool>(g.num_values(), false));
  for (int32_t k = 0; k < K; ++k) {
    for (int32_t p = bounds[k]; p < bounds[k + 1]; ++p) out[k].forward.push_back(a.forward[p]);
    for (ir::ValueId v = 0; v < g.num_values(); ++v) {
      holder[k][v] =
          a.is_param[v] && a.Holds(v, bounds[k], bounds[k + 1]) && a.IsSharedOutside(v, bounds[k], bounds[k + 1]);
    }
  }
  for (ir::NodeId id : a.order) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::kForward) continue;
    const int32_t p = a.position[id];
    if (!a.post_step[id]) {
      out[stage_of(std::max(p, 0))].backward.push_back(id);
      continue;
    }
    const int32_t home = p < 0 ? 0 : stage_of(p);  // global nodes: the coordinator, stage 0
    for (int32_t k = 0; k < K; ++k) {
      const ir::ValueId param = a.tail_param[id];
      if (k == home || (param != ir::kNoValue && holder[k][param])) out[k].post.push_back(id);
    }
  }
  for (int32_t k = 0; k < K; ++k) {
    out[k].regions = BuildRegions(a, recompute, bounds[k], bounds[k + 1], out[k].backward);
  }
  return out;
}

absl::StatusOr<PipelineProgram> BuildPipelineProgram(const GraphAnalysis& a, const std::vector<StageNodes>& placement) {
  ASSIGN_OR_RETURN(const Index x, IndexPlacement(a, placement));
  ASSIGN_OR_RETURN(const Walked w, Walk(a, placement, x));
  const ir::Graph& g = *a.graph;
  PipelineProgram p;
  p.num_stages = static_cast<int32_t>(placement.size());
  for (int32_t k = 0; k < p.num_stages; ++k) p.stages.push_back(MakeStage(a, placement, x, w, k));
  p.loss = w.loss;
  p.loss_seed = w.loss_seed;
  p.grad_norm = w.grad_norm;
  p.loss_stage = x.primary[g.value(w.loss).producer];
  if (w.grad_norm != ir::kNoValue) p.grad_norm_stage = x.primary[g.value(w.grad_norm).producer];
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    if (a.is_param[u.state]) p.parameter_owner[u.state] = x.primary[g.value(u.new_value).producer];
  }
  for (int32_t k = 0; k < p.num_stages; ++k) {
    p.all_reduced.push_back(AllReducedSums(p, k));
    for (const auto& [id, group] : p.all_reduced.back())
      if (std::find(p.shared_groups.begin(), p.shared_groups.end(), group) == p.shared_groups.end()) {
        p.shared_groups.push_back(group);
      }
  }
  return p;
}

absl::StatusOr<StageProgram> BuildStageProgram(const GraphAnalysis& a, const std::vector<StageNodes>& placement,
                                               int32_t k) {
  RET_CHECK(k >= 0 && k < static_cast<int32_t>(placement.size()));
  ASSIGN_OR_RETURN(const Index x, IndexPlacement(a, placement));
  ASSIGN_OR_RETURN(const Walked w, Walk(a, placement, x));
  return MakeStage(a, placement, x, w, k);
}

StageShape ShapeOf(const StageProgram& sp) {
  StageShape sh;
  auto peers = [](const ValueLists& m) {
    std::vector<int32_t> out;
    for (const auto& [peer, vs] : m) out.push_back(peer);
    return out;
  };
  sh.recv_forward = peers(sp.recv_forward);
  sh.send_forward = peers(sp.send_forward);
  sh.recv_backward = peers(sp.recv_backward);
  sh.send_backward = peers(sp.send_backward);
  sh.backward.clear();
  for (const BackwardPart& part : sp.parts) sh.backward.push_back(part.kind);
  return sh;
}

std::vector<StageShape> ShapesOf(const PipelineProgram& p) {
  std::vector<StageShape> out;
  for (const StageProgram& sp : p.stages) out.push_back(ShapeOf(sp));
  return out;
}

std::map<ir::NodeId, std::vector<int32_t>> AllReducedSums(const PipelineProgram& p, int32_t k) {
  std::map<ir::NodeId, std::vector<int32_t>> out;
  const StageProgram& sp = p.stages[k];
  for (ir::NodeId id : sp.post) {
    const ir::Node& n = sp.graph.node(id);
    const ir::ValueId param = sp.graph.FindValue(n.origin);
    if (n.op != ir::OpKind::kSum || n.outputs.size() != 1 || param == ir::kNoValue ||
        !std::binary_search(sp.shared_parameters.begin(), sp.shared_parameters.end(), param)) {
      continue;
    }
    const ir::Value& sum = sp.graph.value(n.outputs[0]);
    std::vector<int32_t> group;
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue) break;
      const ir::Value& val = sp.graph.value(v);
      if (val.dtype != sum.dtype || !val.shape_known || !(val.shape == sum.shape)) break;
      int made_on = -1;
      if (std::binary_search(sp.accumulate.begin(), sp.accumulate.end(), v)) made_on = k;
      for (const auto& [peer, vs] : sp.recv_post)
        if (Contains(vs, v)) made_on = peer;
      if (made_on < 0 || Contains(group, made_on)) break;
      group.push_back(made_on);
    }
    if (group.size() != n.inputs.size() || group.size() < 2 || !Contains(group, k)) continue;
    bool qualifies = true;
    for (int32_t s = 0; s < p.num_stages && qualifies; ++s) {
      const StageProgram& h = p.stages[s];
      const bool member = Contains(group, s);
      qualifies = member == (std::find(h.post.begin(), h.post.end(), id) != h.post.end());
      if (!member || !qualifies) continue;
      const ir::ValueId c = n.inputs[std::find(group.begin(), group.end(), s) - group.begin()];
      int readers = 0;
      for (ir::NodeId q : h.post)
        for (ir::ValueId v : h.graph.node(q).inputs) readers += v == c;
      qualifies = readers == 1;
      for (const auto& [peer, vs] : h.send_post)
        if (Contains(vs, c) && !Contains(group, peer)) qualifies = false;
    }
    if (qualifies) out[id] = std::move(group);
  }
  return out;
}


absl::Status ProveDeadlockFree(const PipelineProgram& p, const std::vector<ActionList>& lists) {
  RET_CHECK(static_cast<int32_t>(lists.size()) == p.num_stages);
  // The micro-batch actions: a stage's RECV waits for what its peer sends it for the micro-batch.
  std::vector<StageTiming> unit(p.num_stages);
  for (StageTiming& t : unit) {
    t.forward_s = 1;
    t.backward_s = 2;
  }
  absl::Status st = Simulate(lists, unit).status();
  if (!st.ok()) return Annotate(st, "the pipeline program cannot run");
  // The optimizer phase, which every stage reaches once its micro-batch actions are done, as the
  // executor runs it: send the accumulated values, then each post node in order (receiving what it
  // needs first, sending what it makes).
  // An all-reduce is a barrier of its group: each member announces its arrival (messages with
  // negative ids) and waits for every other member's.
  auto id = [](ir::ValueId v, int32_t src, int32_t dst) -> int64_t { return (int64_t{v} * 4096 + src) * 4096 + dst; };
  auto arrival = [](ir::NodeId n, int32_t src, int32_t dst) -> int64_t {
    return -((int64_t{n} * 4096 + src) * 4096 + dst) - 1;
  };
  std::vector<std::vector<SimStep>> post(p.num_stages);
  for (int32_t s = 0; s < p.num_stages; ++s) {
    const StageProgram& sp = p.stages[s];
    const std::map<ir::NodeId, std::vector<int32_t>>& reduced = p.all_reduced.at(s);
    std::set<ir::ValueId> acc(sp.accumulate.begin(), sp.accumulate.end());
    for (const auto& [n, group] : reduced)
      for (ir::ValueId v : sp.graph.node(n).inputs) acc.erase(v);
    SimStep first;
    first.label = "O:send-accumulated";
    for (const auto& [peer, vs] : sp.send_post)
      for (ir::ValueId v : vs)
        if (acc.count(v)) first.sends.push_back({.message = id(v, s, peer)});
    post[s].push_back(std::move(first));
    std::set<ir::ValueId> have;
    for (ir::NodeId n : sp.post) {
      SimStep y;
      y.label = "O:" + sp.graph.node(n).name;
      if (auto it = reduced.find(n); it != reduced.end()) {
        SimStep arrive;
        arrive.label = y.label + ":arrive";
        for (int32_t t : it->second) {
          if (t == s) continue;
          arrive.sends.push_back({.message = arrival(n, s, t)});
          y.waits.push_back(arrival(n, t, s));
        }
        post[s].push_back(std::move(arrive));
        for (ir::ValueId v : sp.graph.node(n).inputs) have.insert(v);
      }
      for (ir::ValueId v : sp.graph.node(n).inputs) {
        if (v == ir::kNoValue || have.count(v)) continue;
        for (const auto& [peer, vs] : sp.recv_post) {
          if (Contains(vs, v)) {
            y.waits.push_back(id(v, peer, s));
            have.insert(v);
          }
        }
      }
      for (ir::ValueId o : sp.graph.node(n).outputs)
        for (const auto& [peer, vs] : sp.send_post)
          if (o != ir::kNoValue && Contains(vs, o)) {
            y.sends.push_back({.message = id(o, s, peer)});
          }
      post[s].push_back(std::move(y));
    }
  }
  st = SimulateSteps(post).status();
  if (!st.ok()) return Annotate(st, "the pipeline program's optimizer phase cannot run");
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> BuildStageForwardGraph(const GraphAnalysis& a, int32_t unit_begin, int32_t unit_end) {
  RET_CHECK(unit_begin >= 0 && unit_begin < unit_end && unit_end <= a.num_units());
  const ir::Graph& g = *a.graph;
  const int32_t p0 = a.unit_begin[unit_begin], p1 = a.unit_begin[unit_end];
  std::vector<bool> keep(g.num_node_slots(), false);
  for (int32_t p = p0; p < p1; ++p) keep[a.forward[p]] = true;
  ir::Graph sg = g;
  sg.name = g.name + "_stage";
  sg.state_updates().clear();
  std::vector<ir::ValueId> inputs, outputs;
  std::set<ir::ValueId> seen_in, seen_out;
  for (int32_t p = p0; p < p1; ++p) {
    const ir::Node& n = g.node(a.forward[p]);
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue || g.value(v).constant) continue;
      const ir::NodeId m = g.value(v).producer;
      if ((m == ir::kNoNode || !keep[m]) && seen_in.insert(v).second) inputs.push_back(v);
    }
    for (ir::ValueId v : n.outputs) {
      if (v == ir::kNoValue) continue;
      bool leaves = g.IsGraphOutput(v);
      for (ir::NodeId w : a.uses[v]) {
        const int32_t q = a.position[w];
        if (q < p0 || q >= p1) leaves = true;
      }
      if (leaves && seen_out.insert(v).second) outputs.push_back(v);
    }
  }
  for (ir::NodeId id : g.LiveNodes())
    if (!keep[id]) sg.RemoveNode(id);
  sg.inputs() = std::move(inputs);
  sg.outputs() = std::move(outputs);
  RETURN_IF_ERROR(sg.TopoSort());
  return sg;
}

absl::StatusOr<MicrobatchLayout> PlanStageLayout(const StageProgram& sp, int64_t in_flight, int64_t microbatches,
                                                 int64_t alignment, const WorkspaceFn& workspace) {
  absl::StatusOr<MicrobatchLayout> layout =
      PlanMicrobatchLayout(MicrobatchOf(sp.graph, sp, in_flight, microbatches, alignment, workspace));
  if (!layout.ok()) return Annotate(layout.status(), "planning the memory of stage " + std::to_string(sp.stage));
  // The micro-batch layout counts the forward and backward kernels' scratch; the optimizer's run from
  // the same buffer once per step, so the stage's scratch is the largest need of all of them.
  if (workspace) {
    for (ir::NodeId id : sp.post) {
      layout->workspace = std::max(layout->workspace, AlignUp(workspace(sp.graph, sp.graph.node(id)), alignment));
    }
  }
  return layout;
}

absl::StatusOr<StageMemory> PlanStageMemory(const GraphAnalysis& a, const StageProgram& sp, int64_t in_flight,
                                            int64_t microbatches, int64_t alignment, const WorkspaceFn& workspace) {
  const ir::Graph& graph = sp.graph;
  // The persistent regions (parameters, optimizer state, constants) from the whole program.
  std::vector<ir::NodeId> order = sp.forward;
  order.insert(order.end(), sp.backward.begin(), sp.backward.end());
  order.insert(order.end(), sp.post.begin(), sp.post.end());
  MemoryPlanOptions options;
  options.alignment = alignment;
  ASSIGN_OR_RETURN(const MemoryPlan plan, PlanMemory(graph, order, options));
  // The layout the executor allocates, so the planned kernel scratch is what it reserves.
  ASSIGN_OR_RETURN(const MicrobatchLayout layout, PlanStageLayout(sp, in_flight, microbatches, alignment, workspace));

  StageMemory m;
  m.in_flight = in_flight;
  m.saved = layout.saved;
  m.parameters = plan.parameter_bytes;
  // The gradients the stage accumulates over micro-batches, as the executor allocates them: its own parameters'
  // and those it makes for a parameter held on another stage (a bias gradient summed by the next layer's norm
  // backward, passes/ksum_from_producer.h), which it sends once per step.
  m.gradients = layout.accumulators;
  m.optimizer_state = plan.optimizer_state_bytes;
  m.constants = plan.constant_bytes;
  m.arena = layout.arena();
  m.activations = layout.activations();
  m.transient = m.arena - m.activations;
  m.kernel_scratch = layout.workspace;
  // Boundary buffers: every value sent per micro-batch (the transport's copy in flight), and the
  // gradients received once per step (the shared parameters' contributions, and a parameter's gradient
  // made on another stage). Values received per micro-batch land in their planned slots of the arena and
  // are counted there.
  std::set<ir::ValueId> boundary;
  for (const ValueLists* l : {&sp.send_forward, &sp.send_backward})
    for (const auto& [peer, vs] : *l) boundary.insert(vs.begin(), vs.end());
  for (const auto& [peer, vs] : sp.recv_post) {
    for (ir::ValueId v : vs) {
      const ir::ValueId param = a.contribution_param[v];
      if (a.is_param_grad[v] || (param != ir::kNoValue && std::binary_search(sp.shared_parameters.begin(),
                                                                             sp.shared_parameters.end(), param))) {
        boundary.insert(v);
      }
    }
  }
  for (ir::ValueId v : boundary) m.boundary += AlignUp(a.value_bytes[v], alignment);
  m.total = m.parameters + m.gradients + m.optimizer_state + m.constants + m.activations + m.transient +
            m.kernel_scratch + m.boundary;
  return m;
}

}  // namespace onnxpipe::partitioner
