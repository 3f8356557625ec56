// End to end on real PyTorch exports: models/export.py writes a variant (family, opset, layout),
// the loader imports it, shapes are inferred, B and S bound, and RunForwardPipeline folds and
// fuses it. Checked: the fused histogram (per layer exactly one Attention, the expected LayerNorm,
// Gelu and Linear counts), that no shape arithmetic survives binding, the attributes the model
// implies (causal for GPT, additive mask for BERT, epsilon), and that the graph computes the same
// logits before and after the pipeline on the CPU backend.

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/verifier.h"
#include "frontend/onnx/loader.h"
#include "frontend/passes/pipeline.h"
#include "gtest/gtest.h"
#include "tests/passes/numeric_util.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using Hist = std::map<std::string, int>;

constexpr int kLayers = 2;
constexpr int64_t kBatch = 2, kSeq = 12, kMaxSeq = 16;

struct ExportCase {
  std::string name;
  std::string family;  // classifier | gpt | bert
  std::vector<std::string> flags = {};
  bool norm_first = false;  // bert: adds a final LayerNorm
  bool causal = false;      // gpt
  bool dynamic = true;
  bool mean_pool = true;    // classifier: --pooling mean (a ReduceMean stays)
};

std::ostream& operator<<(std::ostream& os, const ExportCase& c) { return os << c.name; }

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Exports the variant into the test's temp dir; returns the .onnx path.
std::string Export(const ExportCase& c) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("onnxpipe_passes_export_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string out = (dir / (c.name + ".onnx")).string();
  std::string cmd = Quote(ONNXPIPE_PYTHON) + " " + Quote(std::string(ONNXPIPE_SOURCE_DIR) + "/models/export.py") +
                    " --family " + c.family + " --d-model 32 --heads 2 --layers " + std::to_string(kLayers) +
                    " --seq " + std::to_string(kMaxSeq) + " --vocab 50 --out " + Quote(out);
  for (const std::string& f : c.flags) cmd += " " + f;
  cmd += " > " + Quote(out + ".log") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  return out;
}

// Tokens in [0, vocab); BERT's attention_mask mostly 1 with some padding.
std::vector<ir::Tensor> Feeds(const ir::Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId id : g.inputs()) {
    const ir::Value& v = g.value(id);
    std::vector<int64_t> dims;
    for (const ir::Dim& d : v.shape) dims.push_back(d.Bind({{"B", kBatch}, {"S", kSeq}}).value());
    ir::Tensor t(v.dtype, dims);
    const bool mask = v.name == "attention_mask";
    for (int64_t i = 0; i < t.num_elements(); ++i)
      t.mutable_data<int64_t>()[i] = mask ? (i % dims.back() < dims.back() - 3 || rng() % 2) : rng() % 50;
    feeds.push_back(std::move(t));
  }
  return feeds;
}

void CheckFoldedAndAttributes(const ExportCase& c, const ir::Graph& g);
void CheckSameLogits(const ir::Graph& unfused, const ir::Graph& g);

// Loads `path`, binds B and S when `bind`, runs the pipeline and checks it (see the file comment).
// Unbound, shape arithmetic stays and the causal proof needs concrete dims, so only the fused op
// counts and the numerics are checked.
void CheckPipeline(const ExportCase& c, const std::string& path, bool bind) {
  absl::StatusOr<onnx_frontend::LoadedModel> loaded = onnx_frontend::LoadOnnxModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->graph.has_value());
  ir::Graph g = std::move(*loaded->graph);
  ASSERT_TRUE(ir::InferShapes(g).ok());
  if (bind && c.dynamic) {
    ASSERT_TRUE(ir::BindSymbols(g, {{"B", kBatch}, {"S", kSeq}}).ok());
    ASSERT_TRUE(ir::InferShapes(g).ok());
  }
  const ir::Graph unfused = g;
  cpu::CpuEvaluator evaluator;
  absl::Status st = RunForwardPipeline(&g, evaluator);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(ir::Verify(g).ok());
  const std::string hist = testing::HistogramString(g);
  SCOPED_TRACE("fused: " + hist);
  Hist h = testing::Histogram(g);

  // Per layer: one Attention, one Gelu, two LayerNorms; the family's extra LayerNorms and Linears.
  int extra_ln = 1, linear_per_layer = 6, extra_linear = 2;
  if (c.family == "classifier") linear_per_layer = 4, extra_linear = 1;  // packed in_proj, out_proj Gemm, 2 FFN; head
  if (c.family == "gpt") extra_linear = 1;                               // tied lm_head
  if (c.family == "bert") extra_ln = c.norm_first ? 2 : 1;               // embeddings (+ final)
  EXPECT_EQ(h["Attention"], kLayers);
  EXPECT_EQ(h["Gelu"], kLayers);
  EXPECT_EQ(h["LayerNorm"], 2 * kLayers + extra_ln);
  EXPECT_EQ(h["Linear"], linear_per_layer * kLayers + extra_linear);
  for (const char* op : {"MatMul", "Gemm", "Softmax", "Erf", "Tanh", "Pow", "Sqrt", "ReduceMean"}) {
    int allowed = 0;
    if (c.family == "classifier" && c.mean_pool && std::string(op) == "ReduceMean") allowed = 1;
    if (c.family == "bert" && std::string(op) == "Tanh") allowed = 1;              // pooler
    EXPECT_EQ(h[op], allowed) << op;
  }
  if (bind) CheckFoldedAndAttributes(c, g);
  CheckSameLogits(unfused, g);
}

