// Phases 1-2 (PartitionContext) and phases 4-6 for a given stage assignment (PlanAssignment).
// Phase 3, the search, is in search.cc.
#include "partitioner/partitioner.h"
#include "partitioner/transfer_order.h"

#include <algorithm>
#include <map>
#include <set>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {
namespace {

std::vector<int64_t> Dims(const ir::Value& v) {
  std::vector<int64_t> d;
  for (const ir::Dim& x : v.shape) d.push_back(x.is_concrete() ? x.value() : -1);
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PartitionContext>> PartitionContext::Create(
    const ir::Graph& training_graph, const Cluster& cluster, Precision precision,
    std::shared_ptr<const OpTimes> op_times, int64_t microbatch_size, double cut_slack,
    int64_t alignment) {
  std::unique_ptr<PartitionContext> ctx(new PartitionContext());
  ctx->cluster_ = cluster;
  ctx->alignment_ = alignment;
  // Phase 1: costs.
  ctx->node_seconds_ = NodeSeconds(training_graph, cluster.device, precision, op_times.get(),
                                   microbatch_size, &ctx->cost_);
  // Phase 2: positions and cut candidates.
  AnalysisOptions ao;
  ao.cut_slack = cut_slack;
  ASSIGN_OR_RETURN(ctx->analysis_, AnalyzeTrainingGraph(training_graph, ao));
  ctx->units_ = BuildUnitTable(ctx->analysis_, ctx->node_seconds_, cluster.device, alignment);
  return ctx;
}

absl::Status ValidateBatch(const PartitionOptions& o) {
  if (o.batch < 1) return INVALID_ARGUMENT() << "--batch must be >= 1, got " << o.batch;
  if (o.microbatches < 1) return INVALID_ARGUMENT() << "--microbatches must be >= 1, got " << o.microbatches;
  if (o.data_parallel < 1) return INVALID_ARGUMENT() << "--data-parallel must be >= 1, got " << o.data_parallel;
  // Every replica trains B / D samples as M equal micro-batches, as `train --data-parallel` does.
  const int64_t parts = o.microbatches * o.data_parallel;
  const std::string by = "--microbatches " + std::to_string(o.microbatches) +
                         (o.data_parallel > 1 ? " x --data-parallel " + std::to_string(o.data_parallel) : "");
  if (parts > o.batch) {
    return INVALID_ARGUMENT() << by << " is larger than --batch " << o.batch
                              << ": a micro-batch needs at least one sample";
  }
  if (o.batch % parts != 0) {
    return INVALID_ARGUMENT() << "--batch " << o.batch << " is not divisible by " << by
                              << " (micro-batches must be equal; try " << o.batch / parts * parts << " or "
                              << (o.batch / parts + 1) * parts << ")";
  }
  return absl::OkStatus();
}

absl::Status ValidateOptions(const PartitionContext& ctx, const PartitionOptions& o) {
  RETURN_IF_ERROR(ValidateBatch(o));
  const int32_t units = ctx.analysis().num_units();
  if (o.num_stages < 0) return INVALID_ARGUMENT() << "--stages must be >= 1 or auto";
  if (o.num_stages > units) {
    return INVALID_ARGUMENT() << "--stages " << o.num_stages << " is more than this model can be cut into: "
                              << ctx.analysis().cut_candidates.size() << " cut candidates give at most "
                              << units << " stages";
  }
  const DeviceProfile& d = ctx.cluster().device;
  const int64_t memory = o.memory_bytes > 0 ? o.memory_bytes : d.memory_bytes;
  if (memory <= d.reserved_bytes) {
    return INVALID_ARGUMENT() << "device memory " << FormatBytes(memory) << " leaves nothing after the "
                              << FormatBytes(d.reserved_bytes) << " reserved for the runtime on " << d.name;
  }
  return absl::OkStatus();
}

absl::StatusOr<PartitionPlan> PlanAssignment(const PartitionContext& ctx, const PartitionOptions& o,
                                             const StageAssignment& assignment, bool* fits) {
  const GraphAnalysis& a = ctx.analysis();
  const UnitTable& t = ctx.units();
  const ir::Graph& g = *a.graph;
  const std::vector<double>& sec = ctx.node_seconds();
  const int32_t K = static_cast<int32_t>(assignment.ranges.size());
  RET_CHECK(K >= 1);
  RET_CHECK(assignment.ranges.front().first == 0 && assignment.ranges.back().second == a.num_units());
  for (int32_t k = 0; k + 1 < K; ++k) RET_CHECK(assignment.ranges[k].second == assignment.ranges[k + 1].first);

  PartitionPlan plan;
  plan.model = o.model;
  plan.optimizer = o.optimizer;
  plan.kernel_scratch_counted = o.workspace != nullptr;
  plan.device = ctx.cluster().device;
  plan.capacity_bytes = (o.memory_bytes > 0 ? o.memory_bytes : plan.device.memory_bytes) -
                        plan.device.reserved_bytes;
  if (o.memory_bytes > 0) plan.device.memory_bytes = o.memory_bytes;
  plan.num_stages = K;
  plan.data_parallel = std::max<int64_t>(1, o.data_parallel);
  plan.batch = o.batch / plan.data_parallel;
  plan.microbatches = o.microbatches;
  plan.microbatch_size = plan.batch / std::max<int64_t>(1, o.microbatches);
  plan.schedule = o.schedule;
  plan.recompute = o.recompute;
  plan.precision = o.precision;
  plan.objective = o.objective;
  plan.stages_auto = o.num_stages == 0;
  plan.cost = ctx.cost();
  for (ir::NodeId id : a.global_nodes) plan.global_nodes.push_back(g.node(id).name);

  // Which stage each node and value lives on, for boundary peers.
  auto stage_of_position = [&](int32_t p) {
    for (int32_t k = 0; k < K; ++k)
      if (p < a.unit_begin[assignment.ranges[k].second]) return k;
    return K - 1;
  };
  // Phase 4: what each stage recomputes (regions never span stages).
  std::vector<bool> recompute(g.num_node_slots(), false);
  std::vector<int32_t> bounds = {0};
  std::vector<std::vector<std::string>> unit_recompute(K);
  for (int32_t k = 0; k < K; ++k) {
    const auto [ub, ue] = assignment.ranges[k];
    bounds.push_back(a.unit_begin[ue]);
    std::vector<UnitRecompute> choice;
    bool stage_full = false;
    switch (o.recompute) {
      case RecomputePolicy::kNone: choice.assign(ue - ub, UnitRecompute::kNone); break;
      case RecomputePolicy::kSelective: choice.assign(ue - ub, UnitRecompute::kSelective); break;
      case RecomputePolicy::kFull: stage_full = true; break;
      case RecomputePolicy::kAuto:
        if (assignment.unit_choice.size() == static_cast<size_t>(a.num_units())) {
          choice.assign(assignment.unit_choice.begin() + ub, assignment.unit_choice.begin() + ue);
        } else {
          choice.assign(ue - ub, UnitRecompute::kNone);
        }
        break;
    }
    if (o.recompute == RecomputePolicy::kAuto && !choice.empty() &&
        std::all_of(choice.begin(), choice.end(), [](UnitRecompute c) { return c == UnitRecompute::kStage; })) {
      stage_full = true;
    }
    for (int32_t u = ub; u < ue; ++u) {
      unit_recompute[k].push_back(stage_full ? "full" : UnitRecomputeName(choice[u - ub]));
    }
    const std::vector<bool> rec = RecomputeSet(a, ub, ue, stage_full, choice);
    for (size_t id = 0; id < rec.size(); ++id)
      if (rec[id]) recompute[id] = true;
  }
  // Phase 5: the stage programs and their memory.
  const std::vector<StageNodes> placement = PlaceStages(a, bounds, recompute);
  ASSIGN_OR_RETURN(const PipelineProgram program, BuildPipelineProgram(a, placement));
  bool all_fit = true;
  std::vector<StageTiming> timing(K);
  std::vector<std::vector<double>> parts_s(K);
  double sum_p = 0, max_p = 0, comm = 0;
  for (int32_t k = 0; k < K; ++k) {
    const auto [ub, ue] = assignment.ranges[k];
    const StageProgram& sp = program.stages[k];
    StagePlan s;
    s.index = k;
    s.unit_begin = ub;
    s.unit_end = ue;
    s.position_begin = a.unit_begin[ub];
    s.position_end = a.unit_begin[ue];
    s.recompute = RecomputePolicyName(o.recompute);
    s.unit_recompute = unit_recompute[k];
    const int64_t in_flight = InFlightMicrobatches(o.schedule, K, k, o.microbatches);
    ASSIGN_OR_RETURN(s.memory, PlanStageMemory(a, sp, in_flight, o.microbatches, ctx.alignment(), o.workspace));
    if (s.memory.total > plan.capacity_bytes) all_fit = false;

    const StageNodes& sn = placement[k];
    double fwd = 0, bwd = 0, rcp = 0, opt = 0;
    for (ir::NodeId id : sn.forward) {
      fwd += sec[id];
      s.forward_nodes.push_back(g.node(id).name);
    }
    for (ir::NodeId id : sn.backward) s.backward_nodes.push_back(g.node(id).name);
    for (ir::NodeId id : sn.post) {
      opt += sec[id];
      s.optimizer_nodes.push_back(g.node(id).name);
      // A shared parameter's optimizer nodes owned by another stage, run here too.
      if (a.position[id] >= 0 && stage_of_position(a.position[id]) != k) s.replicated_nodes.push_back(g.node(id).name);
    }
    // The backward part by part: runs of backward nodes and recompute regions (a clone takes its
    // forward node's time).
    std::map<ir::NodeId, ir::NodeId> source;
    for (size_t i = 0; i < sp.recompute_clones.size(); ++i) source[sp.recompute_clones[i]] = sp.cloned_from[i];
    for (const BackwardPart& part : sp.parts) {
      double t = 0;
      for (int32_t i = part.begin; i < part.end; ++i) {
        const ir::NodeId id = sp.backward[i];
        auto it = source.find(id);
        t += sec[it == source.end() ? id : it->second];
      }
      (part.kind == ActionKind::kRecompute ? rcp : bwd) += t;
      parts_s[k].push_back(t);
    }
    for (const RecomputeRegion& r : sp.regions) {
      RegionPlan rp;
      for (ir::NodeId id : r.nodes) {
        rp.nodes.push_back(g.node(id).name);
        rp.ms += sec[id] * 1e3;
      }
      rp.before = g.node(r.before).name;
      s.recompute_regions.push_back(std::move(rp));
    }
    for (ir::ValueId v : sp.parameters) {
      s.parameters.push_back(g.value(v).name);
      s.parameter_count += ir::NumElements(g.value(v).shape).value();
    }
    // Boundary tensors: what the stage receives and sends, once per value, with its peers.
    auto kind_of = [&](ir::ValueId v, bool per_microbatch) -> const char* {
      const ir::NodeId p = g.value(v).producer;
      if (per_microbatch) return g.node(p).phase == ir::Phase::kForward ? "activation" : "gradient";
      const ir::ValueId param = a.contribution_param[v];
      if (param != ir::kNoValue && std::binary_search(sp.shared_parameters.begin(), sp.shared_parameters.end(), param)) {
        return "shared_gradient";
      }
      return a.position[p] < 0 ? "step" : "global";
    };
    auto boundary = [&](const std::vector<const ValueLists*>& lists, bool per_microbatch,
                        std::vector<BoundaryTensor>* out) {
      std::map<ir::ValueId, std::set<int32_t>> peers;
      for (const ValueLists* l : lists)
        for (const auto& [peer, vs] : *l)
          for (ir::ValueId v : vs) peers[v].insert(peer);
      for (const auto& [v, ps] : peers) {
        const ir::Value& val = g.value(v);
        BoundaryTensor b;
        b.name = val.name;
        b.dtype = std::string(ir::DTypeName(val.dtype));
        b.dims = Dims(val);
        b.bytes = a.value_bytes[v];
        b.kind = kind_of(v, per_microbatch);
        b.peers.assign(ps.begin(), ps.end());
        out->push_back(std::move(b));
      }
    };
    boundary({&sp.recv_forward, &sp.recv_backward}, true, &s.boundary_inputs);
    for (const auto& [inputs, kind] : {std::pair{&sp.data_inputs, "data"}, std::pair{&sp.step_inputs, "step"}}) {
      for (ir::ValueId v : *inputs) {
        const ir::Value& val = g.value(v);
        s.boundary_inputs.push_back(
            {val.name, std::string(ir::DTypeName(val.dtype)), Dims(val), a.value_bytes[v], kind, {}});
      }
    }
    boundary({&sp.recv_post}, false, &s.boundary_inputs);
    boundary({&sp.send_forward, &sp.send_backward}, true, &s.boundary_outputs);
    boundary({&sp.send_post}, false, &s.boundary_outputs);
    // Shared parameters: their contributions come from the other holders once per step.
    double allreduce_s = 0;
    for (const BoundaryTensor& b : s.boundary_inputs) {
      if (b.kind != "shared_gradient") continue;
      allreduce_s += RingAllReduceSeconds(b.bytes, static_cast<int64_t>(b.peers.size()) + 1, plan.device.link_bandwidth,
                                          plan.device.link_latency_s);
    }
    // Data parallelism: the executor all-reduces every accumulated gradient in place over the
    // stage's replicas (no memory added), in buckets as the last micro-batch's backward completes them.
    if (plan.data_parallel > 1) {
      const std::set<ir::ValueId> accumulated(sp.accumulate.begin(), sp.accumulate.end());
      std::vector<int64_t> completed;  // bytes, in the order the backward makes them
      for (ir::NodeId id : sp.backward)
        for (ir::ValueId v : sp.graph.node(id).outputs)
          if (accumulated.count(v)) completed.push_back(a.value_bytes[v]);
      for (ir::ValueId v : sp.accumulate) s.data_parallel_bytes += a.value_bytes[v];
      const BucketedAllReduce dp =
          BucketedAllReduceSeconds(completed, o.dp_bucket_bytes, bwd + rcp, plan.data_parallel,
                                   plan.device.data_parallel_link(), plan.device.link_latency_s);
      s.data_parallel_tensors = static_cast<int64_t>(sp.accumulate.size());
      s.data_parallel_buckets = dp.buckets;
      s.data_parallel_allreduce_ms = dp.seconds * 1e3;
      s.data_parallel_exposed_ms = dp.exposed_s * 1e3;
      plan.data_parallel_allreduce_ms = std::max(plan.data_parallel_allreduce_ms, s.data_parallel_allreduce_ms);
      plan.data_parallel_exposed_ms = std::max(plan.data_parallel_exposed_ms, s.data_parallel_exposed_ms);
    }
    for (int32_t p = s.position_begin; p < s.position_end; ++p) {
      const std::string& layer = a.layer_of_position[p];
      if (s.layers.empty() || s.layers.back() != layer) {
        if (std::find(s.layers.begin(), s.layers.end(), layer) == s.layers.end()) s.layers.push_back(layer);
      }
    }
    s.forward_ms = fwd * 1e3;
    s.backward_ms = bwd * 1e3;
    s.recompute_ms = rcp * 1e3;
    s.optimizer_ms = (opt + allreduce_s) * 1e3;
    const double send_f = k + 1 < K ? t.send_forward_s[ue] : 0.0;
    const double send_b = k > 0 ? t.send_backward_s[ub] : 0.0;
    s.send_forward_ms = send_f * 1e3;
    s.send_backward_ms = send_b * 1e3;
    timing[k] = {fwd, bwd + rcp, opt + allreduce_s, send_f, send_b};
    const double p = fwd + bwd + rcp;
    sum_p += p;
    max_p = std::max(max_p, p);
    if (k > 0) comm += t.send_forward_s[ub] + t.send_backward_s[ub];
    plan.stages.push_back(std::move(s));
  }

  // Phase 6: the schedule, as the executor will run it.
  ASSIGN_OR_RETURN(const std::vector<ActionList> actions,
                   BuildSchedule(o.schedule, K, static_cast<int32_t>(o.microbatches), ShapesOf(program)));
  RETURN_IF_ERROR(ProveDeadlockFree(program, actions));
  RETURN_IF_ERROR(ProveTransferOrder(program, actions));
  for (int32_t k = 0; k < K; ++k) plan.stages[k].actions = actions[k];
  ASSIGN_OR_RETURN(plan.timeline, Simulate(actions, timing, parts_s));
  // The slowest stage's data-parallel all-reduce past its backward, after the whole pipeline: the
  // stages that drain earlier start theirs earlier, so this is an upper bound.
  plan.step_ms = plan.timeline.step_s * 1e3 + plan.data_parallel_exposed_ms;
  plan.bubble_fraction = plan.timeline.bubble_fraction;
  plan.samples_per_s = plan.step_ms > 0 ? static_cast<double>(o.batch) / (plan.step_ms * 1e-3) : 0;
  plan.analytic_step_ms = (sum_p + static_cast<double>(o.microbatches - 1) * max_p + comm) * 1e3;

  // Layers.
  std::map<std::string, size_t> layer_index;
  for (int32_t p = 0; p < a.num_positions(); ++p) {
    const std::string& name = a.layer_of_position[p];
    auto [it, inserted] = layer_index.emplace(name, plan.layers.size());
    if (inserted) {
      LayerPlan lp;
      lp.name = name;
      plan.layers.push_back(lp);
    }
    LayerPlan& lp = plan.layers[it->second];
    const int32_t k = stage_of_position(p);
    if (std::find(lp.stages.begin(), lp.stages.end(), k) == lp.stages.end()) lp.stages.push_back(k);
  }
  for (ir::NodeId id : a.order) {
    const int32_t p = a.position[id];
    if (p < 0) continue;
    LayerPlan& lp = plan.layers[layer_index[a.layer_of_position[p]]];
    if (g.node(id).phase == ir::Phase::kForward) lp.forward_ms += sec[id] * 1e3;
    if (g.node(id).phase == ir::Phase::kBackward) lp.backward_ms += sec[id] * 1e3;
  }
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    if (a.is_param[v] && a.param_owner[v] >= 0) {
      plan.layers[layer_index[a.layer_of_position[a.param_owner[v]]]].parameter_bytes += a.value_bytes[v];
    }
  }
  if (plan.cost.profile_nodes_unmatched > 0) {
    plan.warnings.push_back(std::to_string(plan.cost.profile_nodes_unmatched) +
                            " profile entries name no node of this training graph (another model, "
                            "optimizer or sequence length?)");
  }
  if (plan.cost.source == "profile" && plan.cost.roofline_nodes > 0) {
    plan.warnings.push_back(std::to_string(plan.cost.roofline_nodes) +
                            " nodes have no measured time and use the roofline");
  }
  if (fits) *fits = all_fit;
  return plan;
}

absl::StatusOr<PartitionPlan> Partition(const ir::Graph& training_graph, const Cluster& cluster,
                                        const PartitionOptions& options) {
  const int64_t parts = std::max<int64_t>(1, options.microbatches) * std::max<int64_t>(1, options.data_parallel);
  const int64_t mb = std::max<int64_t>(1, options.batch / parts);
  ASSIGN_OR_RETURN(std::unique_ptr<PartitionContext> ctx,
                   PartitionContext::Create(training_graph, cluster, options.precision, options.op_times,
                                            mb, options.cut_slack, options.alignment));
  return Partition(*ctx, options);
}

}  // namespace onnxpipe::partitioner
