// `onnxpipe train --stages K --microbatches M --checkpoint-dir/--resume` through the built binary: 6 steps equal 3
// steps + resume to 6 bit for bit (metrics and every saved parameter and optimizer-state tensor) for tiny_gpt (tied
// embedding) and tiny_classifier, fp32 and fp64, SGD-momentum and AdamW, K = 2 and 3, M = 2, dropout on and
// --shuffle; an unpartitioned checkpoint resumes pipelined and the other way round (bitwise with one micro-batch,
// within rounding with two); another optimizer's or model's checkpoint is refused naming the file; SIGINT finishes
// the pipelined step, saves and exits 130.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "executor/io/checkpoint.h"
#include "executor/io/checkpoint_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_util.h"
#include "tests/train/metrics_lines.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::CommandResult;
using testing::MetricsWithoutTiming;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

struct Model {
  std::string name, freeze;
};
const Model kGpt{"tiny_gpt", "'^blocks\\..\\.attn\\.mask$'"};
const Model kClassifier{"tiny_classifier", "'^pos\\.table$'"};

class PipelineResumeCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("pipeline_resume_cli"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // 20 rows of golden data, batch 4: 6 steps cross an epoch (a new --shuffle permutation).
  std::string Command(const Model& m, const std::string& extra, const std::string& model_file = "") {
    return Onnxpipe() + " train " + (model_file.empty() ? SourcePath("models/" + m.name + ".onnx") : model_file) +
           " --data " + SourcePath("models/golden/" + m.name + "/data") +
           " --batch 4 --lr 0.01 --shuffle --seed 7 --warmup-steps 2 --freeze " + m.freeze + " " + extra;
  }
  CommandResult Train(const Model& m, const std::string& extra) { return RunCommand(Command(m, extra)); }

  // Trains `extra` + --steps `steps` into checkpoint folder `name` with metrics `name`.jsonl.
  void Run(const Model& m, const std::string& extra, int steps, const std::string& name, bool resume = false) {
    CommandResult r = Train(m, extra + " --steps " + std::to_string(steps) + (resume ? " --resume" : "") +
                                   " --checkpoint-dir " + (dir_ / name).string() + " --metrics " +
                                   (dir_ / (name + ".jsonl")).string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (resume) {
      EXPECT_THAT(r.out, HasSubstr("resumed from "));
    }
  }
  io::Checkpoint Latest(const std::string& name) {
    absl::StatusOr<io::Checkpoint> c = io::CheckpointManager((dir_ / name).string(), 0).LoadLatest();
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : io::Checkpoint();
  }
  // Every tensor of the two runs' latest checkpoints bitwise equal (and at least `min_tensors` of them).
  void ExpectSameState(const std::string& a, const std::string& b, size_t min_tensors) {
    const io::Checkpoint ca = Latest(a), cb = Latest(b);
    EXPECT_EQ(ca.metadata.step, cb.metadata.step);
    ASSERT_EQ(ca.tensors.size(), cb.tensors.size());
    EXPECT_GE(ca.tensors.size(), min_tensors);
    for (size_t i = 0; i < ca.tensors.size(); ++i) {
      EXPECT_EQ(ca.tensors[i].name, cb.tensors[i].name);
      EXPECT_TRUE(ca.tensors[i].tensor.BitwiseEquals(cb.tensors[i].tensor)) << ca.tensors[i].name;
    }
  }

  fs::path dir_;
};

struct ResumeCase {
  Model model;
  std::string dtype, optimizer;
  int stages = 2;
};
void PrintTo(const ResumeCase& c, std::ostream* os) {
  *os << c.model.name << " " << c.dtype << " " << c.optimizer << " K=" << c.stages;
}

class PipelineResumeBitwiseTest : public PipelineResumeCliTest, public ::testing::WithParamInterface<ResumeCase> {};

TEST_P(PipelineResumeBitwiseTest, SixStepsEqualThreePlusResumedThree) {
  const ResumeCase& p = GetParam();
  const std::string flags = "--dtype " + p.dtype +
                            (p.optimizer == "sgd" ? " --optimizer sgd --momentum 0.9" : " --optimizer adamw") +
                            " --weight-decay 0.01 --stages " + std::to_string(p.stages) + " --microbatches 2";
  Run(p.model, flags, 6, "whole");
  Run(p.model, flags, 3, "split");
  EXPECT_EQ(Latest("split").metadata.step, 3);
  Run(p.model, flags, 6, "split", /*resume=*/true);
  const std::vector<nlohmann::json> whole = MetricsWithoutTiming(dir_ / "whole.jsonl");
  ASSERT_EQ(whole.size(), 6u);
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "split.jsonl"), whole);
  // Parameters and their optimizer state (momentum, or both Adam moments), in the training dtype.
  const io::Checkpoint c = Latest("whole");
  size_t states = 0;
  for (const io::NamedTensor& t : c.tensors) {
    states += t.name.find("/momentum") != std::string::npos || t.name.find("/adam_") != std::string::npos;
    EXPECT_EQ(ir::DTypeName(t.tensor.dtype()), p.dtype == "fp64" ? "f64" : "f32") << t.name;
  }
  EXPECT_EQ(states, (p.optimizer == "sgd" ? 1u : 2u) * (c.tensors.size() - states));
  ExpectSameState("whole", "split", 10);
}

