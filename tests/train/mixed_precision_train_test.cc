// `--dtype bf16` training (passes/mixed_precision.h on the trainer's graph, the CPU backend's half
// evaluation) on the shipped models, against independent references:
//   - 5 steps of SGD and AdamW: every loss within 2e-2 relative of PyTorch's fp32 run (the goldens of
//     models/golden/, written by models/torch_reference.py);
//   - step 0's parameter gradients against the fp64 run's (itself PyTorch's to 1e-7, golden_test.cc) by
//     normalised error, and their norms against PyTorch's bf16 autocast (tests/train/torch_grads.py);
//   - the training graph's structure: the loss, gradients and optimizer in f32, the fused ops on bf16.
#include <cmath>
#include <cstdio>
#include <fstream>

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

// A shipped model bound to its golden's batch, its golden data, and the golden's run `run` as
// TrainOptions (dropout off) in `dtype`.
struct Golden {
  json golden;
  std::optional<tools::Model> model;
  std::optional<train::Dataset> data;
  std::string data_dir;
};

Golden LoadGolden(const std::string& name) {
  const std::string src = ONNXPIPE_SOURCE_DIR;
  Golden g;
  g.golden = ReadJson(src + "/models/golden/" + name + ".json");
  absl::StatusOr<tools::Model> model = tools::ImportModel(src + "/models/" + name + ".onnx", false);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return g;
  const int64_t batch = g.golden["batch"].get<int64_t>();
  absl::StatusOr<std::vector<train::FieldSpec>> fields =
      train::DataFields(*model->imported, g.golden["loss"]["logits"], g.golden["loss"]["labels"]);
  EXPECT_TRUE(fields.ok()) << fields.status();
  std::map<std::string, int64_t> bindings;
  g.data_dir = src + "/models/golden/" + g.golden["data"]["dir"].get<std::string>();
  absl::StatusOr<train::Dataset> data = train::Dataset::Load(g.data_dir, *fields, batch, &bindings);
  EXPECT_TRUE(data.ok()) << data.status();
  tools::ModelOptions mo;
  mo.batch = batch;
  mo.extra_dims = tools::NonBatchBindings(*model->imported, bindings);
  EXPECT_TRUE(tools::PrepareModel(*model, mo).ok());
  g.model = std::move(*model);
  g.data = std::move(*data);
  return g;
}

train::TrainOptions Options(const Golden& g, const std::string& model, int run, ir::DType dtype) {
  const json& r = g.golden["runs"][run];
  const json& h = r["hyperparams"];
  train::TrainOptions o;
  o.batch = g.golden["batch"].get<int64_t>();
  o.steps = g.golden["steps"].get<int64_t>();
  o.lr = h["lr"].get<double>();
  o.optimizer.weight_decay = h["weight_decay"].get<double>();
  if (r["optimizer"] == "sgd") {
    o.optimizer.kind = autodiff::OptimizerKind::kSGD;
    o.optimizer.momentum = h["momentum"].get<double>();
    o.optimizer.nesterov = h["nesterov"].get<bool>();
  } else {
    o.optimizer.kind = autodiff::OptimizerKind::kAdamW;
    o.optimizer.beta1 = h["betas"][0].get<double>();
    o.optimizer.beta2 = h["betas"][1].get<double>();
    o.optimizer.eps = h["eps"].get<double>();
  }
  o.logits = g.golden["loss"]["logits"];
  o.labels = g.golden["loss"]["labels"];
  o.ignore_index = g.golden["loss"]["ignore_index"].get<int64_t>();
  const json sidecar = ReadJson(std::string(ONNXPIPE_SOURCE_DIR) + "/models/" + model + ".json");
  if (sidecar["freeze_regex"].is_string()) o.freeze_regex = sidecar["freeze_regex"];
  o.dtype = dtype;
  o.dropout = false;
  return o;
}

absl::StatusOr<train::Trainer> MakeTrainer(const Golden& g, const train::TrainOptions& o) {
  absl::StatusOr<train::Trainer> t = train::Trainer::Create(*g.model->graph, o);
  if (t.ok()) RETURN_IF_ERROR(t->SetData(*g.data));
  return t;
}

struct Case {
  std::string model;
  int run;  // the golden's fp32 runs: 1 sgd, 3 adamw
};

class Bf16TrainingTest : public ::testing::TestWithParam<Case> {};

