// BuildPipelineProgram and the proof that its action lists cannot deadlock (program.h). Stage
// graphs are full copies of the training graph so that value and node ids mean the same on every
// stage and in the training graph: transfers, plans and reports name values by one id.
#include "executor/pipeline/program.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::pipeline {
namespace {

std::string NodeDesc(const ir::Node& n) { return "node '" + n.name + "' (" + std::string(ir::OpName(n.op)) + ")"; }

using PeerSets = std::map<int32_t, std::set<ir::ValueId>>;

std::map<int32_t, std::vector<ir::ValueId>> Sorted(const PeerSets& p) {
  std::map<int32_t, std::vector<ir::ValueId>> out;
  for (const auto& [peer, vs] : p) out[peer].assign(vs.begin(), vs.end());
  return out;
}

int32_t Find(std::vector<int32_t>& parent, int32_t x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

}  // namespace

const char* StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kForward: return "forward";
    case StepPhase::kBackward: return "backward";
    case StepPhase::kPost: return "optimizer";
  }
  return "?";
}

absl::StatusOr<PipelineProgram> BuildPipelineProgram(const ir::Graph& g, const StageAssignment& a,
                                                     const ProgramOptions& options) {
  const int32_t K = a.num_stages;
  if (K < 1) return INVALID_ARGUMENT() << "a pipeline needs at least one stage";
  if (options.coordinator < 0 || options.coordinator >= K) {
    return INVALID_ARGUMENT() << "coordinator stage " << options.coordinator << " is not one of " << K;
  }
  RET_CHECK(a.forward_stage.size() == static_cast<size_t>(g.num_node_slots()))
      << "the assignment was made for another graph";
  const std::vector<ir::NodeId> order = g.LiveNodes();
  const int32_t nslots = g.num_node_slots();
  std::vector<int32_t> pos(nslots, -1);
  for (size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int32_t>(i);
  for (ir::NodeId id : order) {
    for (ir::ValueId v : g.node(id).inputs) {
      if (v == ir::kNoValue) continue;
      const ir::NodeId p = g.value(v).producer;
      if (p != ir::kNoNode && (pos[p] < 0 || pos[p] >= pos[id])) {
        return INVALID_ARGUMENT() << "the training graph is not in topological order at " << NodeDesc(g.node(id));
      }
    }
  }
  const std::vector<std::vector<ir::NodeId>> uses = g.ComputeUses();

  // 1. Stages and phases of the forward nodes.
  std::vector<int32_t> stage(nslots, -1);
  std::vector<StepPhase> phase(nslots, StepPhase::kForward);
  std::map<std::string, ir::NodeId> forward_by_name;
  for (ir::NodeId id : order) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::kForward) continue;
    const int32_t s = a.forward_stage[id];
    if (s < 0 || s >= K) return INVALID_ARGUMENT() << "forward " << NodeDesc(n) << " is assigned to no stage";
    stage[id] = s;
    forward_by_name[n.name] = id;
  }

  // 2. Parameters: owned by the stage of their first forward consumer.
  PipelineProgram prog;
  prog.num_stages = K;
  prog.coordinator = options.coordinator;
  std::map<std::string, int32_t> param_stage;
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::Value& v = g.value(u.state);
    if (!v.is_initializer) continue;
    int32_t owner = -1, first = -1;
    for (ir::NodeId c : uses[u.state]) {
      if (g.node(c).phase == ir::Phase::kForward && (first < 0 || pos[c] < first)) {
        first = pos[c];
        owner = stage[c];
      }
    }
    if (owner < 0) return INVALID_ARGUMENT() << "parameter '" << v.name << "' is updated but read by no forward node";
    param_stage[v.name] = owner;
  }
  auto origin_stage = [&](const ir::Node& n) -> int32_t {
    if (auto it = forward_by_name.find(n.origin); it != forward_by_name.end()) return stage[it->second];
    if (auto it = param_stage.find(n.origin); it != param_stage.end()) return it->second;
    return -1;
  };

  // 3. Backward nodes follow their origin; optimizer nodes their parameter; global ones run on the
  // coordinator.
  for (ir::NodeId id : order) {
    const ir::Node& n = g.node(id);
    if (n.phase == ir::Phase::kForward) continue;
    if (n.phase == ir::Phase::kBackward) {
      phase[id] = StepPhase::kBackward;
      stage[id] = origin_stage(n);
      if (stage[id] < 0) {
        return INVALID_ARGUMENT() << "backward " << NodeDesc(n) << " has origin '" << n.origin
                                  << "', which names no forward node or parameter: cannot place it on a stage";
      }
    } else {
      phase[id] = StepPhase::kPost;
      stage[id] = n.origin.empty() ? options.coordinator : origin_stage(n);
      if (stage[id] < 0) {
        return INVALID_ARGUMENT() << "optimizer " << NodeDesc(n) << " has origin '" << n.origin
                                  << "', which names no parameter: cannot place it on a stage";
      }
    }
  }

  // 4. Parameter-gradient Sums (and copies) move to post: each contribution is accumulated over
  // the micro-batches where it is made (and sent once per step when that is another stage), then
  // added. Doing this whether or not the contributions cross stages keeps the summation order
  // (sum over micro-batches first, then over contributions) the same for every K, so results are
  // bitwise equal across stage counts.
  for (bool changed = true; changed;) {
    changed = false;
    for (ir::NodeId id : order) {
      const ir::Node& n = g.node(id);
      if (phase[id] != StepPhase::kBackward || (n.op != ir::OpKind::kSum && n.op != ir::OpKind::kIdentity)) continue;
      bool only_post = true, any_use = false;
      for (ir::ValueId o : n.outputs) {
        if (o == ir::kNoValue) continue;
        for (ir::NodeId c : uses[o]) {
          any_use = true;
          only_post = only_post && phase[c] == StepPhase::kPost;
        }
      }
      if (any_use && only_post) {
        phase[id] = StepPhase::kPost;
        prog.post_sums.push_back(n.name);
        changed = true;
      }
    }
  }

  // 4b. Shared parameters, Megatron style: a parameter read on stages other than its owner (a tied
  // embedding and output projection) is updated on every stage holding it. Its post-phase nodes
  // (the Sum of its gradient contributions, its optimizer update) run on each of them, over the
  // same operands in the same order, so the copies stay bitwise identical without a broadcast;
  // each holder keeps its own optimizer state. `also[id]`: the other stages running post node id.
  std::vector<std::set<int32_t>> also(nslots);
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::Value& pv = g.value(u.state);
    if (!pv.is_initializer) continue;
    const int32_t owner = param_stage.at(pv.name);
    std::set<int32_t> holders;
    for (ir::NodeId c : uses[u.state])
      if (phase[c] != StepPhase::kPost && stage[c] != owner) holders.insert(stage[c]);
    if (holders.empty()) continue;
    for (ir::NodeId id : order)
      if (phase[id] == StepPhase::kPost && g.node(id).origin == pv.name) also[id] = holders;
  }
  auto runs_on = [&](ir::NodeId id, int32_t s) { return stage[id] == s || also[id].count(s) > 0; };

  // 5. Recompute: the recomputed forward nodes a backward node of their stage needs.
  std::vector<bool> needed(nslots, false);
  {
    std::vector<ir::NodeId> work;
    auto want = [&](ir::ValueId v, int32_t s) {
      if (v == ir::kNoValue) return;
      const ir::NodeId p = g.value(v).producer;
      if (p != ir::kNoNode && phase[p] == StepPhase::kForward && stage[p] == s && p < static_cast<ir::NodeId>(a.recompute.size()) &&
          a.recompute[p] && !needed[p]) {
        needed[p] = true;
        work.push_back(p);
      }
    };
    for (ir::NodeId id : order)
      if (phase[id] == StepPhase::kBackward)
        for (ir::ValueId v : g.node(id).inputs) want(v, stage[id]);
    while (!work.empty()) {
      const ir::NodeId p = work.back();
      work.pop_back();
      for (ir::ValueId v : g.node(p).inputs) want(v, stage[p]);
    }
  }

  // 6. Loss and its seed.
  prog.grad_norm = g.FindValue(autodiff::kGradNormName);
  for (ir::ValueId v : g.outputs()) {
    if (v == prog.grad_norm) continue;
    const ir::NodeId p = g.value(v).producer;
    if (p != ir::kNoNode && phase[p] == StepPhase::kForward) {
      prog.loss = v;
      break;
    }
  }
  if (prog.loss == ir::kNoValue) return INVALID_ARGUMENT() << "the training graph has no loss output";
  prog.loss_seed = g.FindValue("grad/" + g.value(prog.loss).name);
  if (prog.loss_seed == ir::kNoValue || !g.value(prog.loss_seed).constant ||
      g.value(prog.loss_seed).constant->num_elements() != 1 ||
      g.value(prog.loss_seed).constant->GetAsDouble(0) != 1.0) {
    return INVALID_ARGUMENT() << "cannot find the loss seed 'grad/" << g.value(prog.loss).name
                              << "' (a constant 1 from autodiff) to scale per micro-batch";
  }
  prog.loss_stage = stage[g.value(prog.loss).producer];
  if (prog.grad_norm != ir::kNoValue) {
    const ir::NodeId p = g.value(prog.grad_norm).producer;
    RET_CHECK(p != ir::kNoNode && phase[p] == StepPhase::kPost) << "grad_norm is not made by the optimizer";
    prog.grad_norm_stage = stage[p];
  }

  // 7. Stage graphs with their recompute clones.
  prog.stages.resize(K);
  for (int32_t s = 0; s < K; ++s) {
    StageProgram& sp = prog.stages[s];
    sp.stage = s;
    sp.graph = g;
    ir::Graph& sg = sp.graph;
    // Regions: connected components of the needed nodes of this stage.
    std::vector<ir::NodeId> rnodes;
    for (ir::NodeId id : order)
      if (needed[id] && stage[id] == s) rnodes.push_back(id);
    std::vector<int32_t> parent(nslots);
    std::iota(parent.begin(), parent.end(), 0);
    for (ir::NodeId id : rnodes) {
      for (ir::ValueId v : g.node(id).inputs) {
        const ir::NodeId p = v == ir::kNoValue ? ir::kNoNode : g.value(v).producer;
        if (p != ir::kNoNode && needed[p] && stage[p] == s) parent[Find(parent, p)] = Find(parent, id);
      }
    }
    std::vector<ir::ValueId> clone_of(g.num_values(), ir::kNoValue);
    std::map<int32_t, std::vector<ir::NodeId>> region_clones;  // root -> clones in forward order
    for (ir::NodeId id : rnodes) {
      const ir::Node src = g.node(id);
      std::vector<ir::ValueId> inputs = src.inputs;
      for (ir::ValueId& v : inputs)
        if (v != ir::kNoValue && clone_of[v] != ir::kNoValue) v = clone_of[v];
      std::vector<ir::ValueId> outputs;
      for (ir::ValueId v : src.outputs) {
        if (v == ir::kNoValue) {
          outputs.push_back(ir::kNoValue);
          continue;
        }
        const ir::Value& val = g.value(v);
        clone_of[v] = sg.AddValue(sg.UniqueName("recompute/" + val.name), val.dtype, val.shape, val.shape_known);
        outputs.push_back(clone_of[v]);
      }
      ir::Attrs attrs = src.attrs;
      if ((src.op == ir::OpKind::kDropout || src.op == ir::OpKind::kAttention) && !attrs.Has("rng_key")) {
        attrs.Set("rng_key", src.name);  // replay the forward's random stream
      }
      const ir::NodeId c = sg.AddNode(src.op, "recompute/" + src.name, std::move(inputs), std::move(outputs),
                                      std::move(attrs));
      sg.node(c).phase = ir::Phase::kBackward;
      sg.node(c).origin = src.name;
      sg.node(c).scope = src.scope;
      region_clones[Find(parent, id)].push_back(c);
    }
    sp.recompute_regions = static_cast<int32_t>(region_clones.size());
    // Backward nodes read the clones; each region runs before its first reader.
    std::vector<ir::NodeId> backward;
    for (ir::NodeId id : order)
      if (stage[id] == s && phase[id] == StepPhase::kBackward) backward.push_back(id);
    std::map<ir::ValueId, int32_t> region_of_value;
    for (const auto& [root, clones] : region_clones)
      for (ir::NodeId c : clones)
        for (ir::ValueId o : sg.node(c).outputs)
          if (o != ir::kNoValue) region_of_value[o] = root;
    std::set<int32_t> placed;
    for (ir::NodeId b : backward) {
      for (ir::ValueId& v : sg.node(b).inputs) {
        if (v == ir::kNoValue || clone_of[v] == ir::kNoValue) continue;
        v = clone_of[v];
        const int32_t root = region_of_value.at(v);
        if (placed.insert(root).second) {
          for (ir::NodeId c : region_clones[root]) {
            sp.backward.push_back(c);
            sp.recompute_clones.push_back(c);
          }
        }
      }
      sp.backward.push_back(b);
    }
    RET_CHECK(placed.size() == region_clones.size()) << "a recompute region of stage " << s << " has no reader";
    for (ir::NodeId id : order) {
      if (phase[id] == StepPhase::kForward && stage[id] == s) sp.forward.push_back(id);
      if (phase[id] == StepPhase::kPost && runs_on(id, s)) sp.post.push_back(id);
    }
  }

  // 8. Feeds and transfers.
  std::vector<PeerSets> send_f(K), recv_f(K), send_b(K), recv_b(K), send_p(K), recv_p(K);
  std::vector<std::set<ir::ValueId>> accumulate(K);
  auto is_input = [&](ir::ValueId v) {
    return std::find(g.inputs().begin(), g.inputs().end(), v) != g.inputs().end();
  };
  for (int32_t s = 0; s < K; ++s) {
    StageProgram& sp = prog.stages[s];
    const ir::Graph& sg = sp.graph;
    std::set<ir::ValueId> data, step;
    auto visit = [&](ir::NodeId id, StepPhase ph) -> absl::Status {
      const ir::Node& n = sg.node(id);
      for (ir::ValueId v : n.inputs) {
        if (v == ir::kNoValue) continue;
        if (v == prog.loss_seed) {
          if (ph == StepPhase::kPost) return INVALID_ARGUMENT() << "optimizer " << NodeDesc(n) << " reads the loss seed";
          sp.loss_scale = v;
          continue;
        }
        if (sg.value(v).constant) continue;
        if (v >= g.num_values()) continue;  // a recompute clone's output: local
        const ir::NodeId p = g.value(v).producer;
        if (p == ir::kNoNode) {
          if (!is_input(v)) return INVALID_ARGUMENT() << "value '" << g.value(v).name << "' read by " << NodeDesc(n) << " has no producer";
          const std::string& name = g.value(v).name;
          if (name == autodiff::kLrName || name == autodiff::kStepName) {
            step.insert(v);
          } else if (ph == StepPhase::kPost) {
            return INVALID_ARGUMENT() << "optimizer " << NodeDesc(n) << " reads the data input '" << name << "'";
          } else {
            data.insert(v);
          }
          continue;
        }
        const int32_t ps = stage[p];
        const StepPhase pp = phase[p];
        if (ph != StepPhase::kPost) {
          RET_CHECK(pp != StepPhase::kPost) << NodeDesc(n) << " reads an optimizer output";
          if (pp == StepPhase::kBackward && ph == StepPhase::kForward) {
            return INVALID_ARGUMENT() << "forward " << NodeDesc(n) << " reads '" << g.value(v).name
                                      << "', a backward value";
          }
          if (ps == s) continue;
          if (pp == StepPhase::kBackward && ps < s) {
            return INVALID_ARGUMENT() << "backward " << NodeDesc(n) << " on stage " << s << " reads '" << g.value(v).name
                                      << "', a backward value of stage " << ps
                                      << ", whose backward runs later: this assignment cannot be scheduled";
          }
          if (pp == StepPhase::kForward && ph == StepPhase::kForward && ps > s) {
            return INVALID_ARGUMENT() << "forward " << NodeDesc(n) << " on stage " << s << " reads '" << g.value(v).name
                                      << "' from the later stage " << ps << ": stages must follow the forward order";
          }
          // A value the forward already received stays in the micro-batch's table for the backward.
          if (ph == StepPhase::kBackward && recv_f[s][ps].count(v)) continue;
          (pp == StepPhase::kForward ? send_f : send_b)[ps][s].insert(v);
          (ph == StepPhase::kForward ? recv_f : recv_b)[s][ps].insert(v);
        } else {
          if (pp == StepPhase::kForward) {
            return INVALID_ARGUMENT() << "optimizer " << NodeDesc(n) << " reads the forward value '" << g.value(v).name
                                      << "'; only gradients can be accumulated over micro-batches";
          }
          if (pp == StepPhase::kBackward) accumulate[ps].insert(v);
          if (!runs_on(p, s)) {
            send_p[ps][s].insert(v);
            recv_p[s][ps].insert(v);
          }
        }
      }
      return absl::OkStatus();
    };
    for (ir::NodeId id : sp.forward) RETURN_IF_ERROR(visit(id, StepPhase::kForward));
    for (ir::NodeId id : sp.backward) RETURN_IF_ERROR(visit(id, StepPhase::kBackward));
    for (ir::NodeId id : sp.post) RETURN_IF_ERROR(visit(id, StepPhase::kPost));
    sp.data_inputs.assign(data.begin(), data.end());
    sp.step_inputs.assign(step.begin(), step.end());
  }
  prog.stages[prog.loss_stage].loss = prog.loss;
  if (prog.grad_norm_stage >= 0) prog.stages[prog.grad_norm_stage].grad_norm = prog.grad_norm;

  // 9. State updates and parameter replicas.
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    const ir::NodeId p = g.value(u.new_value).producer;
    RET_CHECK(p != ir::kNoNode && phase[p] == StepPhase::kPost)
        << "state '" << g.value(u.state).name << "' is not updated by an optimizer node";
    prog.stages[stage[p]].state_updates.push_back(u);
    for (int32_t h : also[p]) prog.stages[h].state_updates.push_back(u);
    if (g.value(u.state).is_initializer) prog.parameter_owner[u.state] = stage[p];
  }
  std::vector<std::set<ir::ValueId>> updates_here(K);
  for (int32_t s = 0; s < K; ++s)
    for (const ir::Graph::StateUpdate& u : prog.stages[s].state_updates) updates_here[s].insert(u.state);
  std::vector<PeerSets> send_r(K), recv_r(K);
  for (int32_t s = 0; s < K; ++s) {
    const StageProgram& sp = prog.stages[s];
    for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward, &sp.post}) {
      for (ir::NodeId id : *list) {
        for (ir::ValueId v : sp.graph.node(id).inputs) {
          auto it = v == ir::kNoValue ? prog.parameter_owner.end() : prog.parameter_owner.find(v);
          if (it == prog.parameter_owner.end() || updates_here[s].count(v)) continue;
          send_r[it->second][s].insert(v);
          recv_r[s][it->second].insert(v);
        }
      }
    }
  }

  // 10. Per-stage bookkeeping: sorted transfer lists, use counts, constants this stage never reads.
  for (int32_t s = 0; s < K; ++s) {
    StageProgram& sp = prog.stages[s];
    sp.send_forward = Sorted(send_f[s]);
    sp.recv_forward = Sorted(recv_f[s]);
    sp.send_backward = Sorted(send_b[s]);
    sp.recv_backward = Sorted(recv_b[s]);
    sp.send_post = Sorted(send_p[s]);
    sp.recv_post = Sorted(recv_p[s]);
    sp.send_replica = Sorted(send_r[s]);
    sp.recv_replica = Sorted(recv_r[s]);
    sp.accumulate.assign(accumulate[s].begin(), accumulate[s].end());
    ir::Graph& sg = sp.graph;
    // Drop the constants no node of this stage reads: a stage keeps its own parameters, replicas
    // and optimizer state only (and stale copies of other stages' parameters are never held).
    std::vector<bool> read(sg.num_values(), false);
    for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward, &sp.post})
      for (ir::NodeId id : *list)
        for (ir::ValueId v : sg.node(id).inputs)
          if (v != ir::kNoValue) read[v] = true;
    for (const ir::Graph::StateUpdate& u : sp.state_updates) read[u.state] = true;
    for (ir::ValueId v = 0; v < sg.num_values(); ++v) {
      if (sg.value(v).constant && (!read[v] || v == prog.loss_seed)) sg.value(v).constant.reset();
    }
    sp.uses.assign(sg.num_values(), 0);
    sp.data_uses.assign(sg.num_values(), 0);
    for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward}) {
      for (ir::NodeId id : *list) {
        const ir::Node& n = sg.node(id);
        for (size_t i = 0; i < n.inputs.size(); ++i) {
          const ir::ValueId v = n.inputs[i];
          if (v == ir::kNoValue || sg.value(v).constant) continue;
          ++sp.uses[v];
          if (!partitioner::IsShapeOnlyOperand(n, static_cast<int>(i))) ++sp.data_uses[v];
        }
      }
    }
    auto other_use = [&](ir::ValueId v) {
      ++sp.uses[v];
      ++sp.data_uses[v];
    };
    for (const auto* sends : {&sp.send_forward, &sp.send_backward})
      for (const auto& [peer, vs] : *sends)
        for (ir::ValueId v : vs) other_use(v);
    for (ir::ValueId v : sp.accumulate) other_use(v);
    if (sp.loss != ir::kNoValue) other_use(sp.loss);
  }
  return prog;
}

