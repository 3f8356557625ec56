// `onnxpipe train --backend`: the checked backend (CPU kernels over memory the host must not touch)
// trains exactly as the CPU backend, so the whole command path (data, steps, metrics, --eval,
// --save) reaches device memory only through the backend; --backend cuda trains within fp32
// rounding of the CPU where a GPU is, and fails clearly where none is.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

class BackendCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("backend_cli"); }
  void TearDown() override { fs::remove_all(dir_); }

  // tiny_gpt (tied embedding), AdamW, dropout on, 3 steps; the metrics' losses and norms.
  CommandResult Train(const std::string& extra, const std::string& tag, std::vector<double>* losses,
                      std::vector<double>* norms) {
    const fs::path metrics = dir_ / (tag + ".jsonl");
    CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_gpt.onnx") + " --data " +
                                 SourcePath("models/golden/tiny_gpt/data") +
                                 " --batch 4 --steps 3 --optimizer adamw --lr 0.001 --seed 3 --metrics " +
                                 metrics.string() + " " + extra);
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json m = nlohmann::json::parse(line);
      if (!m.contains("loss") || !m.contains("step")) continue;
      losses->push_back(m["loss"].get<double>());
      norms->push_back(m["grad_norm"].get<double>());
    }
    return r;
  }

  fs::path dir_;
};

TEST_F(BackendCliTest, CheckedBackendTrainsBitwiseAsTheCpu) {
  for (const std::string& pipeline : {std::string(""), std::string("--stages 2 --microbatches 2")}) {
    std::vector<double> cpu_loss, cpu_norm, checked_loss, checked_norm;
    CommandResult cpu = Train(pipeline, "cpu", &cpu_loss, &cpu_norm);
    ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
    CommandResult checked = Train(pipeline + " --backend checked", "checked", &checked_loss, &checked_norm);
    ASSERT_EQ(checked.exit_code, 0) << checked.err;
    EXPECT_THAT(checked.out, HasSubstr("backend checked"));
    ASSERT_EQ(cpu_loss.size(), 3u);
    EXPECT_EQ(checked_loss, cpu_loss) << pipeline;
    EXPECT_EQ(checked_norm, cpu_norm) << pipeline;
    fs::remove(dir_ / "cpu.jsonl");
    fs::remove(dir_ / "checked.jsonl");
  }
}

TEST_F(BackendCliTest, CudaTrainsLikeTheCpuOrFailsClearlyWithoutAGpu) {
  std::vector<double> cpu_loss, cpu_norm, gpu_loss, gpu_norm;
  CommandResult cpu = Train("", "cpu", &cpu_loss, &cpu_norm);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  CommandResult gpu = Train("--backend cuda", "gpu", &gpu_loss, &gpu_norm);
  if (gpu.exit_code != 0) {
    EXPECT_THAT(gpu.err, HasSubstr("--backend cuda"));
    EXPECT_TRUE(gpu.err.find("no usable CUDA GPU") != std::string::npos ||
                gpu.err.find("built without the CUDA backend") != std::string::npos)
        << gpu.err;
    GTEST_SKIP() << "no GPU here: checked the error only";
  }
  ASSERT_EQ(gpu_loss.size(), cpu_loss.size());
  EXPECT_THAT(gpu.out, HasSubstr("cuda memory: peak"));
  for (size_t i = 0; i < cpu_loss.size(); ++i) {
    EXPECT_NEAR(gpu_loss[i], cpu_loss[i], 1e-4 * std::abs(cpu_loss[i])) << "step " << i;
    EXPECT_NEAR(gpu_norm[i], cpu_norm[i], 1e-4 * std::abs(cpu_norm[i])) << "step " << i;
  }
}

