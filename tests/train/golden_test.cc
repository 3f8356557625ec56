// The trainer against PyTorch: for every shipped model's golden (models/golden/<model>.json, written
// by models/torch_reference.py), train with the same data, hyper-parameters and dtype, dropout off,
// and match the per-step losses and gradient norms (1e-7 relative in fp64, 1e-4 in fp32) and the
// final values of the recorded parameters (and, for the tied GPT embedding, two of its rows).
// tiny_gpt has tied weights and a per-token loss with ignored positions; tiny_bert an attention
// mask input; tiny_classifier a frozen float buffer.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "executor/train/trainer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/model.h"

namespace onnxpipe {
namespace {

using nlohmann::json;

json ReadJson(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return json::parse(f);
}

struct GoldenCase {
  std::string model;
  int run;  // index into the golden's runs: sgd/f64, sgd/f32, adamw/f64, adamw/f32
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

// |got - want| <= tol * max(|want|, floor): relative, with an absolute floor for values near 0.
void ExpectClose(double got, double want, double tol, double floor, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::max(std::abs(want), floor))
      << what << ": got " << got << ", PyTorch " << want;
}

// Runs a command and returns its stdout.
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0) << cmd;
  return out;
}

TEST_P(GoldenTest, MatchesPyTorch) {
  const GoldenCase& c = GetParam();
  const std::string src = ONNXPIPE_SOURCE_DIR;
  const json golden = ReadJson(src + "/models/golden/" + c.model + ".json");
  const json sidecar = ReadJson(src + "/models/" + c.model + ".json");
  const json& run = golden["runs"][c.run];
  const bool fp64 = run["dtype"] == "float64";
  const double tol = fp64 ? 1e-7 : 1e-4;
  const int64_t batch = golden["batch"].get<int64_t>();
  const int steps = golden["steps"].get<int>();

  absl::StatusOr<tools::Model> model =
      tools::ImportModel(src + "/models/" + c.model + ".onnx", /*allow_unsupported=*/false);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string logits = golden["loss"]["logits"], labels = golden["loss"]["labels"];
  absl::StatusOr<std::vector<train::FieldSpec>> fields =
      train::DataFields(*model->imported, logits, labels);
  ASSERT_TRUE(fields.ok()) << fields.status();
  std::map<std::string, int64_t> bindings;
  const std::string data_dir = src + "/models/golden/" + golden["data"]["dir"].get<std::string>();
  absl::StatusOr<train::Dataset> data = train::Dataset::Load(data_dir, *fields, batch, &bindings);
  ASSERT_TRUE(data.ok()) << data.status();
  tools::ModelOptions mo;
  mo.batch = batch;
  mo.extra_dims = tools::NonBatchBindings(*model->imported, bindings);
  ASSERT_TRUE(tools::PrepareModel(*model, mo).ok());

  train::TrainOptions o;
  o.batch = batch;
  o.steps = steps;
  const json& h = run["hyperparams"];
  o.lr = h["lr"].get<double>();
  o.optimizer.weight_decay = h["weight_decay"].get<double>();
  if (run["optimizer"] == "sgd") {
    ASSERT_EQ(h["dampening"].get<double>(), 0.0);
    o.optimizer.kind = autodiff::OptimizerKind::kSGD;
    o.optimizer.momentum = h["momentum"].get<double>();
    o.optimizer.nesterov = h["nesterov"].get<bool>();
  } else {
    ASSERT_FALSE(h["amsgrad"].get<bool>());
    o.optimizer.kind = autodiff::OptimizerKind::kAdamW;
    o.optimizer.beta1 = h["betas"][0].get<double>();
    o.optimizer.beta2 = h["betas"][1].get<double>();
    o.optimizer.eps = h["eps"].get<double>();
  }
  o.logits = logits;
  o.labels = labels;
  o.ignore_index = golden["loss"]["ignore_index"].get<int64_t>();
  if (sidecar["freeze_regex"].is_string()) o.freeze_regex = sidecar["freeze_regex"];
  o.dtype = fp64 ? ir::DType::kF64 : ir::DType::kF32;
  o.dropout = false;
  absl::StatusOr<train::Trainer> trainer = train::Trainer::Create(*model->graph, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE(trainer->SetData(*std::move(data)).ok());

  // The trainable set is PyTorch's (a tied parameter once, buffers frozen).
  std::set<std::string> want_trainable, got_trainable;
  for (const auto& n : golden["trainable"]) want_trainable.insert(n.get<std::string>());
  for (const auto& [name, t] : trainer->Parameters()) got_trainable.insert(name);
  EXPECT_EQ(got_trainable, want_trainable);
  EXPECT_EQ(trainer->num_trainable_parameters(), golden["trainable_count"].get<int64_t>());

  if (fp64 && run["optimizer"] == "sgd") {
    // Step 0's gradient of every parameter against PyTorch (tests/train/torch_grads.py): when a
    // loss drifts, this names the parameter whose gradient is off.
    const json want = json::parse(Capture(std::string(ONNXPIPE_PYTHON) + " " + src +
                                          "/tests/train/torch_grads.py " + src + "/models/" +
                                          c.model + ".onnx " + data_dir + " --batch " +
                                          std::to_string(batch)));
    absl::StatusOr<std::map<std::string, ir::Tensor>> grads = trainer->Gradients();
    ASSERT_TRUE(grads.ok()) << grads.status();
    for (const auto& [name, w] : want["grads"].items()) {
      ASSERT_TRUE(grads->count(name)) << name;
      const ir::Tensor& g = grads->at(name);
      double sq = 0, sum = 0;
      for (int64_t i = 0; i < g.num_elements(); ++i) {
        sq += g.GetAsDouble(i) * g.GetAsDouble(i);
        sum += g.GetAsDouble(i);
      }
      ExpectClose(std::sqrt(sq), w["norm"].get<double>(), tol, 1e-3, "grad norm of " + name);
      ExpectClose(sum, w["sum"].get<double>(), tol, 1e-3, "grad sum of " + name);
      for (size_t i = 0; i < w["head"].size(); ++i) {
        ExpectClose(g.GetAsDouble(i), w["head"][i].get<double>(), tol, 1e-3,
                    "grad " + name + "[" + std::to_string(i) + "]");
      }
    }
  }

  for (int k = 0; k < steps; ++k) {
    absl::StatusOr<train::StepMetrics> m = trainer->Step();
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectClose(m->loss, run["losses"][k].get<double>(), tol, 0, "loss of step " + std::to_string(k));
    ExpectClose(m->grad_norm, run["grad_norms"][k].get<double>(), tol, 0,
                "grad_norm of step " + std::to_string(k));
  }
  const std::map<std::string, ir::Tensor> params = trainer->Parameters();
  for (const auto& [name, values] : run["final"].items()) {
    ASSERT_TRUE(params.count(name)) << name;
    const ir::Tensor& t = params.at(name);
    ASSERT_EQ(t.num_elements(), static_cast<int64_t>(values.size())) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      ExpectClose(t.GetAsDouble(i), values[i].get<double>(), tol, 1.0,
                  "final " + name + "[" + std::to_string(i) + "]");
    }
  }
  if (run.contains("final_rows")) {
    for (const auto& [name, rec] : run["final_rows"].items()) {
      const ir::Tensor& t = params.at(name);
      const int64_t width = t.dims().back();
      for (size_t r = 0; r < rec["rows"].size(); ++r) {
        const int64_t row = rec["rows"][r].get<int64_t>();
        for (int64_t i = 0; i < width; ++i) {
          ExpectClose(t.GetAsDouble(row * width + i), rec["values"][r][i].get<double>(), tol, 1.0,
                      name + " row " + std::to_string(row) + "[" + std::to_string(i) + "]");
        }
      }
    }
  }
}

