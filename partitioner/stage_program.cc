// Phase 5: stage programs and their memory. The copy of the whole training graph keeps value and
// node ids identical to the training graph's, so plans, reports and tests can name things by the
// ids the analysis uses; the planner only allocates what the stage's order touches.
#include "partitioner/stage_program.h"

#include <algorithm>
#include <map>
#include <set>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"
#include "partitioner/microbatch_layout.h"

namespace onnxpipe::partitioner {
namespace {

using ir::AlignUp;

bool IsUpdateOp(ir::OpKind op) {
  return op == ir::OpKind::kSGDUpdate || op == ir::OpKind::kAdamWUpdate;
}

void PushUnique(std::vector<ir::ValueId>& list, std::set<ir::ValueId>& seen, ir::ValueId v) {
  if (seen.insert(v).second) list.push_back(v);
}

}  // namespace

absl::StatusOr<StageProgram> BuildStageProgram(const GraphAnalysis& a, int32_t unit_begin,
                                               int32_t unit_end, const std::vector<bool>& recompute) {
  RET_CHECK(unit_begin >= 0 && unit_begin < unit_end && unit_end <= a.num_units());
  const ir::Graph& g = *a.graph;
  const int32_t p0 = a.unit_begin[unit_begin], p1 = a.unit_begin[unit_end];
  auto in_range = [&](ir::NodeId id) {
    const int32_t p = a.position[id];
    return p >= p0 && p < p1;
  };
  StageProgram sp;
  // Shared parameters this stage holds: their gradient tails run here too (analysis.h).
  std::vector<bool> replicated(g.num_values(), false);
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    if (a.is_param[v] && a.Holds(v, p0, p1) && a.IsSharedOutside(v, p0, p1)) {
      replicated[v] = true;
      sp.shared_parameters.push_back(v);
    }
  }
  auto runs_here = [&](ir::NodeId id) {
    return in_range(id) || (a.tail_param[id] != ir::kNoValue && replicated[a.tail_param[id]]);
  };
  for (ir::NodeId id : a.order) {
    if (!runs_here(id)) continue;
    switch (g.node(id).phase) {
      case ir::Phase::kForward: sp.forward.push_back(id); break;
      case ir::Phase::kBackward: sp.backward.push_back(id); break;
      case ir::Phase::kOptimizer: sp.optimizer.push_back(id); break;
    }
  }
  sp.regions = BuildRegions(a, recompute, sp.backward);
  sp.graph = g;
  ir::Graph& sg = sp.graph;

  // A holder's tail sums only its own contributions; the others arrive summed by the all-reduce.
  for (const std::vector<ir::NodeId>* list : {&sp.backward, &sp.optimizer}) {
    for (ir::NodeId id : *list) {
      if (a.tail_param[id] == ir::kNoValue || !replicated[a.tail_param[id]]) continue;
      std::vector<ir::ValueId>& ins = sg.node(id).inputs;
      std::vector<ir::ValueId> local;
      for (ir::ValueId v : ins) {
        const bool remote = v != ir::kNoValue && a.contribution_param[v] != ir::kNoValue &&
                            !in_range(g.value(v).producer);
        if (!remote) local.push_back(v);
      }
      if (!local.empty()) ins = std::move(local);
    }
  }
  for (ir::ValueId param : sp.shared_parameters) {
    ir::ValueId grad = g.FindValue("grad/" + g.value(param).name);  // a graph without updates
    for (ir::NodeId id : sp.optimizer) {
      const ir::Node& n = g.node(id);
      if (a.tail_param[id] == param && IsUpdateOp(n.op) && n.inputs.size() > 1) grad = n.inputs[1];
    }
    sp.shared_gradients.push_back(grad);
  }