partitioner::StageShape ShapeOf(const StageProgram& sp) {
  partitioner::StageShape sh;
  auto peers = [](const std::map<int32_t, std::vector<ir::ValueId>>& m) {
    std::vector<int32_t> out;
    for (const auto& [peer, vs] : m)
      if (!vs.empty()) out.push_back(peer);
    return out;
  };
  sh.recv_forward = peers(sp.recv_forward);
  sh.send_forward = peers(sp.send_forward);
  sh.recv_backward = peers(sp.recv_backward);
  sh.send_backward = peers(sp.send_backward);
  return sh;
}

absl::StatusOr<std::vector<partitioner::ActionList>> ConcreteActionLists(const PipelineProgram& p,
                                                                         partitioner::ScheduleKind kind,
                                                                         int32_t microbatches) {
  std::vector<partitioner::StageShape> shapes;
  for (const StageProgram& sp : p.stages) shapes.push_back(ShapeOf(sp));
  return partitioner::BuildSchedule(kind, p.num_stages, microbatches, shapes);
}

absl::Status ProveDeadlockFree(const PipelineProgram& p, const std::vector<partitioner::ActionList>& lists) {
  RET_CHECK(static_cast<int32_t>(lists.size()) == p.num_stages);
  // The micro-batch actions: a stage's RECV waits for what its peer sends it for the micro-batch.
  std::vector<partitioner::StageTiming> unit(p.num_stages);
  for (partitioner::StageTiming& t : unit) {
    t.forward_s = 1;
    t.backward_s = 2;
  }
  absl::Status st = partitioner::Simulate(lists, unit).status();
  if (!st.ok()) return Annotate(st, "the pipeline program cannot run");
  // The optimizer phase, which every stage reaches once its micro-batch actions are done, as the
  // executor runs it: send the accumulated values, then each post node in order (receiving what it
  // needs first, sending what it makes), then the replicas.
  auto id = [](ir::ValueId v, int32_t src, int32_t dst) -> int64_t { return (int64_t{v} * 4096 + src) * 4096 + dst; };
  constexpr int64_t kReplica = int64_t{1} << 62;
  std::vector<std::vector<partitioner::SimStep>> post(p.num_stages);
  for (int32_t s = 0; s < p.num_stages; ++s) {
    const StageProgram& sp = p.stages[s];
    const std::set<ir::ValueId> acc(sp.accumulate.begin(), sp.accumulate.end());
    partitioner::SimStep first;
    first.label = "O:send-accumulated";
    for (const auto& [peer, vs] : sp.send_post)
      for (ir::ValueId v : vs)
        if (acc.count(v)) first.sends.push_back({.message = id(v, s, peer)});
    post[s].push_back(std::move(first));
    std::set<ir::ValueId> have;
    for (ir::NodeId n : sp.post) {
      partitioner::SimStep y;
      y.label = "O:" + sp.graph.node(n).name;
      for (ir::ValueId v : sp.graph.node(n).inputs) {
        if (v == ir::kNoValue || have.count(v)) continue;
        for (const auto& [peer, vs] : sp.recv_post) {
          if (std::binary_search(vs.begin(), vs.end(), v)) {
            y.waits.push_back(id(v, peer, s));
            have.insert(v);
          }
        }
      }
      for (ir::ValueId o : sp.graph.node(n).outputs)
        for (const auto& [peer, vs] : sp.send_post)
          if (o != ir::kNoValue && std::binary_search(vs.begin(), vs.end(), o)) {
            y.sends.push_back({.message = id(o, s, peer)});
          }
      post[s].push_back(std::move(y));
    }
    partitioner::SimStep replicas;
    replicas.label = "O:replicas";
    for (const auto& [peer, vs] : sp.send_replica)
      for (ir::ValueId v : vs) replicas.sends.push_back({.message = id(v, s, peer) | kReplica});
    for (const auto& [peer, vs] : sp.recv_replica)
      for (ir::ValueId v : vs) replicas.waits.push_back(id(v, peer, s) | kReplica);
    post[s].push_back(std::move(replicas));
  }
  st = partitioner::SimulateSteps(post).status();
  if (!st.ok()) return Annotate(st, "the pipeline program's optimizer phase cannot run");
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
