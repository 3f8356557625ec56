// `onnxpipe train --checkpoint-dir/--resume` through the built binary: 10 steps equal 5 steps + resume to 10, bit
// for bit (metrics and every saved tensor), for fp32/fp64/bf16 (whose checkpoints hold the fp32 masters and their
// bf16 compute copies; one without the copies resumes the same) and
// SGD-momentum/AdamW with --shuffle and dropout on;
// checkpoints of another model, optimizer or dtype and corrupt ones are refused naming the file; SIGINT saves and
// exits 130; kill -9 at any moment leaves a loadable latest checkpoint the run resumes from.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

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
using testing::Child;
using testing::CommandResult;
using testing::MetricsWithoutTiming;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;
using testing::Spawn;
using testing::WaitForOutput;

class ResumeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("resume_cli");
    data_ = SourcePath("models/golden/tiny_classifier/data");  // 20 rows: 10 steps of 4 cross an epoch
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string Command(const std::string& model, const std::string& extra) {
    return Onnxpipe() + " train " + model + " --data " + data_ +
           " --batch 4 --lr 0.01 --shuffle --seed 7 --freeze '^pos\\.table$' " + extra;
  }
  CommandResult Train(const std::string& extra) {
    return RunCommand(Command(SourcePath("models/tiny_classifier.onnx"), extra));
  }

  fs::path dir_;
  std::string data_;
};

struct ResumeCase {
  std::string dtype, optimizer;
};
void PrintTo(const ResumeCase& c, std::ostream* os) { *os << c.dtype << " " << c.optimizer; }

class ResumeBitwiseTest : public ResumeCliTest, public ::testing::WithParamInterface<ResumeCase> {};

TEST_P(ResumeBitwiseTest, TenStepsEqualFivePlusResumedFive) {
  const ResumeCase& p = GetParam();
  const std::string opt = p.optimizer == "sgd" ? "--optimizer sgd --momentum 0.9 --weight-decay 0.01"
                                               : "--optimizer adamw --weight-decay 0.01";
  // --steps is the total step count; the learning rate (warm-up, then constant) depends on the step only.
  const std::string common = "--dtype " + p.dtype + " " + opt + " --warmup-steps 2 ";
  const fs::path a = dir_ / "a", b = dir_ / "b";
  CommandResult r = Train(common + "--steps 10 --checkpoint-dir " + a.string() + " --metrics " +
                          (dir_ / "a.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Train(common + "--steps 5 --checkpoint-dir " + b.string() + " --metrics " + (dir_ / "b.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "b.jsonl").size(), 5u);
  if (p.dtype == "bf16") {
    // A checkpoint written before the bf16 compute copies were optimizer state has none: the resumed run casts
    // them from the masters, and is the same run.
    absl::StatusOr<io::Checkpoint> c5 = io::CheckpointManager(b.string(), 0).LoadLatest();
    ASSERT_TRUE(c5.ok()) << c5.status();
    const size_t before = c5->tensors.size();
    std::erase_if(c5->tensors, [](const io::NamedTensor& t) { return t.name.ends_with("/compute_bf16"); });
    ASSERT_LT(c5->tensors.size(), before);
    ASSERT_TRUE(io::SaveCheckpoint(c5->path, *c5).ok());
  }
  r = Train(common + "--steps 10 --resume --checkpoint-dir " + b.string() + " --metrics " +
            (dir_ / "b.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step 5"));
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "b.jsonl"), MetricsWithoutTiming(dir_ / "a.jsonl"));
  ASSERT_EQ(MetricsWithoutTiming(dir_ / "a.jsonl").size(), 10u);

  absl::StatusOr<io::Checkpoint> ca = io::CheckpointManager(a.string(), 0).LoadLatest();
  absl::StatusOr<io::Checkpoint> cb = io::CheckpointManager(b.string(), 0).LoadLatest();
  ASSERT_TRUE(ca.ok()) << ca.status();
  ASSERT_TRUE(cb.ok()) << cb.status();
  EXPECT_EQ(ca->metadata.step, 10);
  EXPECT_EQ(cb->metadata.step, 10);
  ASSERT_EQ(ca->tensors.size(), cb->tensors.size());
  ASSERT_GT(ca->tensors.size(), 28u);  // parameters and their optimizer state
  int copies = 0;
  for (size_t i = 0; i < ca->tensors.size(); ++i) {
    EXPECT_EQ(ca->tensors[i].name, cb->tensors[i].name);
    EXPECT_TRUE(ca->tensors[i].tensor.BitwiseEquals(cb->tensors[i].tensor)) << ca->tensors[i].name;
    const bool copy = ca->tensors[i].name.ends_with("/compute_bf16");  // a bf16 run's compute copy
    copies += copy;
    EXPECT_EQ(ir::DTypeName(ca->tensors[i].tensor.dtype()), p.dtype == "fp64" ? "f64" : copy ? "bf16" : "f32");
  }
  EXPECT_EQ(copies > 0, p.dtype == "bf16");
}

INSTANTIATE_TEST_SUITE_P(DtypesAndOptimizers, ResumeBitwiseTest,
                         ::testing::Values(ResumeCase{"fp32", "sgd"}, ResumeCase{"fp32", "adamw"},
                                           ResumeCase{"fp64", "sgd"}, ResumeCase{"fp64", "adamw"},
                                           ResumeCase{"bf16", "sgd"}, ResumeCase{"bf16", "adamw"}),
                         [](const auto& info) { return info.param.dtype + "_" + info.param.optimizer; });