// Several stages on one GPU (a stream each, device-to-device sends): GPipe and 1F1B, with and without
// recompute, train as the one-stage GPU run (to fp32 rounding: micro-batches change GEMM shapes).
TEST_F(BackendCliTest, PipelinesOnOneGpuTrainAsItsOneStageRun) {
  std::vector<double> one_loss, one_norm;
  CommandResult one = Train("--backend cuda --batch 8", "one", &one_loss, &one_norm);
  if (one.exit_code != 0) GTEST_SKIP() << "no GPU here";
  ASSERT_EQ(one_loss.size(), 3u);
  for (const std::string config : {"--stages 2 --microbatches 2 --schedule gpipe --recompute full",
                                   "--stages 3 --microbatches 4 --schedule 1f1b --recompute selective",
                                   "--stages 4 --microbatches 4 --schedule 1f1b --recompute none"}) {
    std::vector<double> loss, norm;
    CommandResult r = Train("--backend cuda --batch 8 " + config, "k", &loss, &norm);
    ASSERT_EQ(r.exit_code, 0) << config << "\n" << r.err;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("ran on the host"))) << config;
    ASSERT_EQ(loss.size(), one_loss.size()) << config;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_NEAR(loss[i], one_loss[i], 2e-5 * std::abs(one_loss[i])) << config << " step " << i;
      EXPECT_NEAR(norm[i], one_norm[i], 2e-4 * std::abs(one_norm[i])) << config << " step " << i;
    }
    fs::remove(dir_ / "k.jsonl");
  }
}

// bf16 tiny_gpt (2 causal Attention layers) with attention through cuDNN's SDPA trains as with the
// flash kernels (dropout off: their masks differ by design), and --cuda-attention auto picks cuDNN.
TEST_F(BackendCliTest, Bf16CudnnAttentionTrainsAsTheFlashKernels) {
  const std::string common = "--backend cuda --dtype bf16 --no-dropout --cuda-attention ";
  std::vector<double> flash_loss, flash_norm;
  CommandResult flash = Train(common + "flash", "flash", &flash_loss, &flash_norm);
  if (flash.exit_code != 0) GTEST_SKIP() << "no GPU here: " << flash.err;
  ASSERT_EQ(flash_loss.size(), 3u);
  EXPECT_THAT(flash.out, HasSubstr("cuda attention: cudnn ran 0, flash ran "));
  EXPECT_THAT(flash.out, ::testing::Not(HasSubstr("flash ran 0")));
  for (const std::string mode : {"cudnn", "auto"}) {
    std::vector<double> loss, norm;
    CommandResult r = Train(common + mode, mode, &loss, &norm);
    if (r.exit_code != 0 && r.err.find("built without cuDNN") != std::string::npos) GTEST_SKIP() << r.err;
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr("cuda attention: cudnn ran ")) << mode;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("cudnn ran 0,"))) << mode;
    EXPECT_THAT(r.out, HasSubstr(", flash ran 0")) << mode;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Attention x"))) << mode << ": on the host";
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("AttentionGrad x"))) << mode << ": on the host";
    ASSERT_EQ(loss.size(), flash_loss.size()) << mode;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_NEAR(loss[i], flash_loss[i], 2e-2 * std::abs(flash_loss[i])) << mode << " step " << i;
    }
  }
}

