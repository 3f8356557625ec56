// `onnxpipe train` through the built binary: the metrics file against the PyTorch golden, and every
// kind of bad input giving a clear error and exit code.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "executor/data/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"
#include "tests/train/metrics_lines.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

const char kClassifierFreeze[] = "'^pos\\.table$'";

class TrainCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("train_cli");
    data_ = dir_ / "data";
    fs::copy(SourcePath("models/golden/tiny_classifier/data"), data_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The golden's SGD setting on the classifier, plus `extra` flags.
  CommandResult Train(const std::string& extra) {
    return RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " + data_.string() +
                      " --batch 4 --optimizer sgd --lr 0.01 --momentum 0.9 --weight-decay 0.01"
                      " --logits logits --labels labels --no-dropout --freeze " +
                      kClassifierFreeze + " " + extra);
  }

  fs::path dir_, data_;
};

TEST_F(TrainCliTest, MetricsMatchTheGoldenAndProgressIsPlainWithoutTty) {
  const fs::path metrics = dir_ / "m.jsonl";
  CommandResult r = Train("--steps 3 --metrics " + metrics.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("step 1/3  loss"));
  EXPECT_THAT(r.out, HasSubstr("step 3/3  loss"));
  EXPECT_EQ(r.out.find('\r'), std::string::npos);  // stdout is not a terminal here

  std::ifstream golden_file(SourcePath("models/golden/tiny_classifier.json"));
  const nlohmann::json golden = nlohmann::json::parse(golden_file);
  const nlohmann::json& run = golden["runs"][1];  // sgd, float32
  ASSERT_EQ(run["optimizer"], "sgd");
  ASSERT_EQ(run["dtype"], "float32");
  std::ifstream in(metrics);
  std::string line;
  int k = 0;
  while (std::getline(in, line)) {
    const nlohmann::json m = nlohmann::json::parse(line);
    EXPECT_EQ(m["step"].get<int>(), k);
    const double want = run["losses"][k].get<double>();
    EXPECT_NEAR(m["loss"].get<double>(), want, 1e-4 * want);
    const double want_norm = run["grad_norms"][k].get<double>();
    EXPECT_NEAR(m["grad_norm"].get<double>(), want_norm, 1e-4 * want_norm);
    EXPECT_EQ(m["lr"].get<double>(), 0.01);
    EXPECT_GT(m["samples_per_s"].get<double>(), 0);
    ++k;
  }
  EXPECT_EQ(k, 3);
}

// A run without --stages is the stage executor's one-stage case: every kernel writes into its planned slot, so the
// printed high-water marks of the arena, the kernel scratch and the gradients equal the stage's layout to the byte
// (dropout on, so its masks are planned too), and the layout is what `onnxpipe partition --stages 1` predicts.
TEST_F(TrainCliTest, MemoryHighWaterEqualsThePlan) {
  CommandResult r =
      RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " + data_.string() +
                 " --batch 4 --steps 2 --optimizer adamw --lr 0.001 --freeze " + kClassifierFreeze);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      r.out, m,
      std::regex("memory: arena (\\d+) bytes planned, high-water (\\d+); workspace (\\d+) planned, high-water "
                 "(\\d+); gradients (\\d+) planned, high-water (\\d+); parameters (\\d+), optimizer state (\\d+)")))
      << r.out;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("pipelined")));
  EXPECT_GT(std::stoll(m[1]), 0);
  EXPECT_EQ(m[1], m[2]);
  EXPECT_EQ(m[3], m[4]);
  EXPECT_EQ(m[5], m[6]);
  EXPECT_EQ(m[5], m[7]);                              // one gradient per parameter, same dtype and dims
  EXPECT_EQ(std::stoll(m[8]), 2 * std::stoll(m[7]));  // AdamW's two moments

  // The same numbers as the partitioner's plan for one stage.
  const fs::path plan = dir_ / "plan";
  CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_classifier.onnx") +
                               " --stages 1 --batch 4 --seq 64 --optimizer adamw --device cpu --freeze " +
                               kClassifierFreeze + " --out " + plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err;
  std::ifstream in(plan / "plan.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  const nlohmann::json& stage = j["stages"][0]["memory"];
  EXPECT_EQ(stage["arena"].get<int64_t>(), std::stoll(m[1])) << stage.dump();
  EXPECT_EQ(stage["gradients"].get<int64_t>(), std::stoll(m[5])) << stage.dump();
  EXPECT_EQ(stage["parameters"].get<int64_t>(), std::stoll(m[7])) << stage.dump();
  EXPECT_EQ(stage["optimizer_state"].get<int64_t>(), std::stoll(m[8])) << stage.dump();
}