TEST_F(ResumeCliTest, MismatchedOrCorruptCheckpointsAreRefused) {
  const fs::path ck = dir_ / "ck";
  CommandResult r = Train("--optimizer sgd --momentum 0.9 --steps 2 --checkpoint-dir " + ck.string() +
                          " --save " + (dir_ / "other.onnx").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string file = (ck / "step_2.ckpt").string();

  r = Train("--optimizer adamw --steps 4 --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' holds the state of optimizer 'sgd'"));
  r = Train("--optimizer sgd --momentum 0.9 --dtype fp64 --steps 4 --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' was written with dtype 'f32', but this run has 'f64'"));
  // bf16's state tensors are f32 like an fp32 run's, but it is another computation.
  r = Train("--optimizer sgd --momentum 0.9 --dtype bf16 --steps 4 --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' was written with dtype 'f32', but this run has 'bf16'"));
  r = RunCommand(Command((dir_ / "other.onnx").string(),
                         "--optimizer sgd --momentum 0.9 --steps 4 --resume --checkpoint-dir " + ck.string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("checkpoint '" + file + "' was written for another model file"));
  r = Train("--optimizer sgd --steps 4 --resume --checkpoint-dir " + ck.string());  // no momentum buffers
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(file));
  r = Train("--optimizer sgd --momentum 0.9 --steps 4 --resume --checkpoint-dir " + (dir_ / "none").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("holds no checkpoint yet"));

  // One flipped byte in the tensor data.
  std::string bytes = testing::ReadAll(file);
  bytes[bytes.size() - 100] ^= 0x01;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  r = Train("--optimizer sgd --momentum 0.9 --steps 4 --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(file));
  EXPECT_THAT(r.err, HasSubstr("CRC"));
}

TEST_F(ResumeCliTest, SigintSavesACheckpointAndExitsCleanly) {
  const fs::path ck = dir_ / "ck";
  Child c = Spawn(Command(SourcePath("models/tiny_classifier.onnx"),
                          "--optimizer adamw --steps 1000000 --checkpoint-dir " + ck.string()),
                  dir_, "sigint");
  ASSERT_TRUE(WaitForOutput(c, "step 3/")) << testing::ReadAll(c.err.string());
  ASSERT_EQ(kill(c.pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 130) << testing::ReadAll(c.err.string());
  const std::string out = testing::ReadAll(c.out.string());
  EXPECT_THAT(out, HasSubstr("interrupted (SIGINT) after step "));
  EXPECT_THAT(out, HasSubstr("continue with the same command and --resume"));
  absl::StatusOr<io::Checkpoint> latest = io::CheckpointManager(ck.string(), 0).LoadLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_GE(latest->metadata.step, 3);
  EXPECT_THAT(out, HasSubstr("after step " + std::to_string(latest->metadata.step) + "/1000000"));
  // It resumes from there.
  CommandResult r = Train("--optimizer adamw --steps " + std::to_string(latest->metadata.step + 2) +
                          " --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("at step " + std::to_string(latest->metadata.step)));
}

// kill -9 at several moments of a run that checkpoints every step: the latest checkpoint always loads and the run
// resumes from it (the checkpoint writes are atomic: temp file, fsync, rename).
TEST_F(ResumeCliTest, KillDashNineLeavesALoadableLatestCheckpoint) {
  const fs::path ck = dir_ / "ck";
  int64_t previous = -1;
  for (int round = 0; round < 6; ++round) {
    const std::string resume = previous >= 0 ? " --resume" : "";
    Child c = Spawn(Command(SourcePath("models/tiny_classifier.onnx"),
                            "--optimizer adamw --steps 1000000 --checkpoint-every 1 --checkpoint-dir " +
                                ck.string() + " --metrics " + (dir_ / "m.jsonl").string() + resume),
                    dir_, "kill" + std::to_string(round));
    ASSERT_TRUE(WaitForOutput(c, "checkpoint: ")) << testing::ReadAll(c.err.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * round));
    ASSERT_EQ(kill(c.pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
    ASSERT_TRUE(WIFSIGNALED(status));
    absl::StatusOr<io::Checkpoint> latest = io::CheckpointManager(ck.string(), 3).LoadLatest();
    ASSERT_TRUE(latest.ok()) << "round " << round << ": " << latest.status();
    EXPECT_GT(latest->metadata.step, previous);
    previous = latest->metadata.step;
  }
  CommandResult r = Train("--optimizer adamw --steps " + std::to_string(previous + 1) + " --checkpoint-dir " +
                          ck.string() + " --resume --metrics " + (dir_ / "m.jsonl").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The metrics hold every step once, in order: lines logged after a killed run's last checkpoint were dropped.
  const std::vector<nlohmann::json> m = MetricsWithoutTiming(dir_ / "m.jsonl");
  ASSERT_EQ(m.size(), static_cast<size_t>(previous + 1));
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["step"].get<int64_t>(), static_cast<int64_t>(i));
}

}  // namespace
}  // namespace onnxpipe
