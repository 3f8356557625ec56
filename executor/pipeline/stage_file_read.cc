// Reading a stage program file (stage_file.h) back into a stage's program, and checking it against the run.
#include <algorithm>

#include "executor/io/atomic_file.h"
#include "executor/io/crc32c.h"
#include "executor/pipeline/stage_file.h"
#include "executor/pipeline/stage_file_json.h"
#include "frontend/ir/status.h"
#include "frontend/ir/verifier.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::pipeline {
namespace {

using json = nlohmann::json;
using partitioner::StageProgram;
using partitioner::ValueLists;

// Indices of the file resolved against the rebuilt graph (ids equal the file's indices), range-checked.
struct Ids {
  int32_t values = 0, nodes = 0, stages = 0;
  absl::StatusOr<ir::ValueId> V(const json& j) const {
    const int64_t i = j.get<int64_t>();
    if (i < -1 || i >= values) return INVALID_ARGUMENT() << "value index " << i << " out of range";
    return static_cast<ir::ValueId>(i);
  }
  absl::StatusOr<ir::NodeId> N(const json& j) const {
    const int64_t i = j.get<int64_t>();
    if (i < -1 || i >= nodes) return INVALID_ARGUMENT() << "node index " << i << " out of range";
    return static_cast<ir::NodeId>(i);
  }
  template <typename Id>
  absl::StatusOr<std::vector<Id>> List(const json& a, bool nodes_list) const {
    std::vector<Id> out;
    for (const json& x : a) {
      absl::StatusOr<int32_t> id = nodes_list ? N(x) : V(x);
      if (!id.ok()) return id.status();
      out.push_back(*id);
    }
    return out;
  }
  absl::StatusOr<ValueLists> Lists(const json& o) const {
    ValueLists m;
    for (const auto& [peer, vs] : o.items()) {
      const int32_t s = std::stoi(peer);
      if (s < 0 || s >= stages) return INVALID_ARGUMENT() << "peer stage " << peer << " out of range";
      ASSIGN_OR_RETURN(m[s], List<ir::ValueId>(vs, false));
    }
    return m;
  }
};

// A value's constant: the model's initializer (checked) or the file's own tensor.
absl::StatusOr<ir::Tensor> ConstantOf(const json& c, const ir::Value& v, const ir::Graph& model) {
  if (!c.contains("model")) return TensorFromJson(c);
  const ir::ValueId m = model.FindValue(v.name);
  if (m == ir::kNoValue || !model.value(m).constant || !model.value(m).constant->has_data()) {
    return NOT_FOUND() << "the model has no initializer '" << v.name << "' (the plan was made for another model)";
  }
  const ir::Tensor& t = *model.value(m).constant;
  const uint32_t crc = io::Crc32c(t.raw(), static_cast<size_t>(t.num_bytes()));
  if (t.dtype() != v.dtype || crc != c.at("crc32c").get<uint32_t>()) {
    return FAILED_PRECONDITION() << "the model's initializer '" << v.name << "' is not the one the plan was made with ("
                                 << ir::DTypeName(t.dtype()) << ", CRC32C " << crc
                                 << "; the plan's: " << ir::DTypeName(v.dtype) << ", " << c.at("crc32c").get<uint32_t>()
                                 << "): re-run onnxpipe partition on this model";
  }
  // Shared, as the training graph shares it: the stage updates it in place (a mapped initializer is a private,
  // copy-on-write mapping), and the run releases the model's reference once the stages are built.
  return t;
}

absl::Status ReadGraph(const json& j, const ir::Graph& model, ir::Graph& g, Ids& ids) {
  for (const json& jv : j.at("values")) {
    const std::string dtype = jv.at("dtype").get<std::string>();
    const std::optional<ir::DType> dt = ir::ParseDType(dtype);
    if (!dt) return INVALID_ARGUMENT() << "value '" << jv.at("name").get<std::string>() << "': dtype " << dtype;
    ir::Shape shape;
    for (const json& d : jv.at("shape")) shape.push_back(DimFromJson(d));
    const ir::ValueId id =
        g.AddValue(jv.at("name").get<std::string>(), *dt, std::move(shape), jv.at("shape_known").get<bool>());
    ir::Value& v = g.value(id);
    if (v.name != jv.at("name").get<std::string>()) return INVALID_ARGUMENT() << "two values named '" << v.name << "'";
    v.is_initializer = jv.at("initializer").get<bool>();
    v.param_state = static_cast<ir::ParamState>(jv.at("param_state").get<int>());
    v.exported_as = static_cast<ir::ExportedAs>(jv.at("exported_as").get<int>());
    if (jv.contains("constant")) {
      absl::StatusOr<ir::Tensor> c = ConstantOf(jv.at("constant"), v, model);
      if (!c.ok()) return c.status();
      g.value(id).constant = *std::move(c);
    }
  }
  ids.values = g.num_values();
  for (const json& jn : j.at("nodes")) {
    const std::string op = jn.at("op").get<std::string>();
    const std::optional<ir::OpKind> kind = ir::ParseOpKind(op);
    if (!kind) return INVALID_ARGUMENT() << "node '" << jn.at("name").get<std::string>() << "': unknown op " << op;
    ASSIGN_OR_RETURN(std::vector<ir::ValueId> in, ids.List<ir::ValueId>(jn.at("inputs"), false));
    ASSIGN_OR_RETURN(std::vector<ir::ValueId> out, ids.List<ir::ValueId>(jn.at("outputs"), false));
    ASSIGN_OR_RETURN(ir::Attrs attrs, AttrsFromJson(jn.at("attrs")));
    const ir::NodeId id =
        g.AddNode(*kind, jn.at("name").get<std::string>(), std::move(in), std::move(out), std::move(attrs));
    ir::Node& n = g.node(id);
    n.scope = jn.at("scope").get<std::string>();
    n.phase = static_cast<ir::Phase>(jn.at("phase").get<int>());
    n.origin = jn.at("origin").get<std::string>();
  }
  ids.nodes = g.num_node_slots();
  return absl::OkStatus();
}

absl::Status ReadProgram(const json& j, const Ids& ids, StageProgram& sp) {
  ASSIGN_OR_RETURN(sp.forward, ids.List<ir::NodeId>(j.at("forward"), true));
  ASSIGN_OR_RETURN(sp.backward, ids.List<ir::NodeId>(j.at("backward"), true));
  ASSIGN_OR_RETURN(sp.post, ids.List<ir::NodeId>(j.at("post"), true));
  for (const json& p : j.at("parts")) {
    partitioner::BackwardPart part{static_cast<partitioner::ActionKind>(p.at(0).get<int>()), p.at(1).get<int32_t>(),
                                   p.at(2).get<int32_t>()};
    if (part.begin < 0 || part.begin > part.end || part.end > static_cast<int32_t>(sp.backward.size())) {
      return INVALID_ARGUMENT() << "backward part [" << part.begin << ", " << part.end << ") out of range";
    }
    sp.parts.push_back(part);
  }
  for (const json& r : j.at("regions")) {
    partitioner::RecomputeRegion region;
    ASSIGN_OR_RETURN(region.nodes, ids.List<ir::NodeId>(r.at("nodes"), true));
    ASSIGN_OR_RETURN(region.before, ids.N(r.at("before")));
    sp.regions.push_back(std::move(region));
  }
  ASSIGN_OR_RETURN(sp.recompute_clones, ids.List<ir::NodeId>(j.at("recompute_clones"), true));
  ASSIGN_OR_RETURN(sp.cloned_from, ids.List<ir::NodeId>(j.at("cloned_from"), true));
  ASSIGN_OR_RETURN(sp.data_inputs, ids.List<ir::ValueId>(j.at("data_inputs"), false));
  ASSIGN_OR_RETURN(sp.step_inputs, ids.List<ir::ValueId>(j.at("step_inputs"), false));
  ASSIGN_OR_RETURN(sp.loss_scale, ids.V(j.at("loss_scale")));
  ASSIGN_OR_RETURN(sp.send_forward, ids.Lists(j.at("send_forward")));
  ASSIGN_OR_RETURN(sp.recv_forward, ids.Lists(j.at("recv_forward")));
  ASSIGN_OR_RETURN(sp.send_backward, ids.Lists(j.at("send_backward")));
  ASSIGN_OR_RETURN(sp.recv_backward, ids.Lists(j.at("recv_backward")));
  ASSIGN_OR_RETURN(sp.send_post, ids.Lists(j.at("send_post")));
  ASSIGN_OR_RETURN(sp.recv_post, ids.Lists(j.at("recv_post")));
  ASSIGN_OR_RETURN(sp.accumulate, ids.List<ir::ValueId>(j.at("accumulate"), false));
  for (const json& u : j.at("state_updates")) {
    ASSIGN_OR_RETURN(const ir::ValueId state, ids.V(u.at(0)));
    ASSIGN_OR_RETURN(const ir::ValueId next, ids.V(u.at(1)));
    sp.state_updates.push_back({state, next});
  }
  ASSIGN_OR_RETURN(sp.parameters, ids.List<ir::ValueId>(j.at("parameters"), false));
  ASSIGN_OR_RETURN(sp.shared_parameters, ids.List<ir::ValueId>(j.at("shared_parameters"), false));
  ASSIGN_OR_RETURN(sp.loss, ids.V(j.at("loss")));
  ASSIGN_OR_RETURN(sp.grad_norm, ids.V(j.at("grad_norm")));
  ASSIGN_OR_RETURN(sp.graph.inputs(), ids.List<ir::ValueId>(j.at("graph_inputs"), false));
  ASSIGN_OR_RETURN(sp.graph.outputs(), ids.List<ir::ValueId>(j.at("graph_outputs"), false));
  // The graph's own state updates are the stage's (the memory planner tells parameters and optimizer state by them).
  sp.graph.state_updates() = sp.state_updates;
  return absl::OkStatus();
}

absl::StatusOr<LoadedStage> Parse(const json& j, int32_t k, const partitioner::PartitionPlan& plan,
                                  const ir::Graph& model) {
  if (j.at("format").get<std::string>() != "onnxpipe stage program" || j.at("version").get<int>() != 1) {
    return INVALID_ARGUMENT() << "not a version 1 onnxpipe stage program (re-run onnxpipe partition)";
  }
  const int32_t K = static_cast<int32_t>(plan.num_stages);
  if (j.at("stage").get<int32_t>() != k || j.at("num_stages").get<int32_t>() != K ||
      j.at("microbatches").get<int64_t>() != plan.microbatches ||
      j.at("data_parallel").get<int64_t>() != plan.data_parallel) {
    return INVALID_ARGUMENT() << "stage " << j.at("stage") << " of " << j.at("num_stages") << " with "
                              << j.at("microbatches") << " micro-batches and data parallelism " << j.at("data_parallel")
                              << ", but plan.json says stage " << k << " of " << K << ", " << plan.microbatches
                              << " and " << plan.data_parallel << " (a stage file of another plan)";
  }
  std::vector<partitioner::Action> actions;
  for (const json& a : j.at("actions")) {
    ASSIGN_OR_RETURN(partitioner::Action act, partitioner::ParseAction(a.get<std::string>()));
    actions.push_back(act);
  }
  if (!(actions == plan.stages[k].actions)) {
    return INVALID_ARGUMENT() << "its actions are not plan.json's stage " << k << " actions (a stage file of another "
                              << "plan)";
  }
  LoadedStage out;
  partitioner::CompiledPlan& c = out.plan;
  c.schedule = plan.schedule;
  c.microbatches = static_cast<int32_t>(plan.microbatches);
  for (const partitioner::StagePlan& s : plan.stages) c.actions.push_back(s.actions);
  partitioner::PipelineProgram& p = c.program;
  p.num_stages = K;
  p.stages.resize(K);
  for (int32_t s = 0; s < K; ++s) p.stages[s].stage = s;
  StageProgram& sp = p.stages[k];
  Ids ids;
  ids.stages = K;
  RETURN_IF_ERROR(ReadGraph(j, model, sp.graph, ids));
  RETURN_IF_ERROR(ReadProgram(j.at("program"), ids, sp));
  // SSA, operands before use, arity, constants matching their values: what the executor relies on.
  RETURN_IF_ERROR(ir::Verify(sp.graph));
  const json& pj = j.at("pipeline");
  p.loss = sp.loss;
  p.grad_norm = sp.grad_norm;
  p.loss_stage = pj.at("loss_stage").get<int32_t>();
  p.grad_norm_stage = pj.at("grad_norm_stage").get<int32_t>();
  p.shared_groups = pj.at("shared_groups").get<std::vector<std::vector<int32_t>>>();
  p.all_reduced.resize(K);
  for (const json& e : pj.at("all_reduced")) {
    ASSIGN_OR_RETURN(const ir::NodeId id, ids.N(e.at(0)));
    p.all_reduced[k][id] = e.at(1).get<std::vector<int32_t>>();
  }
  auto is_stage = [K](int32_t s) { return s >= 0 && s < K; };
  bool stages_ok = is_stage(p.loss_stage) && (p.grad_norm_stage == -1 || is_stage(p.grad_norm_stage));
  for (const std::vector<int32_t>& g : p.shared_groups) stages_ok &= std::all_of(g.begin(), g.end(), is_stage);
  for (const auto& [id, g] : p.all_reduced[k]) stages_ok &= std::all_of(g.begin(), g.end(), is_stage);
  if (!stages_ok) return INVALID_ARGUMENT() << "a stage index out of [0, " << K << ")";
  for (ir::ValueId v : sp.parameters) {
    auto it = std::find_if(sp.state_updates.begin(), sp.state_updates.end(),
                           [&](const ir::Graph::StateUpdate& u) { return u.state == v; });
    if (it != sp.state_updates.end()) p.parameter_owner[v] = k;
  }
  ASSIGN_OR_RETURN(out.facts, FactsFromJson(j.at("facts")));
  for (const auto& [name, owner] : out.facts.parameters)
    if (!is_stage(owner)) return INVALID_ARGUMENT() << "parameter '" << name << "' on stage " << owner;
  for (auto& [v, owner] : p.parameter_owner) {
    auto it = out.facts.parameters.find(sp.graph.value(v).name);
    if (it != out.facts.parameters.end()) owner = it->second;
  }
  ASSIGN_OR_RETURN(out.spec, SpecFromJson(j.at("spec")));
  out.bindings = j.at("bindings").get<std::map<std::string, int64_t>>();
  sp.graph.symbol_bindings = out.bindings;
  const json& t = j.at("trainer");
  for (const auto& [name, dtype] : t.at("input_dtypes").items()) {
    const std::optional<ir::DType> dt = ir::ParseDType(dtype.get<std::string>());
    if (!dt) return INVALID_ARGUMENT() << "input '" << name << "': dtype " << dtype;
    out.input_dtypes[name] = *dt;
  }
  out.num_trainable = t.at("num_trainable").get<int64_t>();
  out.num_classes = t.at("num_classes").get<int64_t>();
  out.unreachable = t.at("unreachable").get<std::vector<std::string>>();
  out.num_nodes = ids.nodes;
  return out;
}

}  // namespace