TEST_F(BackendCliTest, CudaAttentionFlagIsCheckedByEveryCommand) {
  std::vector<double> l, n;
  CommandResult r = Train("--cuda-attention fast", "bad", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-attention expects auto, cudnn or flash, got 'fast'"));
  r = Train("--cuda-attention cudnn", "bad2", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-attention applies to --backend cuda, not 'cpu'"));
  r = RunCommand(Onnxpipe() + " profile " + SourcePath("models/tiny_gpt.onnx") + " --batch 2 --out " +
                 (dir_ / "t.json").string() + " --backend checked --cuda-attention flash");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-attention applies to --backend cuda, not 'checked'"));
  r = RunCommand(Onnxpipe() + " run " + SourcePath("models/tiny_classifier.onnx") + " --inputs " +
                 SourcePath("models/golden/tiny_classifier/data") + " --out " + (dir_ / "o").string() +
                 " --cuda-attention sometimes");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-attention expects auto, cudnn or flash, got 'sometimes'"));
  for (const std::string command : {"train", "profile", "run"}) {
    r = RunCommand(Onnxpipe() + " " + command + " --help");
    EXPECT_EQ(r.exit_code, 0) << command;
    EXPECT_THAT(r.out, HasSubstr("--cuda-attention")) << command;
    EXPECT_THAT(r.out, HasSubstr("auto: cuDNN's SDPA for bf16/fp16 nodes")) << command;
  }
}

// `onnxpipe run` node by node through the checked backend writes the CPU's outputs byte for byte.
TEST_F(BackendCliTest, RunThroughTheCheckedBackendEqualsTheCpu) {
  for (const std::string backend : {"cpu", "checked"}) {
    CommandResult r = RunCommand(Onnxpipe() + " run " + SourcePath("models/tiny_classifier.onnx") + " --inputs " +
                                 SourcePath("models/golden/tiny_classifier/data") + " --out " +
                                 (dir_ / backend).string() + " --backend " + backend);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const std::string cpu = testing::ReadAll((dir_ / "cpu" / "logits.npy").string());
  ASSERT_GT(cpu.size(), 128u);
  EXPECT_EQ(testing::ReadAll((dir_ / "checked" / "logits.npy").string()), cpu);
}

TEST_F(BackendCliTest, BadBackendFlagsNameTheFlag) {
  std::vector<double> l, n;
  CommandResult r = Train("--backend tpu", "bad", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--backend expects cpu, cuda or checked, got 'tpu'"));
  r = Train("--backend cuda --device -1", "bad2", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--device must be >= 0"));
  r = Train("--tf32", "bad3", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--tf32 applies to --backend cuda, not 'cpu'"));
  r = Train("--gemm-tactics " + (dir_ / "t.json").string(), "bad6", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--gemm-tactics applies to --backend cuda, not 'cpu'"));
  EXPECT_FALSE(fs::exists(dir_ / "t.json"));
  r = Train("--cuda-graphs", "bad4", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-graphs needs --backend cuda"));
  r = Train("--backend cuda --cuda-graphs --check-numerics", "bad5", &l, &n);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--cuda-graphs cannot be combined with --check-numerics"));
}

// CUDA graphs (train's default on cuda): steps replayed from graphs (dropout on: each replay must draw its own
// step's masks) train as the eager steps (--no-cuda-graphs), one stage and pipelined on one GPU.
TEST_F(BackendCliTest, CudaGraphsTrainAsEagerSteps) {
  for (const std::string config : {"--batch 8", "--batch 8 --stages 2 --microbatches 4 --recompute selective"}) {
    std::vector<double> eager_loss, eager_norm, loss, norm;
    CommandResult eager = Train("--backend cuda --no-cuda-graphs --steps 5 " + config, "eager", &eager_loss, &eager_norm);
    if (eager.exit_code != 0) GTEST_SKIP() << "no GPU here";
    EXPECT_THAT(eager.out, Not(HasSubstr("cuda graphs:"))) << config;
    CommandResult r = Train("--backend cuda --steps 5 " + config, "graphs", &loss, &norm);
    ASSERT_EQ(r.exit_code, 0) << config << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr("cuda graphs: the last step replayed")) << config;
    EXPECT_THAT(r.out, HasSubstr(" 0 recordings failed")) << config << "\n" << r.err;
    ASSERT_EQ(loss.size(), eager_loss.size()) << config;
    for (size_t i = 0; i < loss.size(); ++i) {
      EXPECT_NEAR(loss[i], eager_loss[i], 1e-6 * std::abs(eager_loss[i])) << config << " step " << i;
      EXPECT_NEAR(norm[i], eager_norm[i], 1e-5 * std::abs(eager_norm[i])) << config << " step " << i;
    }
    fs::remove(dir_ / "eager.jsonl");
    fs::remove(dir_ / "graphs.jsonl");
  }
}

// --gemm-tactics: the first run times each GEMM shape's candidates and writes the file; the steps train as with the
// heuristic's algorithms (to fp32 rounding: other algorithms sum in another order); a second run reuses every
// tactic untimed (the file unchanged) and repeats the first run's steps bit for bit.
TEST_F(BackendCliTest, GemmTacticsAreTimedOnceThenReused) {
  std::vector<double> base_loss, base_norm, loss, norm, again_loss, again_norm;
  CommandResult base = Train("--backend cuda --no-cuda-graphs", "base", &base_loss, &base_norm);
  if (base.exit_code != 0) GTEST_SKIP() << "no GPU here";
  const fs::path cache = dir_ / "tactics.json";
  CommandResult r = Train("--backend cuda --no-cuda-graphs --gemm-tactics " + cache.string(), "timed", &loss, &norm);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string written = testing::ReadAll(cache.string());
  const nlohmann::json j = nlohmann::json::parse(written);
  EXPECT_EQ(j["format"], "onnxpipe-gemm-tactics");
  EXPECT_GE(j["tactics"].size(), 3u);  // tiny_gpt's projections, MLP and LM head, forward and gradients
  for (const auto& [key, t] : j["tactics"].items()) EXPECT_GT(t["time_us"].get<double>(), 0.0) << key;
  ASSERT_EQ(loss.size(), base_loss.size());
  for (size_t i = 0; i < loss.size(); ++i) {
    EXPECT_NEAR(loss[i], base_loss[i], 1e-5 * std::abs(base_loss[i])) << i;
    EXPECT_NEAR(norm[i], base_norm[i], 1e-4 * std::abs(base_norm[i])) << i;
  }
  r = Train("--backend cuda --no-cuda-graphs --gemm-tactics " + cache.string(), "again", &again_loss, &again_norm);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(testing::ReadAll(cache.string()), written);
  EXPECT_EQ(again_loss, loss);
  EXPECT_EQ(again_norm, norm);
}

// `onnxpipe profile --backend B` times the same training-graph nodes on B as on the CPU (the checked
// backend here; cuda where a GPU is), each with a measured time.
TEST_F(BackendCliTest, ProfileRunsTheTrainingGraphOnTheBackend) {
  auto profile = [&](const std::string& backend, nlohmann::json* times) {
    const fs::path out = dir_ / ("times_" + backend + ".json");
    CommandResult r = RunCommand(Onnxpipe() + " profile " + SourcePath("models/tiny_gpt.onnx") +
                                 " --batch 2 --repeats 2 --optimizer adamw --out " + out.string() + " --backend " +
                                 backend);
    if (r.exit_code == 0) *times = nlohmann::json::parse(testing::ReadAll(out.string()));
    return r;
  };
  nlohmann::json cpu, other;
  CommandResult r = profile("cpu", &cpu);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string backend : {"checked", "cuda"}) {
    r = profile(backend, &other);
    if (backend == "cuda" && r.exit_code != 0) {
      EXPECT_THAT(r.err, HasSubstr("--backend cuda"));
      continue;  // no GPU here
    }
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(other["backend"], backend);
    ASSERT_EQ(other["ops"].size(), cpu["ops"].size()) << backend;
    ASSERT_GT(cpu["ops"].size(), 50u);
    for (size_t i = 0; i < cpu["ops"].size(); ++i) {
      EXPECT_EQ(other["ops"][i]["node"], cpu["ops"][i]["node"]) << backend;
      EXPECT_EQ(other["ops"][i]["phase"], cpu["ops"][i]["phase"]) << backend;
      EXPECT_GT(other["ops"][i]["ms"].get<double>(), 0.0) << backend << " " << other["ops"][i]["node"];
    }
  }
}

}  // namespace
}  // namespace onnxpipe
