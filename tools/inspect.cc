// onnxpipe inspect: what the importer sees in a model, before and after fusion.
#include <cstdio>
#include <iostream>
#include <regex>
#include <set>

#include "frontend/autodiff/trainable.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/model.h"

namespace onnxpipe::tools {
namespace {

using nlohmann::ordered_json;

// The layer a node belongs to: its scope up to the first component that ends in an index
// ("/encoder/layers.3/self_attn" -> "/encoder/layers.3"), else its first component.
std::string LayerScope(const std::string& scope) {
  static const std::regex indexed(R"(.*[._]\d+$)");
  size_t pos = 0;
  std::string first;
  while (pos < scope.size()) {
    size_t next = scope.find('/', pos + 1);
    if (next == std::string::npos) next = scope.size();
    std::string prefix = scope.substr(0, next);
    std::string component = scope.substr(pos + 1, next - pos - 1);
    if (first.empty()) first = prefix;
    if (std::regex_match(component, indexed)) return prefix;
    pos = next;
  }
  return first.empty() ? "(top)" : first;
}

ordered_json DescribeValues(const ir::Graph& g, const std::vector<ir::ValueId>& ids) {
  ordered_json out = ordered_json::array();
  for (ir::ValueId v : ids) {
    const ir::Value& val = g.value(v);
    ordered_json dims = ordered_json::array();
    for (const ir::Dim& d : val.shape) {
      if (d.is_concrete()) {
        dims.push_back(d.value());
      } else {
        dims.push_back(d.ToString());
      }
    }
    out.push_back({{"name", val.name}, {"dtype", ir::DTypeName(val.dtype)}, {"dims", dims}});
  }
  return out;
}

// Parameters: float initializers on which a float graph output depends through float values
// only (a mask buffer read through Equal reaches the outputs as bool, so it is not one) and that the
// trainable-parameter rule does not freeze (`frozen`). Each is counted once even when several nodes
// use it (tied weights) and attributed to the layer of its first consumer.
ordered_json DescribeParameters(const ir::Graph& g, const std::set<ir::ValueId>& frozen) {
  int64_t count = 0, bytes = 0, tensors = 0, shared = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> per_scope;
  std::vector<ir::NodeId> first_use(g.num_values(), -1);
  std::vector<int> consumers(g.num_values(), 0);
  for (ir::NodeId id : g.LiveNodes()) {
    for (ir::ValueId v : g.node(id).inputs) {
      if (v == ir::kNoValue) continue;
      if (first_use[v] < 0) first_use[v] = id;
      ++consumers[v];
    }
  }
  std::vector<bool> reaches(g.num_values(), false);
  std::vector<ir::ValueId> stack;
  for (ir::ValueId v : g.outputs())
    if (ir::IsFloat(g.value(v).dtype) && !reaches[v]) reaches[v] = true, stack.push_back(v);
  while (!stack.empty()) {
    const ir::ValueId v = stack.back();
    stack.pop_back();
    if (g.value(v).producer == ir::kNoNode) continue;
    for (ir::ValueId in : g.node(g.value(v).producer).inputs) {
      if (in == ir::kNoValue || reaches[in] || !ir::IsFloat(g.value(in).dtype)) continue;
      reaches[in] = true;
      stack.push_back(in);
    }
  }
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const ir::Value& val = g.value(v);
    if (!val.is_initializer || !reaches[v] || first_use[v] < 0 || frozen.count(v)) continue;
    const int64_t n = val.constant->num_elements(), b = val.constant->num_bytes();
    count += n;
    bytes += b;
    ++tensors;
    if (consumers[v] > 1) ++shared;
    auto& [sc, sb] = per_scope[LayerScope(g.node(first_use[v]).scope)];
    sc += n;
    sb += b;
  }
  ordered_json scopes = ordered_json::array();
  for (const auto& [scope, cb] : per_scope)
    scopes.push_back({{"scope", scope}, {"count", cb.first}, {"bytes", cb.second}});
  return {{"count", count},   {"bytes", bytes}, {"tensors", tensors},
          {"shared_tensors", shared}, {"per_scope", scopes}};
}

// The trainable-parameter rule's decisions on the imported graph: the frozen float initializers with
// their reason, and the integer/bool ones counted.
ordered_json DescribeFrozen(const ir::Graph& g, const autodiff::TrainableReport& report) {
  ordered_json frozen = ordered_json::array();
  int64_t non_float = 0;
  for (const autodiff::InitializerDecision& d : report.decisions) {
    if (d.reason == autodiff::FreezeReason::kNonFloat) {
      ++non_float;
    } else if (!d.trainable) {
      frozen.push_back({{"name", g.value(d.value).name}, {"reason", autodiff::FreezeReasonKey(d.reason)}});
    }
  }
  ordered_json summary = ordered_json::array();
  for (const std::string& line : report.SummaryLines(g)) summary.push_back(line);
  return {{"trained", report.num_trainable()}, {"frozen", frozen}, {"non_float", non_float}, {"summary", summary}};
}

// Fused ops per layer of the fused graph. A node's layer is its scope's (LayerScope); torch.export
// leaves nodes without scopes, so a scopeless node takes the layer of a parameter it reads when that
// name has an index ("m.model.layers.1.input_layernorm.weight" -> "m.model.layers.1"), a node
// between two nodes of one layer takes that layer, and any other the layer of its first input's
// producer.
ordered_json FusedPerLayer(const ir::Graph& g) {
  static const std::set<ir::OpKind> fused = {ir::OpKind::kAttention,      ir::OpKind::kLayerNorm, ir::OpKind::kRMSNorm,
                                             ir::OpKind::kGelu,           ir::OpKind::kLinear,    ir::OpKind::kRotary,
                                             ir::OpKind::kGatedActivation};
  static const std::regex indexed_param(R"(^(.*?[._]\d+)[._].*$)");
  const std::vector<ir::NodeId> order = g.LiveNodes();
  std::vector<std::string> layer(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const ir::Node& n = g.node(order[i]);
    layer[i] = n.scope.empty() ? "" : LayerScope(n.scope);
    if (!layer[i].empty()) continue;
    for (ir::ValueId v : n.inputs) {
      std::smatch m;
      if (v != ir::kNoValue && g.value(v).is_initializer && std::regex_match(g.value(v).name, m, indexed_param)) {
        layer[i] = m[1];
        break;
      }
    }
  }
  std::vector<std::string> next(order.size() + 1);
  for (size_t i = order.size(); i-- > 0;) next[i] = layer[i].empty() ? next[i + 1] : layer[i];
  std::string prev;
  for (size_t i = 0; i < order.size(); ++i) {
    if (layer[i].empty() && !prev.empty() && next[i] == prev) layer[i] = prev;
    if (!layer[i].empty()) prev = layer[i];
  }
  // Still unknown: the layer of the first input's producer that has one (an encoder's attention
  // between unnamed projections takes its Q projection's layer).
  std::map<ir::NodeId, size_t> position;
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  for (size_t i = 0; i < order.size(); ++i) {
    if (!layer[i].empty()) continue;
    for (ir::ValueId v : g.node(order[i]).inputs) {
      if (v == ir::kNoValue || g.value(v).producer == ir::kNoNode) continue;
      auto it = position.find(g.value(v).producer);
      if (it != position.end() && !layer[it->second].empty()) {
        layer[i] = layer[it->second];
        break;
      }
    }
  }
  ordered_json out = ordered_json::array();
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < order.size(); ++i) {
    const ir::OpKind op = g.node(order[i]).op;
    if (!fused.count(op)) continue;
    const std::string key = layer[i].empty() ? "(top)" : layer[i];
    auto [it, added] = index.emplace(key, out.size());
    if (added) out.push_back({{"layer", key}, {"ops", ordered_json::object()}});
    ordered_json& ops = out[it->second]["ops"];
    const std::string name(ir::OpName(op));
    ops[name] = ops.value(name, int64_t{0}) + 1;
  }
  return out;
}