TEST_F(TrainCliTest, DropoutFollowsTheSeed) {
  auto losses = [&](const std::string& seed) {
    const fs::path metrics = dir_ / ("m" + seed + ".jsonl");
    CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                                 data_.string() + " --batch 4 --steps 2 --optimizer sgd --lr 0.01 --freeze " +
                                 kClassifierFreeze + " --seed " + seed + " --metrics " + metrics.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<double> out;
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    return out;
  };
  const std::vector<double> a = losses("5"), b = losses("5"), c = losses("6");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], c[0]);
  std::ifstream golden_file(SourcePath("models/golden/tiny_classifier.json"));
  const nlohmann::json golden = nlohmann::json::parse(golden_file);
  EXPECT_GT(std::abs(a[0] - golden["runs"][1]["losses"][0].get<double>()), 1e-4);  // not dropout-free
}

// What README.md's "Reproducibility" promises: on one machine a run repeats bit for bit, and onnxpipe's own kernels
// give the same bits for any ONNXPIPE_NUM_THREADS; another OpenBLAS kernel (another processor type, forced here with
// OPENBLAS_CORETYPE=Prescott, the baseline x86-64 kernel) agrees to rounding only.
TEST_F(TrainCliTest, RunsRepeatBitwiseOnOneMachineAndAgreeToRoundingAcrossBlasKernels) {
  auto metrics = [&](const std::string& env) {
    const fs::path m = dir_ / "m.jsonl";
    CommandResult r = RunCommand(env + " " + Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") +
                                 " --data " + data_.string() + " --batch 4 --steps 8 --optimizer adamw --lr 0.003 " +
                                 "--shuffle --seed 3 --freeze " + kClassifierFreeze + " --metrics " + m.string());
    EXPECT_EQ(r.exit_code, 0) << env << "\n" << r.err;
    return testing::MetricsWithoutTiming(m);
  };
  const std::vector<nlohmann::json> a = metrics("");
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(metrics(""), a);
  EXPECT_EQ(metrics("ONNXPIPE_NUM_THREADS=1"), a);
  EXPECT_EQ(metrics("ONNXPIPE_NUM_THREADS=3"), a);
  const std::vector<nlohmann::json> other_kernel = metrics("OPENBLAS_CORETYPE=Prescott");
  ASSERT_EQ(other_kernel.size(), a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double x = other_kernel[k][key].get<double>(), ref = a[k][key].get<double>();
      EXPECT_NEAR(x, ref, 1e-5 * std::abs(ref)) << key << " at step " << k + 1;
    }
  }
}

// On a terminal the progress line is rewritten in place with \r (util-linux `script` gives the
// command a pseudo-terminal).
TEST_F(TrainCliTest, ProgressLineOnATerminal) {
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1)";
  const std::string cmd = Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                          data_.string() + " --batch 4 --steps 3 --optimizer sgd --lr 0.01 --no-dropout";
  CommandResult r = RunCommand("script -qec '" + cmd + "' /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("\rstep 2/3  loss"));
  EXPECT_THAT(r.out, HasSubstr("\rstep 3/3  loss"));
}

TEST_F(TrainCliTest, MissingNpyIsNamed) {
  fs::remove(data_ / "tokens.npy");
  CommandResult r = Train("--steps 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("tokens.npy is missing"));
}

TEST_F(TrainCliTest, WrongDtypeIsNamed) {
  absl::StatusOr<ir::Tensor> t = data::ReadNpy((data_ / "tokens.npy").string());
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(data::WriteNpy((data_ / "tokens.npy").string(), t->CastTo(ir::DType::kF32)).ok());
  CommandResult r = Train("--steps 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'tokens' expects dtype i64 but the file holds f32"));
}

TEST_F(TrainCliTest, SequenceLengthMismatchIsNamed) {
  CommandResult r = Train("--steps 1 --seq 32");  // the data has 64 tokens per row
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("'tokens' dim 1 ('S') is 64 but it is bound to 32"));
}

TEST_F(TrainCliTest, LabelOutOfRangeNamesTheRow) {
  absl::StatusOr<ir::Tensor> t = data::ReadNpy((data_ / "labels.npy").string());
  ASSERT_TRUE(t.ok());
  ir::Tensor labels = t->Clone();
  labels.mutable_data<int64_t>()[7] = 2;  // two classes: 0 and 1
  ASSERT_TRUE(data::WriteNpy((data_ / "labels.npy").string(), labels).ok());
  CommandResult r = Train("--steps 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("labels.npy row 7: label 2 is out of range [0, 2)"));
}

TEST_F(TrainCliTest, FewerRowsThanTheBatch) {
  CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                               data_.string() + " --batch 32 --steps 1 --optimizer sgd --lr 0.1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("20 rows (samples), fewer than --batch 32"));
}

TEST_F(TrainCliTest, DivergenceWithCheckNumericsNamesANode) {
  // A huge learning rate makes the second forward pass overflow.
  CommandResult r = Train("--steps 3 --lr 1e30 --check-numerics");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("step 1: stage 0, micro-batch 0, forward node '"));
  EXPECT_THAT(r.err, HasSubstr("produced a non-finite value"));
  // Without the flag the loss check stops the run and points at the flag.
  r = Train("--steps 3 --lr 1e30");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rerun with --check-numerics"));
}