TEST_P(Bf16TrainingTest, LossesWithin2PercentOfPyTorchFp32) {
  const Case& c = GetParam();
  const Golden g = LoadGolden(c.model);
  ASSERT_TRUE(g.model && g.data);
  const json& run = g.golden["runs"][c.run];
  ASSERT_EQ(run["dtype"], "float32");
  absl::StatusOr<train::Trainer> t = MakeTrainer(g, Options(g, c.model, c.run, ir::DType::kBF16));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_trainable_parameters(), g.golden["trainable_count"].get<int64_t>());
  for (int k = 0; k < g.golden["steps"].get<int>(); ++k) {
    absl::StatusOr<train::StepMetrics> m = t->Step();
    ASSERT_TRUE(m.ok()) << m.status();
    const double want = run["losses"][k].get<double>();
    EXPECT_LE(std::abs(m->loss - want), 2e-2 * std::abs(want)) << "step " << k << ": bf16 " << m->loss
                                                               << ", PyTorch fp32 " << want;
  }
  // The masters and the optimizer state stay f32, but for the compute copies: each its master cast to bf16.
  const std::map<std::string, ir::Tensor> state = t->State();
  for (const auto& [name, s] : state) {
    if (s.dtype() == ir::DType::kF32) continue;
    EXPECT_EQ(s.dtype(), ir::DType::kBF16) << name;
    ASSERT_TRUE(name.ends_with("/compute_bf16")) << name;
    const std::string master = name.substr(0, name.size() - 13);
    ASSERT_TRUE(state.count(master)) << name;
    EXPECT_TRUE(s.BitwiseEquals(state.at(master).CastTo(ir::DType::kBF16))) << name;
  }
}