void CheckFoldedAndAttributes(const ExportCase& c, const ir::Graph& g) {
  Hist h = testing::Histogram(g);
  for (const char* op : {"Shape", "Concat", "Identity", "Range", "ConstantOfShape", "Equal", "Where"}) {
    EXPECT_EQ(h[op], 0) << op;
  }
  // Shape arithmetic is gone: integer-valued nodes survive only where they read input data (BERT's
  // attention_mask[:, None, None, :]).
  std::vector<bool> reads_input(g.num_values(), false);
  for (ir::ValueId v : g.inputs()) reads_input[v] = true;
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    bool reads = false;
    for (ir::ValueId v : n.inputs) reads |= v != ir::kNoValue && reads_input[v];
    bool all_int = !n.outputs.empty();
    for (ir::ValueId v : n.outputs) {
      if (v != ir::kNoValue) reads_input[v] = reads;
      all_int &= v != ir::kNoValue && ir::IsInteger(g.value(v).dtype);
    }
    EXPECT_TRUE(!all_int || reads) << "node '" << n.name << "' (" << ir::OpName(n.op) << ") survived folding";
  }
  for (const ir::Node* att : testing::NodesOf(g, ir::OpKind::kAttention)) {
    EXPECT_NEAR(att->attrs.Get<double>("scale", 0), 1.0 / std::sqrt(16.0), 1e-6) << att->name;
    EXPECT_EQ(att->attrs.Get<int64_t>("causal", -1), c.causal ? 1 : 0) << att->name;
    EXPECT_NEAR(att->attrs.Get<double>("dropout", 0), 0.1, 1e-6) << att->name;
    if (c.family == "bert") {
      ASSERT_EQ(att->inputs.size(), 4u) << att->name;
      EXPECT_EQ(att->attrs.Get<std::string>("mask_kind"), "additive");
    } else {
      EXPECT_EQ(att->inputs.size(), 3u) << att->name;
    }
  }
  for (const ir::Node* ln : testing::NodesOf(g, ir::OpKind::kLayerNorm))
    EXPECT_NEAR(ln->attrs.Get<double>("epsilon", 0), c.family == "bert" ? 1e-12 : 1e-5, 1e-9) << ln->name;
}

void CheckSameLogits(const ir::Graph& unfused, const ir::Graph& g) {
  for (uint32_t seed : {7u, 8u}) {
    std::vector<ir::Tensor> feeds = Feeds(unfused, seed);
    absl::StatusOr<std::vector<ir::Tensor>> before = testing::Evaluate(unfused, feeds);
    ASSERT_TRUE(before.ok()) << before.status();
    absl::StatusOr<std::vector<ir::Tensor>> after = testing::Evaluate(g, feeds);
    ASSERT_TRUE(after.ok()) << after.status();
    double scale = 1;
    for (const ir::Tensor& t : *before)
      for (int64_t i = 0; i < t.num_elements(); ++i) scale = std::max(scale, std::fabs(t.GetAsDouble(i)));
    absl::StatusOr<double> diff = testing::MaxAbsDiff(*before, *after);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, 1e-4 * scale) << "seed " << seed;
  }
}

class ExportIntegrationTest : public ::testing::TestWithParam<ExportCase> {};