INSTANTIATE_TEST_SUITE_P(
    ModelsDtypesOptimizers, PipelineResumeBitwiseTest,
    ::testing::Values(ResumeCase{kGpt, "fp32", "sgd", 2}, ResumeCase{kGpt, "fp32", "adamw", 3},
                      ResumeCase{kGpt, "fp64", "sgd", 3}, ResumeCase{kGpt, "fp64", "adamw", 2},
                      ResumeCase{kClassifier, "fp32", "sgd", 3}, ResumeCase{kClassifier, "fp32", "adamw", 2},
                      ResumeCase{kClassifier, "fp64", "sgd", 2}, ResumeCase{kClassifier, "fp64", "adamw", 3}),
    [](const auto& info) {
      return info.param.model.name + "_" + info.param.dtype + "_" + info.param.optimizer + "_K" +
             std::to_string(info.param.stages);
    });

// The pipelined trainer runs the unpartitioned trainer's graph and saves its state under the same names: with one
// micro-batch each continues the other's run bit for bit.
TEST_F(PipelineResumeCliTest, UnpartitionedAndPipelinedResumeEachOtherBitwiseWithOneMicrobatch) {
  const std::string flags = "--dtype fp32 --optimizer adamw --weight-decay 0.01";
  const std::string piped = flags + " --stages 2 --microbatches 1";
  Run(kGpt, flags, 6, "plain");
  Run(kGpt, flags, 3, "to_piped");
  Run(kGpt, piped, 6, "to_piped", /*resume=*/true);
  Run(kGpt, piped, 3, "to_plain");
  Run(kGpt, flags, 6, "to_plain", /*resume=*/true);
  const std::vector<nlohmann::json> want = MetricsWithoutTiming(dir_ / "plain.jsonl");
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "to_piped.jsonl"), want);
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "to_plain.jsonl"), want);
  ExpectSameState("plain", "to_piped", 10);
  ExpectSameState("plain", "to_plain", 10);
}

