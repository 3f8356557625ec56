#include "executor/pipeline/stage_file_json.h"

#include <algorithm>
#include <cstring>

#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

using json = nlohmann::json;

json DimJson(const ir::Dim& d) {
  if (d.is_concrete()) return d.value();
  return {{"factor", d.factor()}, {"symbols", d.symbols()}};
}

ir::Dim DimFromJson(const json& j) {
  if (j.is_number_integer()) return ir::Dim(j.get<int64_t>());
  ir::Dim d(j.at("factor").get<int64_t>());
  for (const std::string& s : j.at("symbols").get<std::vector<std::string>>()) d = d * ir::Dim::Symbol(s);
  return d;
}

json TensorJson(const ir::Tensor& t) {
  json j = {{"dtype", std::string(ir::DTypeName(t.dtype()))}, {"dims", t.dims()}};
  if (t.has_data()) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    // All-zero tensors (the optimizer state a run starts from) are written as such, not as their bytes.
    if (std::all_of(p, p + t.num_bytes(), [](uint8_t b) { return b == 0; })) {
      j["zeros"] = true;
    } else {
      j["data"] = json::binary(std::vector<uint8_t>(p, p + t.num_bytes()));
    }
  }
  return j;
}

absl::StatusOr<ir::Tensor> TensorFromJson(const json& j) {
  const std::string name = j.at("dtype").get<std::string>();
  const std::optional<ir::DType> dtype = ir::ParseDType(name);
  if (!dtype) return INVALID_ARGUMENT() << "unknown dtype '" << name << "'";
  const std::vector<int64_t> dims = j.at("dims").get<std::vector<int64_t>>();
  for (int64_t d : dims)
    if (d < 0) return INVALID_ARGUMENT() << "negative dim " << d;
  if (j.contains("zeros")) return ir::Tensor(*dtype, dims);  // zero-filled
  if (!j.contains("data")) return ir::Tensor::DimsOnly(*dtype, dims);
  const std::vector<uint8_t>& bytes = j.at("data").get_binary();
  ir::Tensor t(*dtype, dims);
  if (static_cast<int64_t>(bytes.size()) != t.num_bytes()) {
    return INVALID_ARGUMENT() << "a " << name << " tensor of " << t.num_elements() << " elements holds " << bytes.size()
                              << " bytes";
  }
  if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
  return t;
}

json AttrsJson(const ir::Attrs& a) {
  json o = json::object();
  for (const auto& [name, v] : a.all()) {
    if (const auto* i = std::get_if<int64_t>(&v)) o[name] = {{"i", *i}};
    if (const auto* f = std::get_if<double>(&v)) o[name] = {{"f", *f}};
    if (const auto* s = std::get_if<std::string>(&v)) o[name] = {{"s", *s}};
    if (const auto* is = std::get_if<std::vector<int64_t>>(&v)) o[name] = {{"ints", *is}};
    if (const auto* fs = std::get_if<std::vector<double>>(&v)) o[name] = {{"floats", *fs}};
    if (const auto* t = std::get_if<ir::Tensor>(&v)) o[name] = {{"t", TensorJson(*t)}};
  }
  return o;
}

absl::StatusOr<ir::Attrs> AttrsFromJson(const json& j) {
  ir::Attrs a;
  for (const auto& [name, v] : j.items()) {
    if (v.contains("i")) {
      a.Set(name, v.at("i").get<int64_t>());
    } else if (v.contains("f")) {
      a.Set(name, v.at("f").get<double>());
    } else if (v.contains("s")) {
      a.Set(name, v.at("s").get<std::string>());
    } else if (v.contains("ints")) {
      a.Set(name, v.at("ints").get<std::vector<int64_t>>());
    } else if (v.contains("floats")) {
      a.Set(name, v.at("floats").get<std::vector<double>>());
    } else if (v.contains("t")) {
      ASSIGN_OR_RETURN(ir::Tensor t, TensorFromJson(v.at("t")));
      a.Set(name, std::move(t));
    } else {
      return INVALID_ARGUMENT() << "attribute '" << name << "' has no value of a known kind";
    }
  }
  return a;
}

json SpecJson(const autodiff::TrainingGraphSpec& s) {
  const autodiff::OptimizerOptions& o = s.optimizer;
  return {{"optimizer", o.kind == autodiff::OptimizerKind::kAdamW ? "adamw" : "sgd"},
          {"weight_decay", o.weight_decay},
          {"momentum", o.momentum},
          {"nesterov", o.nesterov},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"clip_norm", o.clip_norm},
          {"logits", s.logits},
          {"labels", s.labels},
          {"freeze", s.freeze_regex},
          {"dtype", std::string(ir::DTypeName(s.dtype))},
          {"dropout", s.dropout},
          {"label_smoothing", s.label_smoothing},
          {"ignore_index", s.ignore_index}};
}

