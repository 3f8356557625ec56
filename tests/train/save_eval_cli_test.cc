// `onnxpipe train --save/--eval/--tensorboard` through the built binary, checked by independent readers:
// onnxruntime (tests/train/ort_check.py: the saved model runs there with outputs equal to `onnxpipe run`'s, and the
// --eval accuracy and loss equal a hand computation over its logits) and the Python TensorBoard event reader
// (tests/io/read_tfevents.py: the scalars equal the metrics file's values, unpartitioned and pipelined); a
// pipelined --eval equals the unpartitioned one after the same training.
#include <bit>
#include <cstring>
#include <filesystem>
#include <regex>
#include <fstream>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"
#include "tests/train/text_corpus.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::CommandResult;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

class SaveEvalCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // onnxruntime is installed by scripts/setup.sh: a missing one is a failure, not a skip.
    ASSERT_TRUE(fs::exists(ONNXPIPE_ORT_PYTHON))
        << ONNXPIPE_ORT_PYTHON << " (Python with onnxruntime) is missing: run scripts/setup.sh --no-build";
    testing::PinBlasThreadsForBitwiseRuns();  // DataParallelRanksShareTheEvaluation
    dir_ = testing::MakeTempDir("save_eval_cli");
    testing::WriteTextCorpus(dir_ / "corpus", testing::MakeTextSplit(40, 3), testing::MakeTextSplit(15, 4));
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Trains `model` on the corpus with --save (and `extra` flags), then runs the onnxruntime check.
  void TrainAndCheck(const std::string& model, const std::string& extra, const std::string& check_flags,
                     bool eval = true) {
    const fs::path saved = dir_ / "out" / "model.onnx", metrics = dir_ / "m.jsonl";
    CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath(model) + " --data " + (dir_ / "corpus").string() +
                                 " --seq 12 --batch 8 --steps 40 --optimizer adamw --lr 0.003 --shuffle --seed 1" +
                                 (eval ? " --eval" : "") + " --save " + saved.string() + " --metrics " +
                                 metrics.string() + " " + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (eval) {
      EXPECT_THAT(r.out, HasSubstr("eval: {\"split\":\"test\",\"accuracy\":"));
    }
    r = RunCommand(std::string(ONNXPIPE_ORT_PYTHON) + " " + SourcePath("tests/train/ort_check.py") + " --onnxpipe " +
                   Onnxpipe() + " --model " + SourcePath(model) + " --saved " + saved.string() + " --vocab " +
                   (dir_ / "out" / "model.vocab.txt").string() + " --tsv " + (dir_ / "corpus" / "test.tsv").string() +
                   " --metrics " + metrics.string() + " --seq 12 " + check_flags);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["rows"], 30);
    EXPECT_GT(j["accuracy"].get<double>(), 0.8);  // the two classes' words differ: clearly learnt
  }

  fs::path dir_;
};

TEST_F(SaveEvalCliTest, ClassifierRunsInOnnxRuntimeAndEvalMatchesItsLogits) {
  TrainAndCheck("models/tiny_classifier.onnx", "", "");
}

// fp64 training saved in the model's f32, a mask input, and external data.
TEST_F(SaveEvalCliTest, Fp64BertWithMaskAndExternalData) {
  TrainAndCheck("models/tiny_bert.onnx", "--dtype fp64 --save-external-data always",
                "--mask-input attention_mask --expect-external");
}

// --save through the pipelined trainer (2 stages): the same checks but the --eval one.
TEST_F(SaveEvalCliTest, PipelinedSave) {
  TrainAndCheck("models/tiny_classifier.onnx", "--stages 2 --microbatches 2", "--no-eval", /*eval=*/false);
}