// Label smoothing and the per-token ignore index on tiny_gpt: step 0's loss and gradients against
// PyTorch's cross_entropy(label_smoothing=0.1, ignore_index=-100) in fp64.
TEST(LabelSmoothing, MatchesPyTorchOnTinyGpt) {
  const std::string src = ONNXPIPE_SOURCE_DIR;
  const std::string data_dir = src + "/models/golden/tiny_gpt/data";
  absl::StatusOr<tools::Model> model = tools::ImportModel(src + "/models/tiny_gpt.onnx", false);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::vector<train::FieldSpec>> fields =
      train::DataFields(*model->imported, "logits", "labels");
  ASSERT_TRUE(fields.ok()) << fields.status();
  std::map<std::string, int64_t> bindings;
  absl::StatusOr<train::Dataset> data = train::Dataset::Load(data_dir, *fields, 4, &bindings);
  ASSERT_TRUE(data.ok()) << data.status();
  tools::ModelOptions mo;
  mo.batch = 4;
  mo.seq = bindings.at("S");
  ASSERT_TRUE(tools::PrepareModel(*model, mo).ok());
  train::TrainOptions o;
  o.batch = 4;
  o.steps = 1;
  o.lr = 0.01;
  o.logits = "logits";
  o.freeze_regex = "attn\\.mask$";
  o.dtype = ir::DType::kF64;
  o.dropout = false;
  o.label_smoothing = 0.1;
  absl::StatusOr<train::Trainer> trainer = train::Trainer::Create(*model->graph, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE(trainer->SetData(*std::move(data)).ok());
  const json want = json::parse(Capture(std::string(ONNXPIPE_PYTHON) + " " + src +
                                        "/tests/train/torch_grads.py " + src +
                                        "/models/tiny_gpt.onnx " + data_dir +
                                        " --batch 4 --label-smoothing 0.1"));
  absl::StatusOr<std::map<std::string, ir::Tensor>> grads = trainer->Gradients();
  ASSERT_TRUE(grads.ok()) << grads.status();
  for (const auto& [name, w] : want["grads"].items()) {
    const ir::Tensor& g = grads->at(name);
    double sq = 0;
    for (int64_t i = 0; i < g.num_elements(); ++i) sq += g.GetAsDouble(i) * g.GetAsDouble(i);
    ExpectClose(std::sqrt(sq), w["norm"].get<double>(), 1e-7, 1e-3, "grad norm of " + name);
  }
  absl::StatusOr<train::StepMetrics> m = trainer->Step();
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectClose(m->loss, want["loss"].get<double>(), 1e-7, 0, "smoothed loss");
}

std::vector<GoldenCase> Cases() {
  std::vector<GoldenCase> cases;
  for (const char* m : {"tiny_classifier", "tiny_gpt", "tiny_bert"})
    for (int r = 0; r < 4; ++r) cases.push_back({m, r});
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<GoldenCase>& info) {
  static const char* kRuns[] = {"sgd_fp64", "sgd_fp32", "adamw_fp64", "adamw_fp32"};
  return info.param.model + "_" + kRuns[info.param.run];
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest, ::testing::ValuesIn(Cases()), CaseName);

}  // namespace
}  // namespace onnxpipe