ordered_json Histogram(const std::map<std::string, int64_t>& h) {
  ordered_json out = ordered_json::object();
  for (const auto& [k, v] : h) out[k] = v;
  return out;
}

std::string FormatBytes(int64_t b) {
  char buf[64];
  if (b >= (int64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(int64_t{1} << 30));
  } else if (b >= (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  }
  return buf;
}

void PrintHistogram(const char* title, const ordered_json& h) {
  std::printf("%s\n", title);
  std::vector<std::pair<int64_t, std::string>> rows;
  for (const auto& [k, v] : h.items()) rows.push_back({v.get<int64_t>(), k});
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (const auto& [n, op] : rows) std::printf("  %-26s %6lld\n", op.c_str(), (long long)n);
}

void PrintText(const ordered_json& j) {
  std::printf("model      %s\n", j["model"].get<std::string>().c_str());
  std::printf("producer   %s\n", j["producer"].get<std::string>().c_str());
  std::printf("opset      %lld (ir_version %lld)\n", (long long)j["opset"].get<int64_t>(),
              (long long)j["ir_version"].get<int64_t>());
  for (const char* io : {"inputs", "outputs"}) {
    std::printf("%s\n", io);
    for (const auto& v : j[io]) {
      std::string dims;
      for (const auto& d : v["dims"]) dims += (dims.empty() ? "" : ", ") + (d.is_string() ? d.get<std::string>() : std::to_string(d.get<int64_t>()));
      std::printf("  %-24s %-5s (%s)\n", v["name"].get<std::string>().c_str(),
                  v["dtype"].get<std::string>().c_str(), dims.c_str());
    }
  }
  std::printf("nodes      %lld in the file", (long long)j["nodes"].get<int64_t>());
  if (j.contains("nodes_after_fusion"))
    std::printf(", %lld after folding and fusion", (long long)j["nodes_after_fusion"].get<int64_t>());
  std::printf("\n");
  PrintHistogram("op histogram (file)", j["op_histogram"]);
  if (j.contains("fused_op_histogram")) PrintHistogram("op histogram (fused)", j["fused_op_histogram"]);
  if (j.contains("fused_per_layer") && !j["fused_per_layer"].empty()) {
    std::printf("fused ops per layer\n");
    for (const auto& l : j["fused_per_layer"]) {
      std::string ops;
      for (const auto& [op, n] : l["ops"].items()) ops += (ops.empty() ? "" : ", ") + op + " " + std::to_string(n.get<int64_t>());
      std::printf("  %-40s %s\n", l["layer"].get<std::string>().c_str(), ops.c_str());
    }
  }
  if (j.contains("trainable")) {
    const auto& t = j["trainable"];
    std::printf("trained initializers %lld; not trained:%s\n", (long long)t["trained"].get<int64_t>(),
                t["summary"].empty() ? " none" : "");
    for (const auto& line : t["summary"]) std::printf("  %s\n", line.get<std::string>().c_str());
  }
  if (j.contains("parameters")) {
    const auto& p = j["parameters"];
    std::printf("parameters %lld (%s) in %lld tensors, %lld shared by several nodes\n",
                (long long)p["count"].get<int64_t>(), FormatBytes(p["bytes"].get<int64_t>()).c_str(),
                (long long)p["tensors"].get<int64_t>(), (long long)p["shared_tensors"].get<int64_t>());
    for (const auto& s : p["per_scope"])
      std::printf("  %-40s %12lld  %s\n", s["scope"].get<std::string>().c_str(),
                  (long long)s["count"].get<int64_t>(), FormatBytes(s["bytes"].get<int64_t>()).c_str());
  }
  if (!j["unsupported_ops"].empty()) {
    std::printf("unsupported ops\n");
    for (const auto& u : j["unsupported_ops"])
      std::printf("  %-24s node '%s'\n", u["op"].get<std::string>().c_str(), u["node"].get<std::string>().c_str());
  }
  for (const auto& w : j["warnings"]) std::printf("warning: %s\n", w.get<std::string>().c_str());
}

}  // namespace