  // Recompute clones, grouped by the backward node they precede.
  std::vector<ir::ValueId> clone_of(g.num_values(), ir::kNoValue);
  std::map<ir::NodeId, std::vector<ir::NodeId>> clones_before;
  for (const RecomputeRegion& region : sp.regions) {
    for (ir::NodeId id : region.nodes) {
      const ir::Node src = g.node(id);
      std::vector<ir::ValueId> inputs = src.inputs;
      for (ir::ValueId& v : inputs)
        if (v != ir::kNoValue && v < static_cast<ir::ValueId>(clone_of.size()) && clone_of[v] != ir::kNoValue)
          v = clone_of[v];
      std::vector<ir::ValueId> outputs;
      for (ir::ValueId v : src.outputs) {
        if (v == ir::kNoValue) {
          outputs.push_back(ir::kNoValue);
          continue;
        }
        const ir::Value& val = g.value(v);
        const ir::ValueId c = sg.AddValue(sg.UniqueName("recompute/" + val.name), val.dtype, val.shape,
                                          val.shape_known);
        clone_of[v] = c;
        outputs.push_back(c);
      }
      ir::Attrs attrs = src.attrs;
      // A recomputed Dropout (or dropout inside Attention) must draw the forward's mask again.
      if ((src.op == ir::OpKind::kDropout || src.op == ir::OpKind::kAttention) && !attrs.Has("rng_key")) {
        attrs.Set("rng_key", src.name);
      }
      const ir::NodeId c = sg.AddNode(src.op, "recompute/" + src.name, std::move(inputs),
                                      std::move(outputs), std::move(attrs));
      sg.node(c).phase = ir::Phase::kBackward;
      sg.node(c).origin = src.name;
      sg.node(c).scope = src.scope;
      clones_before[region.before].push_back(c);
    }
  }
  for (ir::NodeId b : sp.backward) {
    for (ir::ValueId& v : sg.node(b).inputs)
      if (v != ir::kNoValue && clone_of[v] != ir::kNoValue) v = clone_of[v];
  }

  sp.order = sp.forward;
  sp.num_forward = static_cast<int32_t>(sp.forward.size());
  for (ir::NodeId b : sp.backward) {
    if (auto it = clones_before.find(b); it != clones_before.end()) {
      for (ir::NodeId c : it->second) {
        sp.order.push_back(c);
        sp.recompute_clones.push_back(c);
      }
    }
    sp.order.push_back(b);
  }
  sp.order.insert(sp.order.end(), sp.optimizer.begin(), sp.optimizer.end());

