// plan.json (de)serialisation. The loader is strict: the executor allocates exactly what the plan
// says, so a hand-edited or truncated plan must fail loudly, naming the field, rather than run
// with wrong numbers.
#include "partitioner/plan_io.h"
#include "partitioner/transfer_order.h"

#include <map>
#include <set>
#include <unordered_map>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json Tensors(const std::vector<BoundaryTensor>& list, const char* peer_key) {
  ordered_json out = ordered_json::array();
  for (const BoundaryTensor& b : list) {
    ordered_json t;
    t["name"] = b.name;
    t["kind"] = b.kind;
    t["dtype"] = b.dtype;
    t["shape"] = b.dims;
    t["bytes"] = b.bytes;
    t[peer_key] = b.peers;
    out.push_back(std::move(t));
  }
  return out;
}

// A stage's memory and predicted times, in plan.json's order (the memory's "capacity" follows: the plan's).
constexpr std::pair<const char*, int64_t StageMemory::*> kMemoryFields[] = {
    {"parameters", &StageMemory::parameters},
    {"gradients", &StageMemory::gradients},
    {"optimizer_state", &StageMemory::optimizer_state},
    {"activations", &StageMemory::activations},
    {"transient", &StageMemory::transient},
    {"kernel_scratch", &StageMemory::kernel_scratch},
    {"total", &StageMemory::total},
    {"constants", &StageMemory::constants},
    {"boundary", &StageMemory::boundary},
    {"saved_per_microbatch", &StageMemory::saved},
    {"in_flight", &StageMemory::in_flight},
    {"arena", &StageMemory::arena}};
constexpr std::pair<const char*, double StagePlan::*> kStageTimes[] = {
    {"forward_ms", &StagePlan::forward_ms},           {"backward_ms", &StagePlan::backward_ms},
    {"recompute_ms", &StagePlan::recompute_ms},       {"optimizer_ms", &StagePlan::optimizer_ms},
    {"send_forward_ms", &StagePlan::send_forward_ms}, {"send_backward_ms", &StagePlan::send_backward_ms}};

const char* ObjectiveName(Objective o) { return o == Objective::kThroughput ? "throughput" : "fewest-stages"; }