int RunInspect(const Args& args) {
  int64_t batch = 0, seq = 0;
  bool json = false, check = false, no_fuse = false;
  FlagSet flags("inspect", "MODEL.onnx [--batch B --seq S] [--json] [--check]",
                "Imports MODEL and prints its producer, opsets, inputs and outputs, the op histogram\n"
                "before and after folding and fusion, parameters per layer (tied weights counted\n"
                "once) and any unsupported ops. Binding --batch/--seq folds the shape arithmetic.");
  flags.Int("batch", &batch, "bind the symbolic batch dim (dim 0 of the inputs)");
  flags.Int("seq", &seq, "bind the symbolic sequence dim (dim 1 of the inputs)");
  flags.Bool("json", &json, "print JSON instead of text");
  flags.Bool("check", &check, "exit with status 1 if the model has unsupported ops");
  flags.Bool("no-fusion", &no_fuse, "skip folding and fusion");
  if (absl::Status st = flags.Parse(args); !st.ok()) return Fail("inspect", std::string(st.message()), 2);
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (flags.positional().size() != 1)
    return Fail("inspect", "expected exactly one MODEL.onnx argument (see --help)", 2);
  if (batch < 0 || seq < 0) return Fail("inspect", "--batch and --seq must be positive", 2);
  const std::string path = flags.positional()[0];

  ModelOptions options;
  options.batch = batch;
  options.seq = seq;
  options.fuse = !no_fuse;
  options.allow_unsupported = true;
  absl::StatusOr<Model> model = LoadModel(path, options);
  if (!model.ok()) return Fail("inspect", std::string(model.status().message()));

  const auto& s = model->summary;
  ordered_json j;
  j["model"] = path;
  j["producer"] = s.producer_name + (s.producer_version.empty() ? "" : " " + s.producer_version);
  j["ir_version"] = s.ir_version;
  j["opset"] = s.opset_imports.count("") ? s.opset_imports.at("") : 0;
  j["opset_imports"] = ordered_json::object();
  for (const auto& [d, v] : s.opset_imports) j["opset_imports"][d.empty() ? "ai.onnx" : d] = v;
  if (model->imported) {
    j["inputs"] = DescribeValues(model->graph ? *model->graph : *model->imported, model->imported->inputs());
    j["outputs"] = DescribeValues(model->graph ? *model->graph : *model->imported, model->imported->outputs());
  } else {
    j["inputs"] = ordered_json::array();
    j["outputs"] = ordered_json::array();
  }
  j["bindings"] = model->bindings;
  j["nodes"] = s.num_nodes;
  j["op_histogram"] = Histogram(s.op_histogram);
  if (model->graph) {
    j["nodes_after_fusion"] = model->graph->num_live_nodes();
    j["fused_op_histogram"] = Histogram(OpHistogram(*model->graph));
    j["fused_per_layer"] = FusedPerLayer(*model->graph);
  }
  if (model->imported) {
    absl::StatusOr<autodiff::TrainableReport> report = autodiff::DecideTrainable(*model->imported);
    if (!report.ok()) return Fail("inspect", std::string(report.status().message()));
    std::set<ir::ValueId> frozen;
    for (const autodiff::InitializerDecision& d : report->decisions)
      if (!d.trainable) frozen.insert(d.value);
    j["trainable"] = DescribeFrozen(*model->imported, *report);
    j["parameters"] = DescribeParameters(*model->imported, frozen);
  }
  j["unsupported_ops"] = ordered_json::array();
  for (const auto& u : s.unsupported)
    j["unsupported_ops"].push_back({{"node", u.node_name}, {"op", u.op_type}, {"domain", u.domain}});
  j["warnings"] = model->warnings;

  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    PrintText(j);
  }
  if (check && !s.unsupported.empty()) return 1;
  return 0;
}

}  // namespace onnxpipe::tools