// The compute copies (OptimizerOptions::compute_copies): no Cast of a trained parameter is left, each parameter's
// update writes its copy, and training is bit for bit that of the graph with a Cast per use (tiny_gpt: a tied
// embedding read by the lookup and the output projection; SGD with momentum and AdamW).
TEST(Bf16TrainingGraph, ComputeCopiesTrainAsTheCastsDo) {
  const Golden g = LoadGolden("tiny_gpt");
  ASSERT_TRUE(g.model && g.data);
  for (const int run : {1, 3}) {
    train::TrainOptions o = Options(g, "tiny_gpt", run, ir::DType::kBF16);
    absl::StatusOr<train::Trainer> copies = MakeTrainer(g, o);
    o.optimizer.compute_copies = false;
    absl::StatusOr<train::Trainer> casts = MakeTrainer(g, o);
    ASSERT_TRUE(copies.ok() && casts.ok()) << copies.status() << casts.status();
    const ir::Graph& graph = copies->graph();
    const std::map<std::string, ir::Tensor> params = copies->Parameters();
    int written = 0;
    for (ir::NodeId id : graph.LiveNodes()) {
      const ir::Node& n = graph.node(id);
      if (n.op == ir::OpKind::kCast) {
        EXPECT_FALSE(params.count(graph.value(n.inputs[0]).name)) << n.name << " casts a trained parameter";
      }
      const int k = ir::UpdateComputeCopyOutput(n.op);
      if (k >= 0 && k < static_cast<int>(n.outputs.size()) && n.outputs[k] != ir::kNoValue) ++written;
    }
    EXPECT_EQ(written, static_cast<int>(params.size())) << "run " << run;
    for (int step = 0; step < 4; ++step) {
      absl::StatusOr<train::StepMetrics> a = copies->Step(), b = casts->Step();
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
      EXPECT_EQ(a->loss, b->loss) << "run " << run << " step " << step;
      EXPECT_EQ(a->grad_norm, b->grad_norm) << "run " << run << " step " << step;
    }
    const std::map<std::string, ir::Tensor> got = copies->Parameters(), want = casts->Parameters();
    for (const auto& [name, p] : want) EXPECT_TRUE(got.at(name).BitwiseEquals(p)) << name;
    for (const auto& [name, s] : copies->State()) {
      if (!name.ends_with("/compute_bf16")) continue;
      EXPECT_TRUE(s.BitwiseEquals(got.at(name.substr(0, name.size() - 13)).CastTo(ir::DType::kBF16))) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16TrainingTest,
                         ::testing::Values(Case{"tiny_classifier", 1}, Case{"tiny_classifier", 3},
                                           Case{"tiny_gpt", 1}, Case{"tiny_gpt", 3}, Case{"tiny_bert", 1},
                                           Case{"tiny_bert", 3}),
                         [](const auto& info) {
                           return info.param.model + (info.param.run == 1 ? "_sgd" : "_adamw");
                         });

class Bf16GradientTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Bf16GradientTest, AgainstFp64AndPyTorchAutocast) {
  const std::string& name = GetParam();
  const Golden g = LoadGolden(name);
  ASSERT_TRUE(g.model && g.data);
  absl::StatusOr<train::Trainer> bf16 = MakeTrainer(g, Options(g, name, 1, ir::DType::kBF16));
  absl::StatusOr<train::Trainer> fp64 = MakeTrainer(g, Options(g, name, 1, ir::DType::kF64));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_TRUE(fp64.ok()) << fp64.status();
  absl::StatusOr<std::map<std::string, ir::Tensor>> got = bf16->Gradients();
  absl::StatusOr<std::map<std::string, ir::Tensor>> want = fp64->Gradients();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  // bf16 keeps 8 significant bits (relative rounding 2^-9): each op's output is off by ~2e-3, and
  // a few layers of them leave the gradients ~1e-2 off, a normalised error of ~1e-4 over the model.
  // A parameter's own error is checked where its gradient is above rounding level (1e-3 of the
  // global norm): an attention key bias's exact gradient is 0 (softmax is shift invariant), so
  // either run holds only its rounding there.
  double total_num = 0, total_den = 0, worst = 0;
  std::map<std::string, double> sq_norm;  // of the fp64 gradients
  for (const auto& [p, w] : *want) {
    for (int64_t i = 0; i < w.num_elements(); ++i) sq_norm[p] += w.GetAsDouble(i) * w.GetAsDouble(i);
    total_den += sq_norm[p];
  }
  for (const auto& [p, w] : *want) {
    const ir::Tensor& a = got->at(p);
    EXPECT_EQ(a.dtype(), ir::DType::kF32) << p;
    double num = 0;
    for (int64_t i = 0; i < w.num_elements(); ++i) num += std::pow(a.GetAsDouble(i) - w.GetAsDouble(i), 2);
    total_num += num;
    if (sq_norm[p] < 1e-6 * total_den) continue;
    EXPECT_LT(num / sq_norm[p], 5e-3) << "gradient of " << p;
    worst = std::max(worst, num / sq_norm[p]);
  }
  EXPECT_LT(total_num / total_den, 1e-3);
  // The run computes in bf16 indeed: an fp32 run's error would be ~1e-12.
  EXPECT_GT(total_num / total_den, 1e-9);
  std::printf("%s: bf16 gradients, normalised error against fp64: all %.3g, worst parameter %.3g\n", name.c_str(),
              total_num / total_den, worst);

  const std::string src = ONNXPIPE_SOURCE_DIR;
  const json torch = json::parse(Capture(std::string(ONNXPIPE_PYTHON) + " " + src + "/tests/train/torch_grads.py " +
                                         src + "/models/" + name + ".onnx " + g.data_dir + " --batch " +
                                         std::to_string(g.golden["batch"].get<int64_t>()) +
                                         " --dtype float32 --autocast"));
  // Both bf16 runs hold their own rounding (PyTorch's CPU autocast kernels round differently on different
  // processors): onnxpipe's norm is within 2% of the exact (fp64) one, or no further from it than twice PyTorch's.
  double worst_norm = 0;
  for (const auto& [p, w] : torch["grads"].items()) {
    ASSERT_TRUE(got->count(p)) << p;
    if (sq_norm[p] < 1e-6 * total_den) continue;
    const ir::Tensor& a = got->at(p);
    double sq = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i) sq += a.GetAsDouble(i) * a.GetAsDouble(i);
    const double norm = w["norm"].get<double>(), exact = std::sqrt(sq_norm[p]);
    const double ours = std::abs(std::sqrt(sq) - exact), theirs = std::abs(norm - exact);
    EXPECT_LE(ours, std::max(2e-2 * std::max(exact, 1e-3), 2 * theirs))
        << "gradient norm of " << p << ": onnxpipe bf16 " << std::sqrt(sq) << ", PyTorch autocast " << norm
        << ", fp64 " << exact;
    worst_norm = std::max(worst_norm, std::abs(std::sqrt(sq) - norm) / norm);
  }
  std::printf("%s: gradient norms against PyTorch autocast: worst relative difference %.3g\n", name.c_str(),
              worst_norm);
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16GradientTest, ::testing::Values("tiny_classifier", "tiny_gpt", "tiny_bert"));