  // Boundary values.
  std::vector<bool> here(sg.num_node_slots(), false);
  for (ir::NodeId id : sp.order) here[id] = true;
  std::vector<bool> optimizer_only_input(g.num_values(), true);
  for (ir::NodeId id : a.order) {
    if (g.node(id).phase == ir::Phase::kOptimizer) continue;
    for (ir::ValueId v : g.node(id).inputs)
      if (v != ir::kNoValue) optimizer_only_input[v] = false;
  }
  std::set<ir::ValueId> seen_in, seen_out;
  for (ir::NodeId id : sp.order) {
    for (ir::ValueId v : sg.node(id).inputs) {
      if (v == ir::kNoValue || sg.value(v).constant) continue;
      const ir::NodeId m = sg.value(v).producer;
      if (m == ir::kNoNode) {
        if (a.is_input[v]) {
          PushUnique(optimizer_only_input[v] ? sp.step_inputs : sp.data_inputs, seen_in, v);
        }
        continue;
      }
      if (here[m]) continue;
      const int32_t pm = a.position[m];
      if (pm < 0) {
        PushUnique(sp.step_inputs, seen_in, v);
      } else if (pm < p0) {
        PushUnique(sp.inputs_forward, seen_in, v);
      } else {
        PushUnique(sp.inputs_backward, seen_in, v);
      }
    }
  }
  for (ir::NodeId id : sp.forward) {
    // (forward outputs first, then backward, so the lists read in schedule order)
    for (ir::ValueId v : g.node(id).outputs) {
      if (v == ir::kNoValue) continue;
      for (ir::NodeId w : a.uses[v]) {
        if (here[w]) continue;
        const int32_t pw = a.position[w];
        if (pw < 0) {
          PushUnique(sp.global_outputs, seen_out, v);
        } else if (pw >= p1) {
          PushUnique(sp.outputs_forward, seen_out, v);
        } else {
          PushUnique(sp.outputs_backward, seen_out, v);
        }
      }
    }
  }
  for (const std::vector<ir::NodeId>* list : {&sp.backward, &sp.optimizer}) {
    for (ir::NodeId id : *list) {
      // A replicated tail's gradient reaches the global norm from its owner's stage only.
      if (!in_range(id)) continue;
      for (ir::ValueId v : g.node(id).outputs) {
        if (v == ir::kNoValue) continue;
        for (ir::NodeId w : a.uses[v]) {
          if (here[w]) continue;
          const int32_t pw = a.position[w];
          if (pw < 0) {
            PushUnique(sp.global_outputs, seen_out, v);
          } else if (pw >= p1) {
            PushUnique(sp.outputs_forward, seen_out, v);
          } else {
            PushUnique(sp.outputs_backward, seen_out, v);
          }
        }
      }
    }
  }
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    if (a.is_param[v] && ((a.param_owner[v] >= p0 && a.param_owner[v] < p1) || replicated[v])) {
      sp.parameters.push_back(v);
    }
  }

  // The stage's interface.
  std::vector<ir::ValueId> inputs = g.inputs();
  for (const auto* list : {&sp.inputs_forward, &sp.inputs_backward, &sp.step_inputs})
    for (ir::ValueId v : *list)
      if (!a.is_input[v]) inputs.push_back(v);
  sg.inputs() = std::move(inputs);
  // Values sent to other stages are not outputs: they leave through the boundary buffers as soon
  // as they are made, so they need no arena space past their producer.
  std::vector<ir::ValueId> outputs = sp.global_outputs;
  for (ir::ValueId v : g.outputs()) {
    const ir::NodeId m = g.value(v).producer;
    if (m != ir::kNoNode && here[m] &&
        std::find(outputs.begin(), outputs.end(), v) == outputs.end()) {
      outputs.push_back(v);
    }
  }
  sg.outputs() = std::move(outputs);

  if (a.precision == Precision::kBF16) {
    for (ir::ValueId v = 0; v < sg.num_values(); ++v) {
      ir::Value& val = sg.value(v);
      if (val.constant || !ir::IsFloat(val.dtype)) continue;
      if (v < g.num_values() && a.is_param_grad[v]) continue;
      if (val.producer != ir::kNoNode && sg.node(val.producer).phase == ir::Phase::kOptimizer) continue;
      if (val.producer == ir::kNoNode && v < g.num_values() && a.is_input[v]) continue;  // lr and friends
      val.dtype = ir::DType::kBF16;
    }
  }
  return sp;
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
      if (m == ir::kNoNode || !keep[m]) PushUnique(inputs, seen_in, v);
    }
    for (ir::ValueId v : n.outputs) {
      if (v == ir::kNoValue) continue;
      bool leaves = g.IsGraphOutput(v);
      for (ir::NodeId w : a.uses[v]) {
        const int32_t q = a.position[w];
        if (q < p0 || q >= p1) leaves = true;
      }
      if (leaves) PushUnique(outputs, seen_out, v);
    }
  }
  for (ir::NodeId id : g.LiveNodes())
    if (!keep[id]) sg.RemoveNode(id);
  sg.inputs() = std::move(inputs);
  sg.outputs() = std::move(outputs);
  RETURN_IF_ERROR(sg.TopoSort());
  return sg;
}