absl::StatusOr<LoadedStage> ReadStageFile(const std::string& dir, int32_t stage, const partitioner::PartitionPlan& plan,
                                          const ir::Graph& model) {
  const std::string path = StageFilePath(dir, stage);
  if (stage < 0 || stage >= plan.num_stages) {
    return INVALID_ARGUMENT() << path << ": the plan has " << plan.num_stages << " stages, not " << stage + 1;
  }
  absl::StatusOr<std::string> bytes = io::ReadFileToString(path);
  if (!bytes.ok()) return Annotate(bytes.status(), path);
  // The CBOR document, then its masked CRC32C (4 bytes, little-endian).
  uint32_t stored = 0;
  const size_t n = bytes->size() < 4 ? 0 : bytes->size() - 4;
  for (int i = 0; i < 4 && bytes->size() >= 4; ++i)
    stored |= static_cast<uint32_t>(static_cast<uint8_t>((*bytes)[n + i])) << (8 * i);
  if (bytes->size() < 4 || io::UnmaskCrc32c(stored) != io::Crc32c(std::string_view(*bytes).substr(0, n))) {
    return INVALID_ARGUMENT() << path
                              << ": damaged or incomplete (its checksum does not match); re-run onnxpipe partition";
  }
  bytes->resize(n);
  try {
    const json j = json::from_cbor(*bytes);
    absl::StatusOr<LoadedStage> out = Parse(j, stage, plan, model);
    if (!out.ok()) return Annotate(out.status(), path);
    return out;
  } catch (const std::exception& e) {  // nlohmann's type and key errors, a peer that is not a number
    return INVALID_ARGUMENT() << path << ": not a complete stage program (" << e.what()
                              << "); re-run onnxpipe partition";
  }
}