// Two micro-batches sum each gradient in two parts: the same run to rounding (fp64 here).
TEST_F(PipelineResumeCliTest, UnpartitionedAndPipelinedResumeEachOtherWithinRoundingWithTwoMicrobatches) {
  const std::string flags = "--dtype fp64 --optimizer sgd --momentum 0.9";
  const std::string piped = flags + " --stages 3 --microbatches 2";
  Run(kClassifier, flags, 6, "plain");
  Run(kClassifier, flags, 3, "to_piped");
  Run(kClassifier, piped, 6, "to_piped", /*resume=*/true);
  Run(kClassifier, piped, 3, "to_plain");
  Run(kClassifier, flags, 6, "to_plain", /*resume=*/true);
  const std::vector<nlohmann::json> want = MetricsWithoutTiming(dir_ / "plain.jsonl");
  ASSERT_EQ(want.size(), 6u);
  for (const char* run : {"to_piped", "to_plain"}) {
    const std::vector<nlohmann::json> got = MetricsWithoutTiming(dir_ / (std::string(run) + ".jsonl"));
    ASSERT_EQ(got.size(), want.size()) << run;
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(got[k]["step"], want[k]["step"]);
      EXPECT_NEAR(got[k]["loss"].get<double>(), want[k]["loss"].get<double>(), 1e-12) << run << " step " << k;
      EXPECT_NEAR(got[k]["grad_norm"].get<double>(), want[k]["grad_norm"].get<double>(), 1e-12) << run;
    }
    const io::Checkpoint a = Latest("plain"), b = Latest(run);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      const ir::Tensor& x = a.tensors[i].tensor;
      const ir::Tensor& y = b.tensors[i].tensor;
      ASSERT_EQ(x.dims(), y.dims()) << a.tensors[i].name;
      double worst = 0;
      for (int64_t j = 0; j < x.num_elements(); ++j) {
        worst = std::max(worst, std::abs(x.GetAsDouble(j) - y.GetAsDouble(j)));
      }
      EXPECT_LT(worst, 1e-12) << run << " " << a.tensors[i].name;
    }
  }
}

TEST_F(PipelineResumeCliTest, AnotherOptimizersOrModelsCheckpointIsRefusedNamingTheFile) {
  const std::string piped = " --stages 2 --microbatches 2";
  Run(kClassifier, "--optimizer sgd --momentum 0.9 --save " + (dir_ / "other.onnx").string() + piped, 2, "ck");
  const std::string file = (dir_ / "ck" / "step_2.ckpt").string();
  const std::string resume = " --steps 4 --resume --checkpoint-dir " + (dir_ / "ck").string();
  CommandResult r = Train(kClassifier, "--optimizer adamw" + piped + resume);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' holds the state of optimizer 'sgd'"));
  r = Train(kClassifier, "--optimizer sgd --momentum 0.9 --dtype fp64" + piped + resume);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' was written with dtype 'f32', but this run has 'f64'"));
  r = RunCommand(
      Command(kClassifier, "--optimizer sgd --momentum 0.9" + piped + resume, (dir_ / "other.onnx").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' was written for another model file"));
  r = Train(kClassifier, "--optimizer sgd" + piped + resume);  // no momentum buffers
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(file));
}

TEST_F(PipelineResumeCliTest, SigintFinishesThePipelinedStepSavesAndExits130) {
  const fs::path ck = dir_ / "ck";
  testing::Child c = testing::Spawn(
      Command(kGpt, "--optimizer adamw --steps 1000000 --stages 3 --microbatches 2 --checkpoint-dir " + ck.string()),
      dir_, "sigint");
  ASSERT_TRUE(testing::WaitForOutput(c, "step 2/")) << testing::ReadAll(c.err.string());
  ASSERT_EQ(kill(c.pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 130) << testing::ReadAll(c.err.string());
  const std::string out = testing::ReadAll(c.out.string());
  EXPECT_THAT(out, HasSubstr("continue with the same command and --resume"));
  const io::Checkpoint latest = Latest("ck");
  EXPECT_GE(latest.metadata.step, 2);
  EXPECT_THAT(out, HasSubstr("interrupted (SIGINT) after step " + std::to_string(latest.metadata.step) + "/1000000"));
  CommandResult r = Train(kGpt, "--optimizer adamw --stages 3 --microbatches 2 --steps " +
                                    std::to_string(latest.metadata.step + 1) + " --resume --checkpoint-dir " +
                                    ck.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step " + std::to_string(latest.metadata.step)));
}

}  // namespace
}  // namespace onnxpipe