// Typed field access with errors naming the path.
class Reader {
 public:
  Reader(const std::string& what) : what_(what) {}
  absl::StatusOr<const json*> Field(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) return INVALID_ARGUMENT() << what_ << ": " << path << " must be an object";
    auto it = obj.find(key);
    if (it == obj.end()) return INVALID_ARGUMENT() << what_ << ": missing " << Join(path, key);
    return &*it;
  }
  absl::StatusOr<int64_t> Int(const json& obj, const std::string& path, const char* key, int64_t min = 0) const {
    ASSIGN_OR_RETURN(const json* v, Field(obj, path, key));
    if (!v->is_number_integer() || v->get<int64_t>() < min) {
      return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must be an integer >= " << min;
    }
    return v->get<int64_t>();
  }
  absl::StatusOr<double> Number(const json& obj, const std::string& path, const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Field(obj, path, key));
    if (!v->is_number() || !(v->get<double>() >= 0)) {
      return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must be a number >= 0";
    }
    return v->get<double>();
  }
  absl::StatusOr<std::string> String(const json& obj, const std::string& path, const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Field(obj, path, key));
    if (!v->is_string()) return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must be a string";
    return v->get<std::string>();
  }
  absl::StatusOr<std::vector<std::string>> Strings(const json& obj, const std::string& path, const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Field(obj, path, key));
    if (!v->is_array()) return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must be an array";
    std::vector<std::string> out;
    for (const json& e : *v) {
      if (!e.is_string()) return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must hold strings";
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  absl::StatusOr<std::vector<int64_t>> Ints(const json& obj, const std::string& path, const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Field(obj, path, key));
    if (!v->is_array()) return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must be an array";
    std::vector<int64_t> out;
    for (const json& e : *v) {
      if (!e.is_number_integer()) return INVALID_ARGUMENT() << what_ << ": " << Join(path, key) << " must hold integers";
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  absl::Status Error(const std::string& path, const std::string& msg) const {
    return INVALID_ARGUMENT() << what_ << ": " << path << ": " << msg;
  }

 private:
  static std::string Join(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  std::string what_;
};

}  // namespace

ordered_json PlanToJson(const PartitionPlan& p) {
  ordered_json j;
  j["schema_version"] = kPlanSchemaVersion;
  j["generator"] = "onnxpipe partition";
  j["model"] = p.model;
  ordered_json dev = DeviceToJson(p.device);
  dev["capacity"] = p.capacity_bytes;
  j["device"] = std::move(dev);
  j["config"] = {{"batch", p.batch},
                 {"data_parallel", p.data_parallel},
                 {"world", p.num_stages * p.data_parallel},
                 {"microbatches", p.microbatches},
                 {"microbatch_size", p.microbatch_size},
                 {"num_stages", p.num_stages},
                 {"stages_auto", p.stages_auto},
                 {"objective", ObjectiveName(p.objective)},
                 {"schedule", ScheduleName(p.schedule)},
                 {"recompute", RecomputePolicyName(p.recompute)},
                 {"dtype", PrecisionName(p.precision)},
                 {"optimizer", p.optimizer},
                 {"kernel_scratch_counted", p.kernel_scratch_counted}};
  j["predicted"] = {{"step_ms", p.step_ms},
                    {"bubble_fraction", p.bubble_fraction},
                    {"samples_per_s", p.samples_per_s},
                    {"data_parallel_allreduce_ms", p.data_parallel_allreduce_ms},
                    {"data_parallel_exposed_ms", p.data_parallel_exposed_ms},
                    {"analytic_step_ms", p.analytic_step_ms},
                    {"cost_source", p.cost.source},
                    {"measured_nodes", p.cost.measured_nodes},
                    {"roofline_nodes", p.cost.roofline_nodes}};
  ordered_json stages = ordered_json::array();
  for (const StagePlan& s : p.stages) {
    ordered_json st;
    st["index"] = s.index;
    st["units"] = {s.unit_begin, s.unit_end};
    st["positions"] = {s.position_begin, s.position_end};
    st["layers"] = s.layers;
    st["nodes"] = {{"forward", s.forward_nodes}, {"backward", s.backward_nodes}, {"optimizer", s.optimizer_nodes},
                   {"replicated", s.replicated_nodes}};
    st["parameters"] = s.parameters;
    st["parameter_count"] = s.parameter_count;
    st["boundary_inputs"] = Tensors(s.boundary_inputs, "from");
    st["boundary_outputs"] = Tensors(s.boundary_outputs, "to");
    st["recompute"] = s.recompute;
    st["unit_recompute"] = s.unit_recompute;
    ordered_json regions = ordered_json::array();
    for (const RegionPlan& r : s.recompute_regions) {
      regions.push_back({{"nodes", r.nodes}, {"before", r.before}, {"ms", r.ms}});
    }
    st["recompute_regions"] = std::move(regions);
    std::vector<std::string> actions;
    for (const Action& a : s.actions) actions.push_back(ActionToString(a));
    st["actions"] = actions;
    ordered_json& memory = st["memory"];
    for (const auto& [key, field] : kMemoryFields) memory[key] = s.memory.*field;
    memory["capacity"] = p.capacity_bytes;
    ordered_json& predicted = st["predicted"];
    for (const auto& [key, field] : kStageTimes) predicted[key] = s.*field;
    predicted["data_parallel_allreduce_ms"] = s.data_parallel_allreduce_ms;
    predicted["data_parallel_bytes"] = s.data_parallel_bytes;
    predicted["data_parallel_tensors"] = s.data_parallel_tensors;
    predicted["data_parallel_buckets"] = s.data_parallel_buckets;
    predicted["data_parallel_exposed_ms"] = s.data_parallel_exposed_ms;
    stages.push_back(std::move(st));
  }
  j["stages"] = std::move(stages);
  j["global_nodes"] = p.global_nodes;
  ordered_json layers = ordered_json::array();
  for (const LayerPlan& l : p.layers) {
    layers.push_back({{"name", l.name},
                      {"stages", l.stages},
                      {"forward_ms", l.forward_ms},
                      {"backward_ms", l.backward_ms},
                      {"parameter_bytes", l.parameter_bytes}});
  }
  j["layers"] = std::move(layers);
  const SearchStats& s = p.search;
  j["search"] = {{"positions", s.positions},
                 {"cut_candidates", s.cut_candidates},
                 {"units", s.units},
                 {"stages_tried", s.stages_tried},
                 {"dp_runs", s.dp_runs},
                 {"bottlenecks_tried", s.bottlenecks_tried},
                 {"pareto_candidates", s.pareto_candidates},
                 {"verify_rounds", s.verify_rounds},
                 {"stages_planned", s.stages_planned},
                 {"refinements", s.refinements},
                 {"best_objective_ms", s.best_objective_ms},
                 {"seconds", s.seconds}};
  j["warnings"] = p.warnings;
  return j;
}

absl::StatusOr<PartitionPlan> PlanFromJson(const json& j, const std::string& what) {
  const Reader r(what);
  PartitionPlan p;
  if (!j.is_object()) return r.Error("(top)", "plan.json must be a JSON object");
  ASSIGN_OR_RETURN(int64_t version, r.Int(j, "", "schema_version"));
  if (version == 1) {
    return r.Error("schema_version", "is 1: that plan lists the stages' nodes but not what runs (the post-step "
                                     "gradient Sums, the schedule's actions); re-run onnxpipe partition to write "
                                     "version " + std::to_string(kPlanSchemaVersion));
  }
  if (version == 2) {
    return r.Error("schema_version", "is 2: that plan's memory has no kernel scratch (its \"workspace\" is the "
                                     "arena's transient region); re-run onnxpipe partition to write version " +
                                         std::to_string(kPlanSchemaVersion));
  }
  if (version != kPlanSchemaVersion) {
    return r.Error("schema_version", "is " + std::to_string(version) + "; this onnxpipe reads version " +
                                         std::to_string(kPlanSchemaVersion) + " (re-run onnxpipe partition)");
  }
  p.schema_version = static_cast<int>(version);
  ASSIGN_OR_RETURN(p.model, r.String(j, "", "model"));
  ASSIGN_OR_RETURN(const json* dev, r.Field(j, "", "device"));
  ASSIGN_OR_RETURN(p.device.name, r.String(*dev, "device", "name"));
  ASSIGN_OR_RETURN(p.device.memory_bytes, r.Int(*dev, "device", "memory", 1));
  ASSIGN_OR_RETURN(p.device.reserved_bytes, r.Int(*dev, "device", "reserved"));
  ASSIGN_OR_RETURN(p.capacity_bytes, r.Int(*dev, "device", "capacity", 1));

  ASSIGN_OR_RETURN(const json* cfg, r.Field(j, "", "config"));
  ASSIGN_OR_RETURN(p.batch, r.Int(*cfg, "config", "batch", 1));
  ASSIGN_OR_RETURN(p.microbatches, r.Int(*cfg, "config", "microbatches", 1));
  ASSIGN_OR_RETURN(p.microbatch_size, r.Int(*cfg, "config", "microbatch_size", 1));
  ASSIGN_OR_RETURN(p.num_stages, r.Int(*cfg, "config", "num_stages", 1));
  if (p.microbatch_size * p.microbatches != p.batch) {
    return r.Error("config", "batch must equal microbatches x microbatch_size");
  }
  // Plans written before data parallelism have no data_parallel: one replica.
  if (cfg->contains("data_parallel")) {
    ASSIGN_OR_RETURN(p.data_parallel, r.Int(*cfg, "config", "data_parallel", 1));
  }
  ASSIGN_OR_RETURN(std::string schedule, r.String(*cfg, "config", "schedule"));
  absl::StatusOr<ScheduleKind> sk = ParseSchedule(schedule);
  if (!sk.ok()) return r.Error("config.schedule", std::string(sk.status().message()));
  p.schedule = *sk;
  ASSIGN_OR_RETURN(std::string recompute, r.String(*cfg, "config", "recompute"));
  absl::StatusOr<RecomputePolicy> rp = ParseRecomputePolicy(recompute);
  if (!rp.ok()) return r.Error("config.recompute", std::string(rp.status().message()));
  p.recompute = *rp;
  ASSIGN_OR_RETURN(std::string dtype, r.String(*cfg, "config", "dtype"));
  absl::StatusOr<Precision> pr = ParsePrecision(dtype);
  if (!pr.ok()) return r.Error("config.dtype", std::string(pr.status().message()));
  p.precision = *pr;
  ASSIGN_OR_RETURN(p.optimizer, r.String(*cfg, "config", "optimizer"));
  const json* counted = cfg->contains("kernel_scratch_counted") ? &(*cfg)["kernel_scratch_counted"] : nullptr;
  if (counted == nullptr || !counted->is_boolean()) {
    return r.Error("config.kernel_scratch_counted", "must be true or false");
  }
  p.kernel_scratch_counted = counted->get<bool>();

  ASSIGN_OR_RETURN(const json* pred, r.Field(j, "", "predicted"));
  ASSIGN_OR_RETURN(p.step_ms, r.Number(*pred, "predicted", "step_ms"));
  ASSIGN_OR_RETURN(p.bubble_fraction, r.Number(*pred, "predicted", "bubble_fraction"));
  ASSIGN_OR_RETURN(p.samples_per_s, r.Number(*pred, "predicted", "samples_per_s"));
  if (p.bubble_fraction > 1) return r.Error("predicted.bubble_fraction", "must be in [0, 1]");
  if (pred->contains("data_parallel_allreduce_ms")) {
    ASSIGN_OR_RETURN(p.data_parallel_allreduce_ms, r.Number(*pred, "predicted", "data_parallel_allreduce_ms"));
  }
  // Plans written before the bucketed all-reduce: all of it after the backward.
  p.data_parallel_exposed_ms = p.data_parallel_allreduce_ms;
  if (pred->contains("data_parallel_exposed_ms")) {
    ASSIGN_OR_RETURN(p.data_parallel_exposed_ms, r.Number(*pred, "predicted", "data_parallel_exposed_ms"));
  }

  ASSIGN_OR_RETURN(const json* stages, r.Field(j, "", "stages"));
  if (!stages->is_array() || stages->empty()) return r.Error("stages", "must be a non-empty array");
  if (static_cast<int64_t>(stages->size()) != p.num_stages) {
    return r.Error("stages", "has " + std::to_string(stages->size()) + " entries but config.num_stages is " +
                                 std::to_string(p.num_stages));
  }
  std::map<std::string, int32_t> seen_nodes;  // -> stage
  int32_t expect_unit = 0;
  for (size_t k = 0; k < stages->size(); ++k) {
    const json& sj = (*stages)[k];
    const std::string path = "stages[" + std::to_string(k) + "]";
    StagePlan s;
    ASSIGN_OR_RETURN(int64_t index, r.Int(sj, path, "index"));
    if (index != static_cast<int64_t>(k)) return r.Error(path + ".index", "must be " + std::to_string(k));
    s.index = static_cast<int32_t>(index);
    ASSIGN_OR_RETURN(std::vector<int64_t> units, r.Ints(sj, path, "units"));
    if (units.size() != 2 || units[0] != expect_unit || units[1] <= units[0]) {
      return r.Error(path + ".units", "must be [" + std::to_string(expect_unit) +
                                          ", end > begin): stages cover the units contiguously");
    }
    s.unit_begin = static_cast<int32_t>(units[0]);
    s.unit_end = static_cast<int32_t>(units[1]);
    expect_unit = s.unit_end;
    ASSIGN_OR_RETURN(std::vector<int64_t> positions, r.Ints(sj, path, "positions"));
    if (positions.size() != 2 || positions[1] <= positions[0]) return r.Error(path + ".positions", "must be [begin, end)");
    s.position_begin = static_cast<int32_t>(positions[0]);
    s.position_end = static_cast<int32_t>(positions[1]);
    ASSIGN_OR_RETURN(s.layers, r.Strings(sj, path, "layers"));
    ASSIGN_OR_RETURN(const json* nodes, r.Field(sj, path, "nodes"));
    ASSIGN_OR_RETURN(s.forward_nodes, r.Strings(*nodes, path + ".nodes", "forward"));
    ASSIGN_OR_RETURN(s.backward_nodes, r.Strings(*nodes, path + ".nodes", "backward"));
    ASSIGN_OR_RETURN(s.optimizer_nodes, r.Strings(*nodes, path + ".nodes", "optimizer"));
    if (nodes->contains("replicated")) {
      ASSIGN_OR_RETURN(s.replicated_nodes, r.Strings(*nodes, path + ".nodes", "replicated"));
    }
    if (s.forward_nodes.empty()) return r.Error(path + ".nodes.forward", "is empty: every stage runs forward nodes");
    const std::set<std::string> replicated(s.replicated_nodes.begin(), s.replicated_nodes.end());
    const std::set<std::string> optimizer(s.optimizer_nodes.begin(), s.optimizer_nodes.end());
    for (const std::string& n : replicated) {
      if (!optimizer.count(n)) return r.Error(path + ".nodes.replicated", "node '" + n + "' is not under optimizer");
    }
    for (const auto* list : {&s.forward_nodes, &s.backward_nodes, &s.optimizer_nodes}) {
      for (const std::string& n : *list) {
        if (replicated.count(n)) continue;  // a shared parameter's node, owned by another stage
        auto [it, fresh] = seen_nodes.emplace(n, static_cast<int32_t>(k));
        if (!fresh) {
          return r.Error(path + ".nodes", "node '" + n + "' is on two stages (" + std::to_string(it->second) +
                                              " and " + std::to_string(k) + ")");
        }
      }
    }
    ASSIGN_OR_RETURN(s.parameters, r.Strings(sj, path, "parameters"));
    ASSIGN_OR_RETURN(s.parameter_count, r.Int(sj, path, "parameter_count"));
    for (const char* key : {"boundary_inputs", "boundary_outputs"}) {
      ASSIGN_OR_RETURN(const json* list, r.Field(sj, path, key));
      if (!list->is_array()) return r.Error(path + "." + key, "must be an array");
      const bool input = std::string(key) == "boundary_inputs";
      for (size_t i = 0; i < list->size(); ++i) {
        const json& tj = (*list)[i];
        const std::string tp = path + "." + key + "[" + std::to_string(i) + "]";
        BoundaryTensor b;
        ASSIGN_OR_RETURN(b.name, r.String(tj, tp, "name"));
        ASSIGN_OR_RETURN(b.kind, r.String(tj, tp, "kind"));
        static const std::set<std::string> kinds = {"activation", "gradient", "data", "step", "global",
                                                   "shared_gradient"};
        if (!kinds.count(b.kind)) return r.Error(tp + ".kind", "unknown kind '" + b.kind + "'");
        ASSIGN_OR_RETURN(b.dtype, r.String(tj, tp, "dtype"));
        ASSIGN_OR_RETURN(b.dims, r.Ints(tj, tp, "shape"));
        ASSIGN_OR_RETURN(b.bytes, r.Int(tj, tp, "bytes"));
        ASSIGN_OR_RETURN(std::vector<int64_t> peers, r.Ints(tj, tp, input ? "from" : "to"));
        for (int64_t q : peers) {
          if (q < 0 || q >= p.num_stages || q == static_cast<int64_t>(k)) {
            return r.Error(tp, "names stage " + std::to_string(q) + ", not another stage of this plan");
          }
          b.peers.push_back(static_cast<int32_t>(q));
        }
        (input ? s.boundary_inputs : s.boundary_outputs).push_back(std::move(b));
      }
    }
    ASSIGN_OR_RETURN(s.recompute, r.String(sj, path, "recompute"));
    ASSIGN_OR_RETURN(s.unit_recompute, r.Strings(sj, path, "unit_recompute"));
    if (static_cast<int32_t>(s.unit_recompute.size()) != s.unit_end - s.unit_begin) {
      return r.Error(path + ".unit_recompute", "must have one entry per unit");
    }
    ASSIGN_OR_RETURN(const json* regions, r.Field(sj, path, "recompute_regions"));
    if (!regions->is_array()) return r.Error(path + ".recompute_regions", "must be an array");
    for (size_t i = 0; i < regions->size(); ++i) {
      const std::string rp_path = path + ".recompute_regions[" + std::to_string(i) + "]";
      RegionPlan rp;
      ASSIGN_OR_RETURN(rp.nodes, r.Strings((*regions)[i], rp_path, "nodes"));
      ASSIGN_OR_RETURN(rp.before, r.String((*regions)[i], rp_path, "before"));
      ASSIGN_OR_RETURN(rp.ms, r.Number((*regions)[i], rp_path, "ms"));
      if (rp.nodes.empty()) return r.Error(rp_path + ".nodes", "is empty");
      s.recompute_regions.push_back(std::move(rp));
    }
    ASSIGN_OR_RETURN(const std::vector<std::string> actions, r.Strings(sj, path, "actions"));
    for (size_t i = 0; i < actions.size(); ++i) {
      absl::StatusOr<Action> a = ParseAction(actions[i]);
      if (!a.ok()) return r.Error(path + ".actions[" + std::to_string(i) + "]", std::string(a.status().message()));
      s.actions.push_back(*a);
    }
    ASSIGN_OR_RETURN(const json* mem, r.Field(sj, path, "memory"));
    const std::string mp = path + ".memory";
    StageMemory& m = s.memory;
    for (const auto& [key, field] : kMemoryFields) {
      ASSIGN_OR_RETURN(m.*field, r.Int(*mem, mp, key, /*min=*/field == &StageMemory::in_flight ? 1 : 0));
    }
    if (m.activations != m.saved * m.in_flight) {
      return r.Error(mp + ".activations", "must equal saved_per_microbatch x in_flight");
    }
    if (m.total != m.parameters + m.gradients + m.optimizer_state + m.constants + m.activations + m.transient +
                       m.kernel_scratch + m.boundary) {
      return r.Error(mp + ".total", "is not the sum of its parts");
    }
    ASSIGN_OR_RETURN(const json* sp, r.Field(sj, path, "predicted"));
    const std::string pp = path + ".predicted";
    for (const auto& [key, field] : kStageTimes) {
      ASSIGN_OR_RETURN(s.*field, r.Number(*sp, pp, key));
    }
    if (sp->contains("data_parallel_allreduce_ms")) {
      ASSIGN_OR_RETURN(s.data_parallel_allreduce_ms, r.Number(*sp, pp, "data_parallel_allreduce_ms"));
      ASSIGN_OR_RETURN(s.data_parallel_bytes, r.Int(*sp, pp, "data_parallel_bytes"));
      ASSIGN_OR_RETURN(s.data_parallel_tensors, r.Int(*sp, pp, "data_parallel_tensors"));
    }
    s.data_parallel_exposed_ms = s.data_parallel_allreduce_ms;
    if (sp->contains("data_parallel_exposed_ms")) {
      ASSIGN_OR_RETURN(s.data_parallel_exposed_ms, r.Number(*sp, pp, "data_parallel_exposed_ms"));
      ASSIGN_OR_RETURN(s.data_parallel_buckets, r.Int(*sp, pp, "data_parallel_buckets"));
    }
    p.stages.push_back(std::move(s));
  }
  ASSIGN_OR_RETURN(p.global_nodes, r.Strings(j, "", "global_nodes"));
  for (const std::string& n : p.global_nodes) {
    if (!seen_nodes.count(n)) return r.Error("global_nodes", "node '" + n + "' is on no stage's optimizer list");
  }
  if (j.contains("layers") && j.at("layers").is_array()) {
    for (const json& l : j.at("layers")) {
      LayerPlan lp;
      if (l.contains("name") && l.at("name").is_string()) lp.name = l.at("name").get<std::string>();
      if (l.contains("stages") && l.at("stages").is_array())
        for (const json& s : l.at("stages"))
          if (s.is_number_integer()) lp.stages.push_back(s.get<int32_t>());
      p.layers.push_back(std::move(lp));
    }
  }
  if (j.contains("warnings") && j.at("warnings").is_array()) {
    for (const json& w : j.at("warnings"))
      if (w.is_string()) p.warnings.push_back(w.get<std::string>());
  }
  return p;
}

absl::StatusOr<PartitionPlan> LoadPlan(const std::string& dir) {
  const std::string path = dir + "/plan.json";
  ASSIGN_OR_RETURN(const json j,
                   ReadJsonFile(path, "no plan here (write one with onnxpipe partition --out " + dir + ")"));
  return PlanFromJson(j, path);
}

absl::StatusOr<CompiledPlan> CompilePlan(const ir::Graph& g, const PartitionPlan& plan) {
  const std::string what = "plan (" + plan.model + ")";
  absl::StatusOr<GraphAnalysis> analysis = AnalyzeTrainingGraph(g, AnalysisOptions{});
  if (!analysis.ok()) return Annotate(analysis.status(), what);
  const GraphAnalysis& a = *analysis;
  std::unordered_map<std::string, ir::NodeId> by_name;
  for (ir::NodeId id : a.order) by_name.emplace(g.node(id).name, id);
  std::vector<StageNodes> placement(plan.stages.size());
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const StagePlan& sp = plan.stages[k];
    auto ids = [&](const std::vector<std::string>& names, const std::string& list,
                   std::vector<ir::NodeId>* out) -> absl::Status {
      for (const std::string& n : names) {
        auto it = by_name.find(n);
        if (it == by_name.end()) {
          return INVALID_ARGUMENT() << what << ": stage " << k << " lists node '" << n << "' under " << list
                                    << ", which the training graph does not have (another model or other options?)";
        }
        out->push_back(it->second);
      }
      return absl::OkStatus();
    };
    StageNodes& sn = placement[k];
    RETURN_IF_ERROR(ids(sp.forward_nodes, "forward", &sn.forward));
    RETURN_IF_ERROR(ids(sp.backward_nodes, "backward", &sn.backward));
    RETURN_IF_ERROR(ids(sp.optimizer_nodes, "optimizer", &sn.post));
    for (const RegionPlan& rp : sp.recompute_regions) {
      RecomputeRegion region;
      RETURN_IF_ERROR(ids(rp.nodes, "recompute_regions", &region.nodes));
      std::vector<ir::NodeId> before;
      RETURN_IF_ERROR(ids({rp.before}, "recompute_regions.before", &before));
      region.before = before[0];
      sn.regions.push_back(std::move(region));
    }
  }
  CompiledPlan c;
  absl::StatusOr<PipelineProgram> program = BuildPipelineProgram(a, placement);
  if (!program.ok()) return Annotate(program.status(), what);
  c.program = *std::move(program);
  c.schedule = plan.schedule;
  c.microbatches = static_cast<int32_t>(plan.microbatches);
  const int32_t K = c.program.num_stages;
  ASSIGN_OR_RETURN(const std::vector<ActionList> expected,
                   BuildSchedule(plan.schedule, K, c.microbatches, ShapesOf(c.program)));
  for (int32_t k = 0; k < K; ++k) {
    const std::vector<Action>& have = plan.stages[k].actions;
    const ActionList& want = expected[k];
    for (size_t i = 0; i < std::max(have.size(), want.size()); ++i) {
      if (i < have.size() && i < want.size() && have[i] == want[i]) continue;
      return INVALID_ARGUMENT() << what << ": stage " << k << "'s actions are not the " << ScheduleName(plan.schedule)
                                << " schedule of its program (K=" << K << ", M=" << c.microbatches << "): action " << i
                                << " is " << (i < have.size() ? ActionToString(have[i]) : std::string("missing"))
                                << " in the plan, " << (i < want.size() ? ActionToString(want[i]) : std::string("none"))
                                << " in the schedule";
    }
  }
  c.actions = expected;
  absl::Status st = ProveDeadlockFree(c.program, c.actions);
  if (st.ok()) st = ProveTransferOrder(c.program, c.actions);
  if (!st.ok()) return Annotate(st, what);
  return c;
}

}  // namespace onnxpipe::partitioner