// tiny_gpt's training graph in bf16: the fusions fire and read bf16, the loss reads the bf16 logits, every
// optimizer update reads an f32 parameter and an f32 gradient, and the tied embedding's gradient sums
// f32 contributions that come out of its uses' Casts.
TEST(Bf16TrainingGraph, LossGradientsAndOptimizerInF32) {
  const Golden g = LoadGolden("tiny_gpt");
  ASSERT_TRUE(g.model && g.data);
  absl::StatusOr<train::Trainer> t = MakeTrainer(g, Options(g, "tiny_gpt", 3, ir::DType::kBF16));
  ASSERT_TRUE(t.ok()) << t.status();
  const ir::Graph& graph = t->graph();
  std::map<ir::OpKind, int> fused;
  int updates = 0, losses = 0, f32_gemms = 0;
  for (ir::NodeId id : graph.LiveNodes()) {
    const ir::Node& n = graph.node(id);
    auto dtype = [&](int i) { return graph.value(n.inputs[i]).dtype; };
    switch (n.op) {
      case ir::OpKind::kAttention:
      case ir::OpKind::kLayerNorm:
      case ir::OpKind::kGelu:
      case ir::OpKind::kLinear:
        ++fused[n.op];
        EXPECT_EQ(dtype(0), ir::DType::kBF16) << n.name;
        break;
      case ir::OpKind::kFusedMatMul:  // a weight gradient GEMM writing its f32 master's gradient (CastIntoGemm)
        if (!n.attrs.Has("to")) break;
        ++f32_gemms;
        EXPECT_EQ(dtype(0), ir::DType::kBF16) << n.name;
        EXPECT_EQ(graph.value(n.outputs[0]).dtype, ir::DType::kF32) << n.name;
        break;
      case ir::OpKind::kSoftmaxCrossEntropyLoss:  // reads the bf16 logits, computes (and is) f32
        ++losses;
        EXPECT_EQ(dtype(0), ir::DType::kBF16) << n.name;
        EXPECT_EQ(graph.value(n.outputs[0]).dtype, ir::DType::kF32) << n.name;
        break;
      case ir::OpKind::kSoftmaxCrossEntropyLossGrad:  // the logits' gradient in bf16, from their Stats
        EXPECT_EQ(dtype(1), ir::DType::kBF16) << n.name;
        EXPECT_EQ(graph.value(n.outputs[0]).dtype, ir::DType::kBF16) << n.name;
        break;
      case ir::OpKind::kAdamWUpdate:
        ++updates;
        EXPECT_EQ(dtype(0), ir::DType::kF32) << n.name;
        EXPECT_EQ(dtype(1), ir::DType::kF32) << n.name;
        break;
      default:
        break;
    }
  }
  EXPECT_GT(fused[ir::OpKind::kAttention], 0);
  EXPECT_GT(fused[ir::OpKind::kLayerNorm], 0);
  EXPECT_GT(fused[ir::OpKind::kGelu], 0);
  EXPECT_GT(fused[ir::OpKind::kLinear], 0);
  EXPECT_GT(f32_gemms, 0);
  EXPECT_EQ(losses, 1);
  EXPECT_EQ(updates, t->Parameters().size());
  // The tied embedding (read by the token lookup and the output projection).
  const ir::ValueId grad = graph.FindValue("grad/tok_emb.weight");
  ASSERT_NE(grad, ir::kNoValue);
  const ir::Node& sum = graph.node(graph.value(grad).producer);
  ASSERT_EQ(sum.op, ir::OpKind::kSum);
  EXPECT_EQ(sum.inputs.size(), 2u);
  for (ir::ValueId c : sum.inputs) {
    EXPECT_EQ(graph.value(c).dtype, ir::DType::kF32);
    // A Cast of the bf16 contribution, or the weight-gradient GEMM writing f32 itself (CastIntoGemm).
    const ir::Node& p = graph.node(graph.value(c).producer);
    EXPECT_TRUE(p.op == ir::OpKind::kCast || (p.op == ir::OpKind::kFusedMatMul && p.attrs.Has("to")))
        << graph.value(c).name << " from " << ir::OpName(p.op);
  }
}

}  // namespace
}  // namespace onnxpipe
