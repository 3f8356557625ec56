// The trainable-parameter rule on real exports (the Hugging Face corpus, models/hf, and the shipped
// models): the initializers it freezes, with their reasons, against PyTorch's view of the module
// (the sidecars' `freeze`/`buffers` lists: float initializers that are none of the module's
// parameters). zoo_test.py checks the frozen set of every corpus model; these pin the reasons for
// the families the issue names: Llama/Qwen2/Mistral rotary caches, GPT-2 causal masks and mask fill
// values, BERT/RoBERTa position and token-type id buffers, BART's final_logits_bias and the position
// tables fixed-shape dynamo exports fold.
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "frontend/autodiff/trainable.h"
#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::autodiff {
namespace {

struct Imported {
  ir::Graph graph;
  nlohmann::json sidecar;
  std::map<std::string, FreezeReason> frozen;  // float initializers the rule froze
  std::set<std::string> non_float;
};

// Imports a model as `onnxpipe train` does (before folding) and runs the rule on it. Paths are
// relative to the source tree.
Imported ImportFiles(const std::string& model, const std::string& sidecar) {
  Imported m;
  const std::string root = std::string(ONNXPIPE_SOURCE_DIR) + "/";
  m.sidecar = nlohmann::json::parse(std::ifstream(root + sidecar));
  absl::StatusOr<onnx_frontend::LoadedModel> loaded = onnx_frontend::LoadOnnxModel(root + model);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (!loaded.ok() || !loaded->graph) return m;
  m.graph = std::move(*loaded->graph);
  EXPECT_TRUE(ir::InferShapes(m.graph).ok());
  absl::StatusOr<TrainableReport> report = DecideTrainable(m.graph);
  EXPECT_TRUE(report.ok()) << report.status();
  if (!report.ok()) return m;
  for (const InitializerDecision& d : report->decisions) {
    const std::string& name = m.graph.value(d.value).name;
    if (d.reason == FreezeReason::kNonFloat) {
      m.non_float.insert(name);
    } else if (!d.trainable) {
      m.frozen[name] = d.reason;
    }
  }
  return m;
}

// A corpus folder: model.onnx and zoo.json.
Imported Import(const std::string& dir) { return ImportFiles(dir + "/model.onnx", dir + "/zoo.json"); }

std::set<std::string> Keys(const std::map<std::string, FreezeReason>& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

std::set<std::string> Names(const nlohmann::json& list) {
  std::set<std::string> out;
  for (const auto& n : list) out.insert(n.get<std::string>());
  return out;
}

// The value of the rank-0 float initializer `name`.
double ScalarValue(const ir::Graph& g, const std::string& name) {
  const ir::ValueId v = g.FindValue(name);
  EXPECT_NE(v, ir::kNoValue) << name;
  return v == ir::kNoValue ? 0.0 : g.value(v).constant->GetAsDouble(0);
}

class RotaryCacheTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RotaryCacheTest, InvFreqIsPositionalAndEveryConstantFrozen) {
  const Imported m = Import("models/hf/" + GetParam());
  EXPECT_EQ(Keys(m.frozen), Names(m.sidecar["freeze"]));
  ASSERT_TRUE(m.frozen.count("m.model.rotary_emb.inv_freq"));
  EXPECT_EQ(m.frozen.at("m.model.rotary_emb.inv_freq"), FreezeReason::kPositional);
  // The rest are the scalars torch lifted: RMSNorm's exponent 2 and eps, the attention scale, the 0 of the mask
  // (rank 0), and the mask's finfo.min fill value (a sentinel).
  int sentinels = 0;
  for (const auto& [name, reason] : m.frozen) {
    if (name == "m.model.rotary_emb.inv_freq") continue;
    EXPECT_EQ(m.graph.value(m.graph.FindValue(name)).constant->rank(), 0) << name;
    if (reason == FreezeReason::kSentinel) {
      ++sentinels;
      EXPECT_EQ(ScalarValue(m.graph, name), -3.4028234663852886e38) << name;
    } else {
      EXPECT_EQ(reason, FreezeReason::kScalar) << name;
    }
  }
  EXPECT_EQ(sentinels, 1);
}

INSTANTIATE_TEST_SUITE_P(HfCorpus, RotaryCacheTest,
                         ::testing::Values("llama_dynamo18_sdpa_dyn", "llama_dynamo18_eager_dyn",
                                           "qwen2_dynamo18_sdpa_dyn", "mistral_dynamo18_sdpa_dyn"));

TEST(TrainableCorpusTest, TorchScriptLlamaFamiliesKeepEveryInitializerAParameter) {
  // The TorchScript exporter writes rotary caches and literals as Constant nodes: every initializer is a
  // parameter of the module, and the rule leaves them all trained.
  for (const char* name : {"llama_ts17_eager_dyn", "qwen2_ts17_eager_dyn", "mistral_ts17_eager_dyn"}) {
    const Imported m = Import(std::string("models/hf/") + name);
    EXPECT_TRUE(m.frozen.empty()) << name;
    EXPECT_TRUE(m.sidecar["freeze"].empty()) << name;
  }
}

TEST(TrainableCorpusTest, Gpt2MaskFillValueIsASentinelAndItsLiteralsScalars) {
  const Imported m = Import("models/hf/gpt2_dynamo18_sdpa_dyn");
  EXPECT_EQ(Keys(m.frozen), Names(m.sidecar["freeze"]));
  int sentinels = 0;
  for (const auto& [name, reason] : m.frozen) {
    if (reason == FreezeReason::kSentinel) {
      ++sentinels;
      EXPECT_EQ(ScalarValue(m.graph, name), -3.4028234663852886e38);
    } else {
      EXPECT_EQ(reason, FreezeReason::kScalar) << name;  // 0.5, 1, 3 and tanh-GELU's constants, the scale, the 0
    }
  }
  EXPECT_EQ(sentinels, 1);
}

TEST(TrainableCorpusTest, Gpt2CausalMaskBuffersAreNotParameters) {
  // tiny_gpt (TorchScript): a float causal-mask buffer per block, sliced and compared with Equal: no gradient
  // path. The sidecar's `buffers` are PyTorch's named_buffers().
  const Imported tiny = ImportFiles("models/tiny_gpt.onnx", "models/tiny_gpt.json");
  EXPECT_EQ(Keys(tiny.frozen), Names(tiny.sidecar["buffers"]));
  for (const auto& [name, reason] : tiny.frozen) EXPECT_EQ(reason, FreezeReason::kNoGradient) << name;
  // GPT-2 exported at opset 17 with bool mask buffers: integer/bool initializers are never parameters.
  const Imported gpt2 = Import("tests/data/zoo/gpt2_o17_fixed");
  EXPECT_TRUE(gpt2.frozen.empty());
  EXPECT_EQ(gpt2.non_float, (std::set<std::string>{"h.0.bias", "h.1.bias"}));
}

TEST(TrainableCorpusTest, BertAndRobertaIdBuffersAreIntegers) {
  const Imported bert = Import("models/hf/bert_dynamo18_sdpa_dyn");
  EXPECT_TRUE(bert.non_float.count("m.bert.embeddings.position_ids"));
  EXPECT_EQ(Keys(bert.frozen), Names(bert.sidecar["freeze"]));
  const Imported roberta = Import("models/hf/roberta_dynamo18_sdpa_dyn");
  EXPECT_TRUE(roberta.non_float.count("m.roberta.embeddings.token_type_ids"));
  EXPECT_EQ(Keys(roberta.frozen), Names(roberta.sidecar["freeze"]));
  for (const auto& [name, reason] : roberta.frozen)
    EXPECT_TRUE(reason == FreezeReason::kScalar || reason == FreezeReason::kSentinel) << name;
}

TEST(TrainableCorpusTest, BuffersTheGraphCannotTellFromParametersComeFromTheExport) {
  // These needed --freeze before the exporter rules: BART's final_logits_bias (a zero buffer added to the logits
  // as a bias parameter is) and the position embedding a fixed-shape dynamo export folds into a constant.
  const Imported bart_dynamo = Import("models/hf/bart_dynamo18_eager_dyn");
  EXPECT_EQ(Keys(bart_dynamo.frozen), Names(bart_dynamo.sidecar["freeze"]));
  ASSERT_TRUE(bart_dynamo.frozen.count("m.final_logits_bias"));
  EXPECT_EQ(bart_dynamo.frozen.at("m.final_logits_bias"), FreezeReason::kExportedBuffer);
  // The TorchScript export records no signature: the all-zero (1, V) row added to the logits.
  const Imported bart_ts = Import("models/hf/bart_ts17_eager_dyn");
  EXPECT_EQ(Keys(bart_ts.frozen), Names(bart_ts.sidecar["freeze"]));
  ASSERT_TRUE(bart_ts.frozen.count("m.final_logits_bias"));
  EXPECT_EQ(bart_ts.frozen.at("m.final_logits_bias"), FreezeReason::kZeroRow);
  for (const char* dir : {"models/hf/gpt2_dynamo18_eager_fixed", "tests/data/zoo/bert_dynamo18_fixed"}) {
    const Imported fixed = Import(dir);
    EXPECT_EQ(Keys(fixed.frozen), Names(fixed.sidecar["freeze"])) << dir;
    ASSERT_TRUE(fixed.frozen.count("embedding_1")) << dir;
    EXPECT_EQ(fixed.frozen.at("embedding_1"), FreezeReason::kExporterMade) << dir;
    // The Linear weights the exporter folded into their transposes (val_*, rank 2) are trained.
    for (ir::ValueId v = 0; v < fixed.graph.num_values(); ++v) {
      const ir::Value& val = fixed.graph.value(v);
      if (val.exported_as == ir::ExportedAs::kExporterMade && val.constant && val.constant->rank() == 2) {
        EXPECT_FALSE(fixed.frozen.count(val.name)) << dir << " " << val.name;
      }
    }
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