TEST_F(TrainCliTest, UsageErrors) {
  CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                               data_.string() + " --batch 4 --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--lr is required"));
  r = Train("--steps 1 --optimizer adam");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("sgd or adamw"));
  r = Train("--steps 1 --dtype fp16");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--dtype expects fp32, fp64 or bf16, got 'fp16'"));
  r = Train("--steps 1 --schedule linear");  // the learning-rate schedule has its own flag
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("the learning-rate schedule is --lr-schedule"));
  r = Train("--steps 1 --resume");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--resume needs --checkpoint-dir"));
  r = Train("--steps 1 --stages 2 --resume");  // the same checks pipelined
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--resume needs --checkpoint-dir"));
  r = RunCommand(Onnxpipe() + " train --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* flag : {"--data",
                           "--batch",
                           "--steps",
                           "--optimizer",
                           "--lr",
                           "--momentum",
                           "--weight-decay",
                           "--nesterov",
                           "--beta1",
                           "--beta2",
                           "--eps",
                           "--clip-norm",
                           "--warmup-steps",
                           "--lr-schedule",
                           "--schedule",
                           "--logits",
                           "--labels",
                           "--metrics",
                           "--backend",
                           "--dtype",
                           "--freeze",
                           "--seed",
                           "--shuffle",
                           "--dropout",
                           "--check-numerics",
                           "--label-smoothing",
                           "--ignore-index",
                           "--seq",
                           "--data-format",
                           "--vocab-size",
                           "--eval",
                           "--save",
                           "--checkpoint-dir",
                           "--checkpoint-every",
                           "--resume",
                           "--tensorboard"}) {
    EXPECT_THAT(r.out, HasSubstr(flag));
  }
}

TEST_F(TrainCliTest, AdamWWithScheduleClippingAndCheckpoint) {
  const fs::path metrics = dir_ / "m.jsonl", ckpt = dir_ / "trained.onnx";
  CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                               data_.string() + " --batch 4 --steps 4 --optimizer adamw --lr 0.002 --warmup-steps 2" +
                               " --lr-schedule linear --clip-norm 0.5 --shuffle --seed 3 --freeze " +
                               kClassifierFreeze + " --metrics " + metrics.string() + " --save " + ckpt.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(metrics);
  std::vector<double> lrs;
  std::string line;
  while (std::getline(in, line)) lrs.push_back(nlohmann::json::parse(line)["lr"].get<double>());
  // Warm-up 0.001, 0.002, then linear decay over the remaining 2 steps: 0.002, 0.001.
  ASSERT_EQ(lrs.size(), 4u);
  EXPECT_DOUBLE_EQ(lrs[0], 0.001);
  EXPECT_DOUBLE_EQ(lrs[1], 0.002);
  EXPECT_DOUBLE_EQ(lrs[2], 0.002);
  EXPECT_DOUBLE_EQ(lrs[3], 0.001);
  EXPECT_TRUE(fs::exists(ckpt));
  // The checkpoint is a model `onnxpipe inspect` accepts.
  CommandResult inspect = RunCommand(Onnxpipe() + " inspect " + ckpt.string());
  EXPECT_EQ(inspect.exit_code, 0) << inspect.err;
}