absl::StatusOr<autodiff::TrainingGraphSpec> SpecFromJson(const json& j) {
  autodiff::TrainingGraphSpec s;
  ASSIGN_OR_RETURN(s.optimizer.kind, autodiff::ParseOptimizerKind(j.at("optimizer").get<std::string>()));
  s.optimizer.weight_decay = j.at("weight_decay").get<double>();
  s.optimizer.momentum = j.at("momentum").get<double>();
  s.optimizer.nesterov = j.at("nesterov").get<bool>();
  s.optimizer.beta1 = j.at("beta1").get<double>();
  s.optimizer.beta2 = j.at("beta2").get<double>();
  s.optimizer.eps = j.at("eps").get<double>();
  s.optimizer.clip_norm = j.at("clip_norm").get<double>();
  s.logits = j.at("logits").get<std::string>();
  s.labels = j.at("labels").get<std::string>();
  s.freeze_regex = j.at("freeze").get<std::string>();
  const std::string dtype = j.at("dtype").get<std::string>();
  const std::optional<ir::DType> dt = ir::ParseDType(dtype);
  if (!dt) return INVALID_ARGUMENT() << "spec: unknown dtype '" << dtype << "'";
  s.dtype = *dt;
  s.dropout = j.at("dropout").get<bool>();
  s.label_smoothing = j.at("label_smoothing").get<double>();
  s.ignore_index = j.at("ignore_index").get<int64_t>();
  return s;
}

std::vector<std::string> SpecDifferences(const autodiff::TrainingGraphSpec& a, const autodiff::TrainingGraphSpec& b) {
  // The JSON keys and the train flags that set them (their values print as JSON).
  static const std::pair<const char*, const char*> kFlags[] = {{"optimizer", "--optimizer"},
                                                               {"weight_decay", "--weight-decay"},
                                                               {"momentum", "--momentum"},
                                                               {"nesterov", "--nesterov"},
                                                               {"beta1", "--beta1"},
                                                               {"beta2", "--beta2"},
                                                               {"eps", "--eps"},
                                                               {"clip_norm", "--clip-norm"},
                                                               {"logits", "--logits"},
                                                               {"labels", "--labels"},
                                                               {"freeze", "--freeze"},
                                                               {"dtype", "--dtype"},
                                                               {"dropout", "--dropout"},
                                                               {"label_smoothing", "--label-smoothing"},
                                                               {"ignore_index", "--ignore-index"}};
  const json ja = SpecJson(a), jb = SpecJson(b);
  std::vector<std::string> out;
  for (const auto& [key, flag] : kFlags) {
    if (ja.at(key) != jb.at(key))
      out.push_back(std::string(flag) + " " + ja.at(key).dump() + " vs " + jb.at(key).dump());
  }
  return out;
}

json FactsJson(const ProgramFacts& f) {
  json states = json::object();
  for (const auto& [name, t] : f.state_shapes) states[name] = TensorJson(t);
  const LossShareRule& r = f.loss_rule;
  return {{"loss_rule",
           {{"reduction", r.reduction},
            {"has_ignore_index", r.has_ignore_index},
            {"ignore_index", r.ignore_index},
            {"labels_input", r.labels_input}}},
          {"seed", TensorJson(f.seed_like)},
          {"microbatch_size", f.microbatch_size},
          {"state_shapes", std::move(states)},
          {"parameters", f.parameters}};
}

absl::StatusOr<ProgramFacts> FactsFromJson(const json& j) {
  ProgramFacts f;
  const json& r = j.at("loss_rule");
  f.loss_rule.reduction = r.at("reduction").get<std::string>();
  f.loss_rule.has_ignore_index = r.at("has_ignore_index").get<bool>();
  f.loss_rule.ignore_index = r.at("ignore_index").get<int64_t>();
  f.loss_rule.labels_input = r.at("labels_input").get<std::string>();
  ASSIGN_OR_RETURN(f.seed_like, TensorFromJson(j.at("seed")));
  f.microbatch_size = j.at("microbatch_size").get<int64_t>();
  if (f.microbatch_size < 1) return INVALID_ARGUMENT() << "facts: micro-batch size " << f.microbatch_size;
  for (const auto& [name, t] : j.at("state_shapes").items()) {
    ASSIGN_OR_RETURN(f.state_shapes[name], TensorFromJson(t));
  }
  f.parameters = j.at("parameters").get<std::map<std::string, int32_t>>();
  return f;
}

}  // namespace onnxpipe::pipeline