// The last metrics line (the eval) of a training run on the corpus; `launch`: a launcher prefix
// ("launch --nproc 2 --").
nlohmann::json EvalLine(const fs::path& dir, const std::string& extra, const std::string& launch = "",
                        std::string* out = nullptr) {
  const fs::path metrics = dir / "m.jsonl";
  CommandResult r = RunCommand(Onnxpipe() + " " + launch + " train " + SourcePath("models/tiny_classifier.onnx") +
                               " --data " + (dir / "corpus").string() + " --seq 12 --batch 8 --steps 6 " +
                               "--optimizer adamw --lr 0.003 --shuffle --seed 1 --eval --metrics " + metrics.string() +
                               " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (out != nullptr) *out = r.out;
  std::vector<std::string> lines;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  EXPECT_EQ(lines.size(), 7u);
  return lines.empty() ? nlohmann::json() : nlohmann::json::parse(lines.back());
}

// The eval line of a pipelined run against the unpartitioned one after the same training.
TEST_F(SaveEvalCliTest, PipelinedEvalEqualsUnpartitionedEval) {
  // One micro-batch: the very training and evaluation, bit for bit.
  const nlohmann::json plain = EvalLine(dir_, "");
  ASSERT_EQ(plain["split"], "test");
  EXPECT_EQ(EvalLine(dir_, "--stages 2 --microbatches 1"), plain);
  // Two micro-batches: the training to rounding (fp64).
  const nlohmann::json plain64 = EvalLine(dir_, "--dtype fp64");
  const nlohmann::json piped64 = EvalLine(dir_, "--dtype fp64 --stages 3 --microbatches 2");
  EXPECT_EQ(piped64["accuracy"], plain64["accuracy"]);
  EXPECT_NEAR(piped64["loss"].get<double>(), plain64["loss"].get<double>(), 1e-12);
}

// --eval runs on the training backend: over the checked backend (device memory the host must not touch) it is the
// CPU's evaluation bit for bit, unpartitioned and after a pipelined training; on a GPU within fp32 rounding.
TEST_F(SaveEvalCliTest, EvalRunsOnTheTrainingBackend) {
  const nlohmann::json plain = EvalLine(dir_, "");
  ASSERT_EQ(plain["split"], "test");
  EXPECT_EQ(EvalLine(dir_, "--backend checked"), plain);
  EXPECT_EQ(EvalLine(dir_, "--backend checked --stages 2 --microbatches 1"), plain);
  const fs::path metrics = dir_ / "gpu.jsonl";
  CommandResult gpu = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                                 (dir_ / "corpus").string() + " --seq 12 --batch 8 --steps 6 --optimizer adamw " +
                                 "--lr 0.003 --shuffle --seed 1 --eval --backend cuda --metrics " + metrics.string());
  if (gpu.exit_code != 0) GTEST_SKIP() << "no GPU here: " << gpu.err;
  EXPECT_THAT(gpu.out, Not(HasSubstr("ran on the host")));
  std::string last;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) last = line;
  const nlohmann::json on_gpu = nlohmann::json::parse(last);
  EXPECT_EQ(on_gpu["split"], "test");
  EXPECT_NEAR(on_gpu["loss"].get<double>(), plain["loss"].get<double>(), 1e-4 * plain["loss"].get<double>());
  // fp32 rounding may flip a near tie of the argmax: one prediction of the 30 at most.
  EXPECT_NEAR(on_gpu["accuracy"].get<double>(), plain["accuracy"].get<double>(), 1.5 / 30);
}

// Data-parallel ranks of one stage each evaluate every other batch and add their counts: the eval of one process
// that trained on the same micro-batches (the same training, bit for bit), the loss to the order of its sum.
TEST_F(SaveEvalCliTest, DataParallelRanksShareTheEvaluation) {
  std::string one_out, shared_out;
  const nlohmann::json one = EvalLine(dir_, "--microbatches 2", "", &one_out);
  const nlohmann::json shared = EvalLine(dir_, "--data-parallel 2", "launch --nproc 2 --", &shared_out);
  ASSERT_EQ(shared["split"], "test");
  // Each prediction scored once over the two ranks.
  std::smatch a, b;
  const std::regex scored(R"(\(([0-9]+) test samples, ([0-9]+) predictions scored\))");
  ASSERT_TRUE(std::regex_search(one_out, a, scored)) << one_out;
  ASSERT_TRUE(std::regex_search(shared_out, b, scored)) << shared_out;
  EXPECT_EQ(a[2], b[2]);
  EXPECT_EQ(a[1], a[2]);  // one prediction per text
  EXPECT_EQ(shared["accuracy"], one["accuracy"]);
  EXPECT_NEAR(shared["loss"].get<double>(), one["loss"].get<double>(), 1e-12 * std::abs(one["loss"].get<double>()));
}

// Unpartitioned and pipelined.
class TensorBoardCliTest : public SaveEvalCliTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(TensorBoardCliTest, ScalarsEqualTheMetrics) {
  const fs::path tb = dir_ / "tb", metrics = dir_ / "m.jsonl";
  CommandResult r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                               (dir_ / "corpus").string() + " --seq 12 --batch 8 --steps 3 --optimizer sgd --lr 0.05" +
                               " --eval --tensorboard " + tb.string() + " --metrics " + metrics.string() + " " +
                               GetParam());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(tb)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_THAT(files[0].filename().string(), HasSubstr("events.out.tfevents."));
  r = RunCommand(std::string(ONNXPIPE_PYTHON) + " " + SourcePath("tests/io/read_tfevents.py") + " " +
                 files[0].string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // Expected: per step loss, lr, grad_norm, samples_per_s as float32; then test/accuracy, test/loss at step 3.
  std::map<std::pair<int64_t, std::string>, float> want;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json m = nlohmann::json::parse(line);
    if (m.contains("split")) {
      want[{3, "test/accuracy"}] = m["accuracy"].get<double>();
      want[{3, "test/loss"}] = m["loss"].get<double>();
      continue;
    }
    for (const char* tag : {"loss", "lr", "grad_norm", "samples_per_s"}) {
      want[{m["step"].get<int64_t>(), tag}] = m[tag].get<double>();
    }
  }
  ASSERT_EQ(want.size(), 14u);
  std::map<std::pair<int64_t, std::string>, float> got;
  std::istringstream events(r.out);
  for (std::string line; std::getline(events, line);) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (!e.contains("values")) continue;
    for (const nlohmann::json& v : e["values"]) {
      got[{e["step"].get<int64_t>(), v["tag"].get<std::string>()}] =
          std::bit_cast<float>(v["simple_value_bits"].get<uint32_t>());
    }
  }
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Trainers, TensorBoardCliTest, ::testing::Values("", "--stages 2 --microbatches 2"),
                         [](const auto& info) { return info.param.empty() ? "Unpartitioned" : "Pipelined"; });

}  // namespace
}  // namespace onnxpipe
