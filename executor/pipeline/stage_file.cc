// Stage program files (stage_file.h): the writer numbers the stage's values and nodes anew and serialises them with
// the program's lists; the reader rebuilds the stage's graph and program, taking the model's initializers by name.
#include "executor/pipeline/stage_file.h"

#include <filesystem>
#include <set>

#include "executor/io/atomic_file.h"
#include "executor/io/crc32c.h"
#include "executor/pipeline/stage_file_json.h"
#include "frontend/ir/status.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::pipeline {
namespace {

using json = nlohmann::json;
using partitioner::StageProgram;
using partitioner::ValueLists;

constexpr const char* kFormat = "onnxpipe stage program";
constexpr int kVersion = 1;

// The stage's values and nodes, numbered densely in the training graph's order.
struct Numbering {
  std::map<ir::ValueId, int32_t> value;
  std::map<ir::NodeId, int32_t> node;
  int32_t V(ir::ValueId v) const { return v == ir::kNoValue ? -1 : value.at(v); }
  int32_t N(ir::NodeId n) const { return n == ir::kNoNode ? -1 : node.at(n); }
  json Vs(const std::vector<ir::ValueId>& vs) const {
    json a = json::array();
    for (ir::ValueId v : vs) a.push_back(V(v));
    return a;
  }
  json Ns(const std::vector<ir::NodeId>& ns) const {
    json a = json::array();
    for (ir::NodeId n : ns) a.push_back(N(n));
    return a;
  }
  json Lists(const ValueLists& m) const {
    json o = json::object();
    for (const auto& [peer, vs] : m) o[std::to_string(peer)] = Vs(vs);
    return o;
  }
};

Numbering Number(const StageProgram& sp) {
  const ir::Graph& g = sp.graph;
  std::set<ir::NodeId> nodes;
  for (const std::vector<ir::NodeId>* l : {&sp.forward, &sp.backward, &sp.post}) nodes.insert(l->begin(), l->end());
  std::set<ir::ValueId> values;
  auto add = [&](const std::vector<ir::ValueId>& vs) {
    for (ir::ValueId v : vs)
      if (v != ir::kNoValue) values.insert(v);
  };
  for (ir::NodeId n : nodes) {
    add(g.node(n).inputs);
    add(g.node(n).outputs);
  }
  for (const std::vector<ir::ValueId>* l : {&sp.data_inputs, &sp.step_inputs, &sp.accumulate, &sp.parameters,
                                            &sp.shared_parameters, &g.inputs(), &g.outputs()})
    add(*l);
  add({sp.loss_scale, sp.loss, sp.grad_norm});
  for (const ValueLists* m :
       {&sp.send_forward, &sp.recv_forward, &sp.send_backward, &sp.recv_backward, &sp.send_post, &sp.recv_post})
    for (const auto& [peer, vs] : *m) add(vs);
  for (const ir::Graph::StateUpdate& u : sp.state_updates) add({u.state, u.new_value});
  Numbering n;
  for (ir::ValueId v : values) n.value.emplace(v, static_cast<int32_t>(n.value.size()));
  for (ir::NodeId id : nodes) n.node.emplace(id, static_cast<int32_t>(n.node.size()));
  return n;
}

// A constant: a reference to the model's initializer of its name when it is that tensor, else its own bytes.
json ConstantJson(const ir::Tensor& t, const std::string& name, const ir::Graph& model) {
  const ir::ValueId m = model.FindValue(name);
  if (t.has_data() && m != ir::kNoValue && model.value(m).is_initializer && model.value(m).constant &&
      model.value(m).constant->has_data() && model.value(m).constant->BitwiseEquals(t)) {
    return {{"model", true}, {"crc32c", io::Crc32c(t.raw(), static_cast<size_t>(t.num_bytes()))}};
  }
  return TensorJson(t);
}

json ValueJson(const ir::Value& v, const ir::Graph& model) {
  json shape = json::array();
  for (const ir::Dim& d : v.shape) shape.push_back(DimJson(d));
  json j = {{"name", v.name},
            {"dtype", std::string(ir::DTypeName(v.dtype))},
            {"shape", std::move(shape)},
            {"shape_known", v.shape_known},
            {"initializer", v.is_initializer},
            {"param_state", static_cast<int>(v.param_state)},
            {"exported_as", static_cast<int>(v.exported_as)}};
  if (v.constant) j["constant"] = ConstantJson(*v.constant, v.name, model);
  return j;
}

json NodeJson(const ir::Node& n, const Numbering& num) {
  return {{"op", std::string(ir::OpName(n.op))},
          {"name", n.name},
          {"scope", n.scope},
          {"inputs", num.Vs(n.inputs)},
          {"outputs", num.Vs(n.outputs)},
          {"attrs", AttrsJson(n.attrs)},
          {"phase", static_cast<int>(n.phase)},
          {"origin", n.origin}};
}

json ProgramJson(const StageProgram& sp, const Numbering& num) {
  json parts = json::array(), regions = json::array(), updates = json::array();
  for (const partitioner::BackwardPart& p : sp.parts) parts.push_back({static_cast<int>(p.kind), p.begin, p.end});
  for (const partitioner::RecomputeRegion& r : sp.regions)
    regions.push_back({{"nodes", num.Ns(r.nodes)}, {"before", num.N(r.before)}});
  for (const ir::Graph::StateUpdate& u : sp.state_updates) updates.push_back({num.V(u.state), num.V(u.new_value)});
  return {{"forward", num.Ns(sp.forward)},
          {"backward", num.Ns(sp.backward)},
          {"post", num.Ns(sp.post)},
          {"parts", std::move(parts)},
          {"regions", std::move(regions)},
          {"recompute_clones", num.Ns(sp.recompute_clones)},
          {"cloned_from", num.Ns(sp.cloned_from)},
          {"data_inputs", num.Vs(sp.data_inputs)},
          {"step_inputs", num.Vs(sp.step_inputs)},
          {"loss_scale", num.V(sp.loss_scale)},
          {"send_forward", num.Lists(sp.send_forward)},
          {"recv_forward", num.Lists(sp.recv_forward)},
          {"send_backward", num.Lists(sp.send_backward)},
          {"recv_backward", num.Lists(sp.recv_backward)},
          {"send_post", num.Lists(sp.send_post)},
          {"recv_post", num.Lists(sp.recv_post)},
          {"accumulate", num.Vs(sp.accumulate)},
          {"state_updates", std::move(updates)},
          {"parameters", num.Vs(sp.parameters)},
          {"shared_parameters", num.Vs(sp.shared_parameters)},
          {"loss", num.V(sp.loss)},
          {"grad_norm", num.V(sp.grad_norm)},
          {"graph_inputs", num.Vs(sp.graph.inputs())},
          {"graph_outputs", num.Vs(sp.graph.outputs())}};
}

json StageJson(const partitioner::CompiledPlan& plan, int32_t k, const StageFileSource& src,
               const ProgramFacts& facts) {
  const StageProgram& sp = plan.program.stages[k];
  const Numbering num = Number(sp);
  json values = json::array(), nodes = json::array(), actions = json::array(), all_reduced = json::array();
  for (const auto& [v, i] : num.value) values.push_back(ValueJson(sp.graph.value(v), *src.model));
  for (const auto& [n, i] : num.node) nodes.push_back(NodeJson(sp.graph.node(n), num));
  for (const partitioner::Action& a : plan.actions[k]) actions.push_back(partitioner::ActionToString(a));
  for (const auto& [id, group] : plan.program.all_reduced[k]) all_reduced.push_back({num.N(id), group});
  const ir::Graph& tg = src.training->graph;
  json inputs = json::object();
  for (ir::ValueId v : tg.inputs()) inputs[tg.value(v).name] = std::string(ir::DTypeName(tg.value(v).dtype));
  return {{"format", kFormat},
          {"version", kVersion},
          {"stage", k},
          {"num_stages", plan.program.num_stages},
          {"microbatches", plan.microbatches},
          {"data_parallel", src.data_parallel},
          {"actions", std::move(actions)},
          {"spec", SpecJson(src.spec)},
          {"bindings", tg.symbol_bindings},
          {"values", std::move(values)},
          {"nodes", std::move(nodes)},
          {"program", ProgramJson(sp, num)},
          {"pipeline",
           {{"loss_stage", plan.program.loss_stage},
            {"grad_norm_stage", plan.program.grad_norm_stage},
            {"shared_groups", plan.program.shared_groups},
            {"all_reduced", std::move(all_reduced)}}},
          {"facts", FactsJson(facts)},
          {"trainer",
           {{"input_dtypes", std::move(inputs)},
            {"num_trainable", src.training->num_trainable_parameters()},
            {"num_classes", src.training->num_classes},
            {"unreachable", src.training->unreachable}}}};
}

}  // namespace

std::string StageFilePath(const std::string& dir, int32_t stage) {
  return (std::filesystem::path(dir) / ("stage_" + std::to_string(stage) + ".program")).string();
}

absl::Status WriteStageFiles(const std::string& dir, const partitioner::CompiledPlan& plan,
                             const StageFileSource& source) {
  RET_CHECK(source.training != nullptr && source.model != nullptr);
  ASSIGN_OR_RETURN(const ProgramFacts facts,
                   ProgramFactsOf(source.training->graph, plan.program, plan.microbatches * source.data_parallel));
  for (int32_t k = 0; k < plan.program.num_stages; ++k) {
    const std::vector<uint8_t> cbor = json::to_cbor(StageJson(plan, k, source, facts));
    std::string bytes(reinterpret_cast<const char*>(cbor.data()), cbor.size());
    const uint32_t crc = io::MaskCrc32c(io::Crc32c(bytes));
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
    RETURN_IF_ERROR(io::WriteFileAtomically(StageFilePath(dir, k), bytes));
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
