// ONNX Attention and RotaryEmbedding (ai.onnx opset 23) through the importer (frontend/onnx/import_attention.cc),
// on the hand-built models of tests/data/onnx_attention (make_models.py: references from the specification's
// formulas in numpy, which onnxruntime agreed with when they were written): each imports to the fused IR op, the
// forward equals numpy (4-D and 3-D forms, partial and interleaved rotary, position ids, grouped-query heads, bool
// and float masks, causal, default and given scales), the gradients equal central finite differences, and what
// onnxpipe does not train (a score cap, a KV cache) or cannot read (a 3-D X without num_heads) fails naming the node.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ::testing::HasSubstr;

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_attention", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

struct Case {
  std::string name;
  std::vector<std::string> inputs;  // graph inputs, in order (the rest are constants)
  ir::OpKind fused;
};

std::vector<Case> Cases() {
  return {{"rotary_4d_partial", {"X"}, ir::OpKind::kRotary},
          {"rotary_3d_interleaved", {"X"}, ir::OpKind::kRotary},
          {"attention_4d_gqa", {"X", "K", "V"}, ir::OpKind::kAttention},
          {"attention_3d_causal", {"X", "K", "V"}, ir::OpKind::kAttention}};
}

TEST(OnnxAttentionTest, ImportsToOneFusedOp) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    int fused = 0;
    for (ir::NodeId id : m->graph->LiveNodes()) fused += m->graph->node(id).op == c.fused ? 1 : 0;
    EXPECT_EQ(fused, 1) << c.name;
  }
  absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath("attention_3d_causal.onnx"));
  ASSERT_TRUE(m.ok()) << m.status();
  for (ir::NodeId id : m->graph->LiveNodes()) {
    const ir::Node& n = m->graph->node(id);
    if (n.op != ir::OpKind::kAttention) continue;
    EXPECT_EQ(n.attrs.Get<int64_t>("causal", 0), 1);
    EXPECT_EQ(n.attrs.Get<double>("scale", 0), static_cast<double>(0.7f));
    EXPECT_EQ(n.attrs.Get<std::string>("mask_kind", ""), "additive");
  }
}

TEST(OnnxAttentionTest, ForwardEqualsNumpy) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(ir::InferShapes(*m->graph).ok()) << c.name;
    std::vector<ir::Tensor> feeds;
    for (const std::string& in : c.inputs) feeds.push_back(Npy(c.name + "." + in + ".npy"));
    const ir::Tensor want = Npy(c.name + ".Y.npy").CastTo(ir::DType::kF64);
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(*m->graph, feeds);
    ASSERT_TRUE(out.ok()) << c.name << ": " << out.status();
    const ir::Tensor got = (*out)[0].CastTo(ir::DType::kF64);
    ASSERT_EQ(got.dims(), want.dims()) << c.name;
    double scale = 0, err = 0;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      scale = std::max(scale, std::abs(want.data<double>()[i]));
      err = std::max(err, std::abs(got.data<double>()[i] - want.data<double>()[i]));
    }
    EXPECT_LE(err, 1e-6 * scale) << c.name;  // f32 arithmetic against f64 references
  }
}

TEST(OnnxAttentionTest, GradientsEqualFiniteDifferences) {
  for (const Case& c : Cases()) {
    std::map<std::string, ir::Tensor> bound;  // differentiated like parameters; the f32 model in f64
    for (const std::string& in : c.inputs) bound[in] = Npy(c.name + "." + in + ".npy");
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(c.name + ".onnx"), bound, 1e-6, [](const std::string&) { return true; });
    EXPECT_EQ(compared.size(), c.inputs.size()) << c.name;
  }
}

TEST(OnnxAttentionTest, WhatOnnxpipeDoesNotTrainFailsNamingTheNode) {
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"attention_softcap", {"'/attn/sdpa' (Attention)", "softcap 30", "no score cap"}},
      {"attention_past_key", {"'/attn/sdpa' (Attention)", "KV cache", "past_key"}},
      {"rotary_3d_without_heads", {"'/attn/rotary' (RotaryEmbedding)", "num_heads", "3-D X"}},
  };
  for (const auto& [name, mentions] : cases) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(std::string(name) + ".onnx"));
    ASSERT_FALSE(m.ok()) << name;
    for (const std::string& s : mentions) EXPECT_THAT(m.status().message(), HasSubstr(s)) << name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