// --eval on npy data reads DIR/test/; its accuracy and loss equal a hand computation over the logits that
// `onnxpipe run` gives for the saved model on the same rows.
TEST_F(TrainCliTest, NpyEvalMatchesAHandComputationOverTheLogits) {
  fs::copy(data_, dir_ / "test");
  fs::rename(dir_ / "test", data_ / "test");
  const fs::path metrics = dir_ / "m.jsonl", saved = dir_ / "trained.onnx", out = dir_ / "out";
  CommandResult r = Train("--steps 6 --eval --metrics " + metrics.string() + " --save " + saved.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand(Onnxpipe() + " run " + saved.string() + " --inputs " + (data_ / "test").string() + " --out " +
                 out.string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  absl::StatusOr<ir::Tensor> logits = data::ReadNpy((out / "logits.npy").string());
  absl::StatusOr<ir::Tensor> labels = data::ReadNpy((data_ / "test" / "labels.npy").string());
  ASSERT_TRUE(logits.ok() && labels.ok());
  const int64_t n = labels->num_elements(), c = logits->dims()[1];
  int64_t correct = 0;
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* z = logits->data<float>() + i * c;
    const int64_t y = labels->data<int64_t>()[i];
    int64_t arg = 0;
    double sum = 0;
    for (int64_t k = 0; k < c; ++k) {
      if (z[k] > z[arg]) arg = k;
      sum += std::exp(static_cast<double>(z[k]));
    }
    correct += arg == y;
    loss += std::log(sum) - z[y];
  }
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  const nlohmann::json ev = nlohmann::json::parse(last);
  EXPECT_EQ(ev["split"], "test");
  EXPECT_DOUBLE_EQ(ev["accuracy"].get<double>(), static_cast<double>(correct) / n);
  EXPECT_NEAR(ev["loss"].get<double>(), loss / n, 1e-5);
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("error")));
}

// What `train` froze and why, one line per reason, and --train-only/--freeze overriding the rule (the Llama dynamo
// export of the Hugging Face corpus: 27 float initializers, 21 of them the module's parameters).
TEST(TrainCliFreezeTest, PrintsWhatTheRuleFrozeAndTheFlagsOverrideIt) {
  const std::string dir = SourcePath("models/hf/llama_dynamo18_sdpa_dyn");
  const std::string base = Onnxpipe() + " train " + dir + "/model.onnx --data " + dir +
                           "/train --batch 4 --steps 1 --optimizer sgd --lr 0.01 ";
  CommandResult r = RunCommand(base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("parameters: 21 of 27 float initializers trained; not trained:\n"));
  EXPECT_THAT(r.out, HasSubstr("positional buffers (multiplied by positions before meeting activations: rotary "
                               "inv_freq, ALiBi slopes): 1 (m.model.rotary_emb.inv_freq)\n"));
  EXPECT_THAT(r.out, HasSubstr("rank-0 exporter literals (eps, scales, exponents, fill values): 4 ("));
  EXPECT_THAT(r.out, HasSubstr("mask fill values (inf, NaN or finfo.min/max): 1 ("));
  EXPECT_THAT(r.out, HasSubstr("5968 trainable parameters"));  // PyTorch's count (zoo.json)
  // Only the RMSNorm scales (3 x 16) but the post-attention ones (--freeze wins).
  r = RunCommand(base + "--train-only norm --freeze post_attention");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("parameters: 3 of 27 float initializers trained"));
  EXPECT_THAT(r.out, HasSubstr("matched by --freeze: 2 (m.model.layers.0.post_attention_layernorm.weight, "
                               "m.model.layers.1.post_attention_layernorm.weight)"));
  EXPECT_THAT(r.out, HasSubstr("not matched by --train-only: 22 ("));
  EXPECT_THAT(r.out, HasSubstr("48 trainable parameters"));
  // --train-only trains a literal the rule freezes (the attention scale is then a learned input).
  r = RunCommand(base + "--train-only '^(val_147|m\\.model\\.norm\\.weight)$'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("17 trainable parameters"));
  r = RunCommand(base + "--train-only '('");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--train-only regex '('"));
}

// The exports that needed --freeze before the exporter rules: BART's final_logits_bias (a buffer by the dynamo
// export's torch.export signature, an all-zero (1, V) row in the TorchScript export) and the position embedding a
// fixed-shape dynamo export folds into a constant the signature does not name. `train` says which rule froze them.
TEST(TrainCliFreezeTest, PrintsTheExporterRulesWithoutAFreezeFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"bart_dynamo18_eager_dyn",
       "buffers by the file's torch.export signature (registered buffers, lifted tensor "
       "constants): 1 (m.final_logits_bias)\n"},
      {"bart_ts17_eager_dyn",
       "all-zero (1, ..., 1, N) rows added to activations (zero buffers such as BART's "
       "final_logits_bias): 1 (m.final_logits_bias)\n"},
      {"gpt2_dynamo18_eager_fixed",
       "exporter-made constants (the file's torch.export signature names no parameter "
       "for them: folded module state, e.g. a position table gathered at fixed "
       "positions): 1 (embedding_1)\n"},
  };
  for (const auto& [model, line] : cases) {
    const std::string dir = SourcePath(std::string("models/hf/") + model);
    CommandResult r =
        RunCommand(Onnxpipe() + " train " + dir + "/model.onnx --data " + dir +
                   "/train --batch 4 --steps 1 --optimizer sgd --lr 0.01 --logits logits --labels labels");
    ASSERT_EQ(r.exit_code, 0) << model << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr(line)) << model;
  }
}

}  // namespace
}  // namespace onnxpipe
