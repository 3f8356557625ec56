// End to end on the shipped models (models/tiny_*.onnx, PyTorch exports): import, bind B and S,
// fold and fuse (so the fused Linear/LayerNorm/Gelu/Attention rules and the primitive rules of
// whatever stays unfused are exercised on real exports), add the model's cross-entropy loss, build
// the gradients and compare sampled elements of every parameter's gradient with central
// differences, in fp64 with dropout active (the masks replay identically in both graphs).
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/verifier.h"
#include "frontend/onnx/loader.h"
#include "frontend/passes/pipeline.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

// (model, fuse): unfused, the primitive rules run on the exports' decomposed attention,
// LayerNorm and GELU chains.
class ModelGradTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  std::string Model() const { return std::get<0>(GetParam()); }
  bool Fuse() const { return std::get<1>(GetParam()); }
};

TEST_P(ModelGradTest, GradientsMatchFiniteDifferences) {
  const std::string base = std::string(ONNXPIPE_SOURCE_DIR) + "/models/" + Model();
  nlohmann::json sidecar = nlohmann::json::parse(std::ifstream(base + ".json"));
  auto loaded = onnx_frontend::LoadOnnxModel(base + ".onnx");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->graph.has_value());
  ir::Graph g = std::move(*loaded->graph);
  const int64_t batch = 2, seq = 6;
  ASSERT_TRUE(ir::InferShapes(g).ok());
  ASSERT_TRUE(ir::BindSymbols(g, {{"B", batch}, {"S", seq}}).ok());
  ASSERT_TRUE(ir::InferShapes(g).ok());
  ASSERT_TRUE(ir::ConvertFloatPrecision(g, ir::DType::kF32, ir::DType::kF64).ok());
  cpu::CpuEvaluator folder;
  passes::PipelineOptions popts;
  popts.fuse = Fuse();
  absl::Status piped = passes::RunForwardPipeline(&g, folder, popts);
  ASSERT_TRUE(piped.ok()) << piped;

  // The fused ops whose rules this test is meant to exercise are there.
  std::map<ir::OpKind, int> histogram;
  for (ir::NodeId id : g.LiveNodes()) ++histogram[g.node(id).op];
  // (Opset-17 LayerNormalization imports to LayerNorm whether or not fusion runs.)
  EXPECT_GT(histogram[ir::OpKind::kLayerNorm], 0);
  for (ir::OpKind op : {ir::OpKind::kLinear, ir::OpKind::kAttention}) {
    EXPECT_EQ(histogram[op] > 0, Fuse()) << Model() << ": " << histogram[op] << " " << ir::OpName(op);
  }
  std::string ops;
  for (const auto& [op, n] : histogram) ops += std::string(ir::OpName(op)) + ":" + std::to_string(n) + " ";
  RecordProperty("forward_ops", ops);

  CrossEntropyOptions ce;
  ce.granularity = sidecar["loss"]["per"] == "token" ? CrossEntropyGranularity::kPerToken
                                                     : CrossEntropyGranularity::kPerSample;
  auto li = AddCrossEntropyLoss(&g, sidecar["loss"]["logits"], "labels", ce);
  ASSERT_TRUE(li.ok()) << li.status();
  ASSERT_TRUE(ir::InferShapes(g).ok());
  const ir::Graph forward = g;
  // The sidecar lists the trainable parameters (a tied one once) and the float buffers to freeze;
  // the forward pipeline's trainable-parameter rule (autodiff/trainable.h) found the buffers
  // without the sidecar's freeze regex.
  auto info = BuildGradients(&g, li->loss, GradOptions{});
  ASSERT_TRUE(info.ok()) << info.status();
  for (ir::ValueId v : info->unreachable_params) ADD_FAILURE() << "unreachable: " << g.value(v).name;
  std::set<std::string> want, got, frozen, buffers;
  int64_t count = 0;
  for (const auto& p : sidecar["parameters"]) want.insert(p["name"].get<std::string>());
  for (const ParamGrad& pg : info->param_grads) {
    got.insert(g.value(pg.param).name);
    count += g.value(pg.param).constant->num_elements();
  }
  EXPECT_TRUE(info->frozen_params.empty());  // no regex given
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const ir::Value& val = g.value(v);
    if (val.is_initializer && ir::IsFloat(val.dtype) && val.param_state == ir::ParamState::kFrozen) frozen.insert(val.name);
  }
  for (const auto& b : sidecar["buffers"]) buffers.insert(b.get<std::string>());
  EXPECT_EQ(got, want);
  EXPECT_EQ(frozen, buffers);
  EXPECT_EQ(count, sidecar["parameter_count"].get<int64_t>());
  // A tied initializer accumulates its consumers' contributions in one Sum.
  for (const auto& tie : sidecar["tied"]) {
    const ir::ValueId grad = g.FindValue("grad/" + tie["initializer"].get<std::string>());
    ASSERT_NE(grad, ir::kNoValue);
    const ir::Node& acc = g.node(g.value(grad).producer);
    EXPECT_EQ(acc.op, ir::OpKind::kSum);
    EXPECT_EQ(acc.inputs.size(), tie["consumers"].size());
  }
  ASSERT_TRUE(ir::Verify(g).ok());
  absl::Status inferred = ir::InferShapes(g);
  ASSERT_TRUE(inferred.ok()) << inferred;

  // Feeds: tokens, the attention mask (last position padded), labels (one ignored).
  std::mt19937_64 rng(7);
  const int64_t vocab = sidecar["vocab"].get<int64_t>();
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId in : g.inputs()) {
    const ir::Value& v = g.value(in);
    const std::vector<int64_t> dims = ir::ToInts(v.shape);
    ir::Tensor t(v.dtype, dims);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      int64_t x;
      if (v.name == "attention_mask") {
        x = (i % seq) == seq - 1 ? 0 : 1;
      } else if (v.name == "labels") {
        const int64_t classes = sidecar["classes"].is_null() ? vocab : sidecar["classes"].get<int64_t>();
        x = i == 1 ? -100 : static_cast<int64_t>(rng() % classes);
      } else {
        x = static_cast<int64_t>(rng() % vocab);
      }
      t.mutable_data<int64_t>()[i] = x;
    }
    feeds.push_back(t);
  }
  auto out = testing::Run(g, feeds);
  ASSERT_TRUE(out.ok()) << out.status();
  const size_t first_grad = g.outputs().size() - info->param_grads.size();
  for (size_t k = 0; k < info->param_grads.size(); ++k) {
    const ir::ValueId p = info->param_grads[k].param;
    const ir::Tensor& analytic = (*out)[first_grad + k];
    const int64_t n = analytic.num_elements();
    // Sampled elements; the largest-gradient element, so that a zero gradient cannot pass.
    int64_t big = 0;
    for (int64_t i = 0; i < n; ++i)
      if (std::abs(analytic.data<double>()[i]) > std::abs(analytic.data<double>()[big])) big = i;
    for (int64_t i : {int64_t{0}, n / 2, n - 1, big}) {
      ir::Graph probe = forward;
      const ir::Tensor orig = probe.value(p).constant->Clone();
      double f[2];
      for (int s = 0; s < 2; ++s) {
        ir::Tensor t = orig.Clone();
        t.mutable_data<double>()[i] += s == 0 ? 1e-6 : -1e-6;
        probe.value(p).constant = t;
        auto r = testing::Run(probe, feeds);
        ASSERT_TRUE(r.ok()) << r.status();
        f[s] = (*r)[std::find(probe.outputs().begin(), probe.outputs().end(), li->loss) - probe.outputs().begin()]
                   .data<double>()[0];
      }
      const double num = (f[0] - f[1]) / 2e-6, a = analytic.data<double>()[i];
      EXPECT_LE(std::abs(a - num), 1e-6 * std::max(1.0, std::abs(num)))
          << Model() << ": d loss / d " << g.value(p).name << "[" << i << "] analytic " << a << " numeric " << num;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ShippedModels, ModelGradTest,
                         ::testing::Combine(::testing::Values("tiny_classifier", "tiny_gpt", "tiny_bert"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_fused" : "_unfused");
                         });

}  // namespace
}  // namespace onnxpipe::autodiff