TEST_P(ExportIntegrationTest, FoldsFusesAndComputesTheSameLogits) {
  CheckPipeline(GetParam(), Export(GetParam()), /*bind=*/true);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ExportIntegrationTest,
    ::testing::Values(
        ExportCase{.name = "classifier_opset17", .family = "classifier", .flags = {"--opset 17"}},
        ExportCase{.name = "classifier_opset14", .family = "classifier", .flags = {"--opset 14"}},
        ExportCase{.name = "classifier_opset14_seqfirst_prenorm", .family = "classifier",
                   .flags = {"--opset 14", "--no-batch-first", "--norm-first"}},
        ExportCase{.name = "classifier_opset17_seqfirst", .family = "classifier", .flags = {"--no-batch-first"}},
        ExportCase{.name = "classifier_prenorm_sinusoidal_first", .family = "classifier",
                   .flags = {"--norm-first", "--positions sinusoidal", "--pooling first"}, .mean_pool = false},
        ExportCase{.name = "classifier_fixed_shapes", .family = "classifier",
                   .flags = {"--no-dynamic-axes", "--export-batch 2"}, .dynamic = false},
        ExportCase{.name = "gpt_opset17_tril", .family = "gpt", .flags = {"--opset 17"}, .causal = true},
        ExportCase{.name = "gpt_opset14_additive", .family = "gpt", .flags = {"--opset 14", "--causal-mask additive"},
                   .causal = true},
        ExportCase{.name = "gpt_postnorm", .family = "gpt", .flags = {"--no-norm-first"}, .causal = true},
        ExportCase{.name = "bert_opset17", .family = "bert", .flags = {"--opset 17"}},
        ExportCase{.name = "bert_opset14_prenorm", .family = "bert", .flags = {"--opset 14", "--norm-first"},
                   .norm_first = true}),
    [](const ::testing::TestParamInfo<ExportCase>& info) { return info.param.name; });

// nn.TransformerEncoderLayer with the standard causal src_mask (torch.triu(full(-inf), 1) built
// from S inside forward): once S is bound the mask folds to a constant triangle, the baddbmm's
// Mul-by-1 on scores and mask are absorbed, and the attention comes out causal without a mask.
TEST(CausalEncoderTest, GeneratedSquareSubsequentMaskBecomesCausal) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("onnxpipe_passes_export_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "causal_encoder.onnx").string();
  const std::string cmd = Quote(ONNXPIPE_PYTHON) + " " +
                          Quote(std::string(ONNXPIPE_SOURCE_DIR) + "/tests/passes/export_causal_encoder.py") + " " +
                          Quote(path) + " > " + Quote(path + ".log") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  absl::StatusOr<onnx_frontend::LoadedModel> loaded = onnx_frontend::LoadOnnxModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ir::Graph g = std::move(*loaded->graph);
  ASSERT_TRUE(ir::InferShapes(g).ok());
  ASSERT_TRUE(ir::BindSymbols(g, {{"B", kBatch}, {"S", kSeq}}).ok());
  ASSERT_TRUE(ir::InferShapes(g).ok());
  const ir::Graph unfused = g;
  cpu::CpuEvaluator evaluator;
  ASSERT_TRUE(RunForwardPipeline(&g, evaluator).ok());
  SCOPED_TRACE("fused: " + testing::HistogramString(g));
  std::vector<const ir::Node*> att = testing::NodesOf(g, ir::OpKind::kAttention);
  ASSERT_EQ(att.size(), 1u);
  EXPECT_EQ(att[0]->attrs.Get<int64_t>("causal", -1), 1);
  EXPECT_EQ(att[0]->inputs.size(), 3u);
  EXPECT_NEAR(att[0]->attrs.Get<double>("scale", 0), 1.0 / 4.0, 1e-6);
  for (const char* op : {"Trilu", "ConstantOfShape", "Shape", "Mul", "Softmax"})
    EXPECT_EQ(testing::Histogram(g)[op], 0) << op;
  // Float input: random feeds through the shared helper.
  for (uint32_t seed : {3u, 4u}) {
    absl::StatusOr<std::vector<ir::Tensor>> feeds = testing::RandomFeeds(unfused, {}, seed);
    ASSERT_TRUE(feeds.ok()) << feeds.status();
    absl::StatusOr<std::vector<ir::Tensor>> before = testing::Evaluate(unfused, *feeds);
    absl::StatusOr<std::vector<ir::Tensor>> after = testing::Evaluate(g, *feeds);
    ASSERT_TRUE(before.ok() && after.ok()) << before.status() << after.status();
    absl::StatusOr<double> diff = testing::MaxAbsDiff(*before, *after);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(*diff, 1e-4);
  }
}

// The committed models (models/tiny_*.onnx, 2 layers each), fused with B and S left symbolic and
// with them bound.
TEST(ShippedModelsTest, FuseUnboundAndBound) {
  const std::vector<std::pair<std::string, ExportCase>> shipped = {
      {"tiny_classifier", {.name = "tiny_classifier", .family = "classifier"}},
      {"tiny_gpt", {.name = "tiny_gpt", .family = "gpt", .causal = true}},
      {"tiny_bert", {.name = "tiny_bert", .family = "bert"}},
  };
  for (const auto& [file, c] : shipped) {
    SCOPED_TRACE(file);
    const std::string path = std::string(ONNXPIPE_SOURCE_DIR) + "/models/" + file + ".onnx";
    CheckPipeline(c, path, /*bind=*/false);
    CheckPipeline(c, path, /*bind=*/true);
  }
}

}  // namespace
}  // namespace onnxpipe::passes