absl::StatusOr<StageMemory> PlanStageMemory(const GraphAnalysis& a, const StageProgram& sp, int64_t in_flight,
                                            int64_t microbatches, int64_t alignment, MemoryPlan* plan_out) {
  // The persistent regions (parameters, optimizer state, constants) from the whole program; the
  // micro-batch memory from the layout the pipeline executor allocates.
  MemoryPlanOptions options;
  options.alignment = alignment;
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(sp.graph, sp.order, options));
  const ir::Graph& sg = sp.graph;
  MicrobatchStage mb;
  mb.graph = &sg;
  mb.forward.assign(sp.order.begin(), sp.order.begin() + sp.num_forward);
  const std::set<ir::NodeId> optimizer(sp.optimizer.begin(), sp.optimizer.end());
  // A parameter-gradient Sum or Identity whose outputs only the optimizer reads (a parameter read
  // in several places, a tied embedding) runs once per step after the last micro-batch in the
  // executor (executor/pipeline/program.h): not part of a micro-batch, and its operands are what
  // accumulates over the micro-batches.
  const ir::Graph& tg = *a.graph;
  std::set<ir::NodeId> after;  // post-step nodes of the training graph
  for (ir::NodeId id : tg.LiveNodes())
    if (tg.node(id).phase == ir::Phase::kOptimizer) after.insert(id);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t t = sp.num_forward; t < sp.order.size(); ++t) {
      const ir::NodeId id = sp.order[t];
      if (id >= tg.num_node_slots() || after.count(id)) continue;
      const ir::Node& n = sg.node(id);
      if (n.phase != ir::Phase::kBackward || (n.op != ir::OpKind::kSum && n.op != ir::OpKind::kIdentity)) continue;
      bool any = false, only_after = true;
      for (ir::ValueId o : n.outputs) {
        if (o == ir::kNoValue) continue;
        for (ir::NodeId c : a.uses[o]) {
          any = true;
          only_after = only_after && after.count(c);
        }
      }
      if (any && only_after) changed = after.insert(id).second;
    }
  }
  for (size_t t = sp.num_forward; t < sp.order.size(); ++t)
    if (!optimizer.count(sp.order[t]) && !after.count(sp.order[t])) mb.backward.push_back(sp.order[t]);
  // Inputs: what the forward and backward read of the data, the step feeds and earlier stages, and
  // the loss seed (the executor feeds each micro-batch its share of the batch mean).
  std::vector<bool> read(sg.num_values(), false);
  for (const auto* list : {&mb.forward, &mb.backward})
    for (ir::NodeId id : *list)
      for (ir::ValueId v : sg.node(id).inputs)
        if (v != ir::kNoValue) read[v] = true;
  for (const auto* list : {&sp.data_inputs, &sp.step_inputs, &sp.inputs_forward})
    for (ir::ValueId v : *list)
      if (read[v]) mb.inputs.push_back(v);
  for (ir::ValueId out : a.graph->outputs()) {
    const ir::ValueId seed = sg.FindValue("grad/" + a.graph->value(out).name);
    if (seed != ir::kNoValue && seed < static_cast<ir::ValueId>(read.size()) && read[seed] && sg.value(seed).constant) {
      mb.inputs.push_back(seed);
    }
  }
  for (ir::ValueId v : sp.inputs_backward)
    if (read[v]) mb.recv_backward.push_back(v);
  // What accumulates: the values of this micro-batch that post-step nodes read.
  std::set<ir::NodeId> backward(mb.backward.begin(), mb.backward.end());
  std::set<ir::ValueId> accumulate;
  for (ir::NodeId id : after) {
    if (id >= sg.num_node_slots()) continue;
    for (ir::ValueId v : tg.node(id).inputs) {
      const ir::NodeId p = v == ir::kNoValue ? ir::kNoNode : sg.value(v).producer;
      if (p != ir::kNoNode && backward.count(p)) accumulate.insert(v);
    }
  }
  mb.accumulate.assign(accumulate.begin(), accumulate.end());
  mb.in_flight = static_cast<int32_t>(in_flight);
  mb.microbatches = static_cast<int32_t>(microbatches);
  mb.alignment = alignment;
  ASSIGN_OR_RETURN(MicrobatchLayout layout, PlanMicrobatchLayout(mb));

  StageMemory m;
  m.in_flight = in_flight;
  m.saved = layout.saved;
  m.parameters = plan.parameter_bytes;
  if (a.precision == Precision::kBF16) m.parameters += plan.parameter_bytes / 2;
  m.gradients = plan.gradient_bytes;
  m.optimizer_state = plan.optimizer_state_bytes;
  m.constants = plan.constant_bytes;
  m.arena = layout.arena();
  m.activations = layout.activations();
  m.workspace = m.arena - m.activations;
  for (const auto* list : {&sp.inputs_forward, &sp.inputs_backward, &sp.outputs_forward, &sp.outputs_backward,
                           &sp.shared_gradients}) {
    for (ir::ValueId v : *list)
      if (v != ir::kNoValue) m.boundary += AlignUp(a.value_bytes[v], alignment);
  }
  m.total = m.parameters + m.gradients + m.optimizer_state + m.constants + m.activations + m.workspace +
            m.boundary;
  if (plan_out) *plan_out = std::move(plan);
  return m;
}

}  // namespace onnxpipe::partitioner