absl::Status CheckStageMatchesRun(const LoadedStage& loaded, const std::string& file,
                                  const autodiff::TrainingGraphSpec& run, const ir::Graph& model) {
  const std::vector<std::string> diff = SpecDifferences(loaded.spec, run);
  if (!diff.empty()) {
    std::string what;
    for (const std::string& d : diff) what += (what.empty() ? "" : "; ") + d;
    return INVALID_ARGUMENT() << file << " was built with other training options than this run's (plan vs run: " << what
                              << "): re-run onnxpipe partition with the same flags";
  }
  // The stage's trained parameters are the ones this run's --freeze / --train-only train, and no others.
  for (const partitioner::StageProgram& s : loaded.plan.program.stages) {
    for (ir::ValueId v = 0; v < s.graph.num_values(); ++v) {
      const ir::Value& val = s.graph.value(v);
      const ir::ValueId m = model.FindValue(val.name);
      if (!val.is_initializer || m == ir::kNoValue || !model.value(m).is_initializer ||
          model.value(m).param_state == ir::ParamState::kUndecided) {
        continue;  // not the model's, or not decided by this run
      }
      const bool trained_here = loaded.facts.parameters.count(val.name) > 0;
      const bool trained_run = model.value(m).param_state == ir::ParamState::kTrainable;
      if (trained_here != trained_run) {
        return INVALID_ARGUMENT() << file << ": initializer '" << val.name << "' is "
                                  << (trained_here ? "trained" : "frozen") << " in the plan but "
                                  << (trained_run ? "trained" : "frozen")
                                  << " in this run (--freeze / --train-only): re-run onnxpipe partition with the same "
                                  << "flags";
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
