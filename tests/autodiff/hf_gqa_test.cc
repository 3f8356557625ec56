// Grouped-query attention on the Hugging Face corpus (models/hf: transformers exports with 4 query
// heads over 2 K/V heads, torch's TorchScript and dynamo exporters): the forward pipeline folds the
// repeat_kv of every layer into its Attention (K and V keep their 2 heads), the fused graph's logits
// and every parameter's gradient equal the unfused graph's (decomposed attention, repeat_kv and its
// ReduceToShapeOf gradient), in fp64; and no backward node differentiates a forward node that
// reads only constants (rotary tables, masks computed from shapes). A multi-head export (GPT-2)
// keeps its heads.
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/precision.h"
#include "frontend/onnx/loader.h"
#include "frontend/passes/pipeline.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

constexpr int64_t kBatch = 2, kSeq = 7;

struct Trained {
  ir::Graph graph;
  TrainingGraphInfo info;
};

// The model bound to (kBatch, kSeq), in fp64, through the forward pipeline (fused or not), with the
// corpus' token cross-entropy and its gradients.
Trained Build(const std::string& dir, bool fuse) {
  Trained t;
  auto loaded = onnx_frontend::LoadOnnxModel(dir + "/model.onnx");
  EXPECT_TRUE(loaded.ok() && loaded->graph.has_value()) << loaded.status();
  if (!loaded.ok() || !loaded->graph) return t;
  ir::Graph& g = t.graph = std::move(*loaded->graph);
  EXPECT_TRUE(ir::InferShapes(g).ok());
  EXPECT_TRUE(ir::BindSymbols(g, {{"batch", kBatch}, {"seq", kSeq}}).ok());
  EXPECT_TRUE(ir::InferShapes(g).ok());
  EXPECT_TRUE(ir::ConvertFloatPrecision(g, ir::DType::kF32, ir::DType::kF64).ok());
  cpu::CpuEvaluator folder;
  passes::PipelineOptions popts;
  popts.fuse = fuse;
  absl::Status piped = passes::RunForwardPipeline(&g, folder, popts);
  EXPECT_TRUE(piped.ok()) << piped;
  CrossEntropyOptions ce;
  ce.granularity = CrossEntropyGranularity::kPerToken;
  auto li = AddCrossEntropyLoss(&g, "logits", "labels", ce);
  EXPECT_TRUE(li.ok()) << li.status();
  if (!li.ok()) return t;
  EXPECT_TRUE(ir::InferShapes(g).ok());
  auto info = BuildGradients(&g, li->loss, GradOptions{});
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) t.info = *std::move(info);
  EXPECT_TRUE(ir::InferShapes(g).ok());
  return t;
}

// Token ids, a right-padded attention mask and labels (padding ignored), by input name.
std::vector<ir::Tensor> Feeds(const ir::Graph& g, int64_t vocab) {
  std::mt19937_64 rng(5);
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId in : g.inputs()) {
    const ir::Value& v = g.value(in);
    ir::Tensor t(v.dtype, ir::ToInts(v.shape));
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      const bool padded = (i / kSeq == 1) && (i % kSeq) >= kSeq - 2;  // row 1 ends in 2 pads
      int64_t x = static_cast<int64_t>(2 + rng() % (vocab - 2));
      if (v.name == "attention_mask") x = padded ? 0 : 1;
      if (v.name == "labels" && padded) x = -100;
      t.mutable_data<int64_t>()[i] = x;
    }
    feeds.push_back(t);
  }
  return feeds;
}

// Values computed from constants alone: no trainable parameter reaches them through float values.
std::set<ir::ValueId> ParameterFree(const ir::Graph& g) {
  std::vector<bool> from_param(g.num_values(), false);
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    const ir::Value& val = g.value(v);
    from_param[v] = val.is_initializer && ir::IsFloat(val.dtype) && val.param_state != ir::ParamState::kFrozen;
  }
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.phase != ir::Phase::kForward) continue;
    bool any = false;
    for (ir::ValueId in : n.inputs) any |= in != ir::kNoValue && from_param[in] && ir::IsFloat(g.value(in).dtype);
    for (ir::ValueId out : n.outputs)
      if (out != ir::kNoValue) from_param[out] = any && ir::IsFloat(g.value(out).dtype);
  }
  std::set<ir::ValueId> out;
  for (ir::ValueId v = 0; v < g.num_values(); ++v)
    if (!from_param[v]) out.insert(v);
  return out;
}

class HfGqaTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfGqaTest, RepeatKvFoldsIntoAttentionWithTheUnfusedGraphsLogitsAndGradients) {
  const std::string dir = std::string(ONNXPIPE_SOURCE_DIR) + "/models/hf/" + GetParam();
  const nlohmann::json zoo = nlohmann::json::parse(std::ifstream(dir + "/zoo.json"));
  const nlohmann::json& config = zoo["config"];
  const bool grouped = GetParam().rfind("gpt2", 0) != 0;
  const int64_t heads = config["heads"], kv_heads = grouped ? config["kv_heads"].get<int64_t>() : heads;
  Trained fused = Build(dir, /*fuse=*/true);
  Trained plain = Build(dir, /*fuse=*/false);
  const ir::Graph& g = fused.graph;

  int attentions = 0;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::OpKind::kAttention) continue;
    ++attentions;
    // Each operand as the attention reads it: through its view (the projection's (B, S, H, D) rows).
    auto operand = [&](int i) -> ir::Shape {
      const ir::Shape& buffer = g.value(n.inputs[i]).shape;
      if (!ir::HasAttentionView(n, i)) return buffer;
      absl::StatusOr<ir::StridedView> view = ir::AttentionOperandView(n, i, ir::ToInts(buffer));
      EXPECT_TRUE(view.ok()) << view.status();
      return view.ok() ? ir::FromInts(view->dims) : buffer;
    };
    const ir::Shape q = operand(0), k = operand(1), v = operand(2);
    if (q.size() < 3) {  // a multi-head export may attend on flattened (B*H, S, D) heads
      EXPECT_FALSE(grouped) << n.name;
      continue;
    }
    EXPECT_EQ(q.end()[-3], ir::Dim(heads)) << n.name;
    EXPECT_EQ(k.end()[-3], ir::Dim(kv_heads)) << n.name << ": K " << ir::ShapeToString(k);
    EXPECT_EQ(v.end()[-3], ir::Dim(kv_heads)) << n.name;
  }
  EXPECT_EQ(attentions, config["layers"].get<int64_t>());
  // The repeat's gradient is gone with it: no ReduceToShapeOf of a 5-D (B, kv, n_rep, S, D) value.
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::kReduceToShapeOf) {
      EXPECT_NE(g.value(n.inputs[0]).shape.size(), 5u) << n.name;
    }
  }

  // No backward node differentiates a forward node whose inputs are all parameter-free.
  const std::set<ir::ValueId> constant = ParameterFree(g);
  std::map<std::string, ir::NodeId> forward_by_name;
  for (ir::NodeId id : g.LiveNodes())
    if (g.node(id).phase == ir::Phase::kForward) forward_by_name[g.node(id).name] = id;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    const auto origin = forward_by_name.find(n.origin);
    if (n.phase != ir::Phase::kBackward || origin == forward_by_name.end()) continue;
    const ir::Node& fwd = g.node(origin->second);
    bool reads_parameter = false;
    for (ir::ValueId in : fwd.inputs) reads_parameter |= in != ir::kNoValue && !constant.count(in);
    EXPECT_TRUE(reads_parameter) << "backward node " << n.name << " (" << ir::OpName(n.op) << ") of "
                                 << fwd.name << " (" << ir::OpName(fwd.op) << "), which reads only constants";
  }

  // Logits and gradients against the unfused graph, on the same feeds (inputs by name).
  const std::vector<ir::Tensor> feeds = Feeds(g, config["vocab"].get<int64_t>());
  std::vector<ir::Tensor> plain_feeds;
  for (ir::ValueId in : plain.graph.inputs()) {
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.value(g.inputs()[i]).name == plain.graph.value(in).name) plain_feeds.push_back(feeds[i]);
  }
  auto got = testing::Run(g, feeds);
  auto want = testing::Run(plain.graph, plain_feeds);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  auto output = [](const ir::Graph& graph, const std::vector<ir::Tensor>& outs, const std::string& name) {
    for (size_t i = 0; i < graph.outputs().size(); ++i)
      if (graph.value(graph.outputs()[i]).name == name) return outs[i];
    ADD_FAILURE() << "no output " << name;
    return ir::Tensor();
  };
  std::vector<std::string> names = {"logits"};
  for (const ParamGrad& pg : plain.info.param_grads) names.push_back(plain.graph.value(pg.grad).name);
  EXPECT_EQ(fused.info.param_grads.size(), plain.info.param_grads.size());
  for (const std::string& name : names) {
    const ir::Tensor a = output(g, *got, name), b = output(plain.graph, *want, name);
    ASSERT_TRUE(a.defined() && b.defined()) << name;
    ASSERT_EQ(a.dims(), b.dims()) << name;
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      scale = std::max(scale, std::abs(b.data<double>()[i]));
      diff = std::max(diff, std::abs(a.data<double>()[i] - b.data<double>()[i]));
    }
    // fp64; the graphs hold float32 constants (GELU's, eps) that the other fusions read exactly.
    EXPECT_LE(diff, 1e-8 * std::max(scale, 1.0)) << name << " of " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, HfGqaTest,
                         ::testing::Values("llama_dynamo18_sdpa_dyn", "llama_dynamo18_eager_dyn", "llama_ts17_eager_dyn",
                                           "qwen2_dynamo18_sdpa_dyn", "qwen2_ts17_eager_dyn",
                                           "mistral_dynamo18_sdpa_dyn", "mistral_ts17_eager_dyn",
                                           "gpt2_dynamo18_sdpa_dyn"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace onnxpipe::autodiff
