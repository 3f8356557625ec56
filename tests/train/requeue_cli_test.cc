// Restartable jobs through the built binary, the pattern of a Slurm requeue or a supervisor: the same command line
// with `--resume auto` starts fresh when --checkpoint-dir holds no checkpoint and continues from `latest` when it
// does; SIGTERM finishes the step, saves a checkpoint and exits 0. The reference is an uninterrupted run of the
// same command without --resume: its losses and its final parameters and optimizer state, bit for bit (resume is
// bitwise on one machine: resume_cli_test.cc).
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include "executor/io/checkpoint.h"
#include "executor/io/checkpoint_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_util.h"
#include "tests/train/metrics_lines.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using testing::Child;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::MetricsWithoutTiming;
using ::testing::Not;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;
using testing::Spawn;
using testing::WaitForOutput;

class RequeueCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("requeue_cli"); }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // A run long enough for a signal to land mid-way (a few seconds), with a cosine schedule so that the learning
  // rate of every step depends on --steps: a resumed run must continue the same schedule.
  std::string Command(const std::string& name, const std::string& extra) const {
    return Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
           SourcePath("models/golden/tiny_classifier/data") +
           " --batch 4 --steps 300 --optimizer adamw --lr 0.01 --lr-schedule cosine --warmup-steps 5 --shuffle "
           "--seed 3 --freeze '^pos\\.table$' --log-every 10 --checkpoint-dir " +
           (dir_ / name).string() + " --metrics " + (dir_ / (name + ".jsonl")).string() + " " + extra;
  }

  static void ExpectSameState(const fs::path& a, const fs::path& b, int64_t step) {
    absl::StatusOr<io::Checkpoint> ca = io::CheckpointManager(a.string(), 0).LoadLatest();
    absl::StatusOr<io::Checkpoint> cb = io::CheckpointManager(b.string(), 0).LoadLatest();
    ASSERT_TRUE(ca.ok()) << ca.status();
    ASSERT_TRUE(cb.ok()) << cb.status();
    EXPECT_EQ(ca->metadata.step, step);
    EXPECT_EQ(cb->metadata.step, step);
    ASSERT_EQ(ca->tensors.size(), cb->tensors.size());
    for (size_t i = 0; i < ca->tensors.size(); ++i) {
      EXPECT_EQ(ca->tensors[i].name, cb->tensors[i].name);
      EXPECT_TRUE(ca->tensors[i].tensor.BitwiseEquals(cb->tensors[i].tensor)) << ca->tensors[i].name;
    }
  }

  fs::path dir_;
};

TEST_F(RequeueCliTest, SigtermCheckpointsAndExitsZeroThenResumeAutoEqualsAnUninterruptedRun) {
  CommandResult ref = RunCommand(Command("ref", ""));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;

  // First start: nothing to resume yet.
  Child c = Spawn(Command("job", "--resume auto"), dir_, "first");
  ASSERT_TRUE(WaitForOutput(c, "step 20/")) << testing::ReadAll(c.err.string());
  ASSERT_EQ(kill(c.pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << testing::ReadAll(c.err.string());
  const std::string first = testing::ReadAll(c.out.string());
  EXPECT_THAT(first,
              HasSubstr("resume auto: no checkpoint in " + (dir_ / "job").string() + " yet, starting from step 0"));
  ASSERT_THAT(first, HasSubstr("interrupted (SIGTERM) after step "));
  absl::StatusOr<io::Checkpoint> saved = io::CheckpointManager((dir_ / "job").string(), 0).LoadLatest();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_LT(saved->metadata.step, 300);
  EXPECT_THAT(first, HasSubstr("after step " + std::to_string(saved->metadata.step) + "/300"));

  // The requeued job: the same command line continues from the checkpoint.
  CommandResult again = RunCommand(Command("job", "--resume auto"));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_THAT(again.out, HasSubstr("resumed from "));
  EXPECT_THAT(again.out, HasSubstr("at step " + std::to_string(saved->metadata.step)));
  EXPECT_THAT(again.out, Not(HasSubstr("starting from step 0")));

  const std::vector<nlohmann::json> want = MetricsWithoutTiming(dir_ / "ref.jsonl");
  ASSERT_EQ(want.size(), 300u);
  EXPECT_EQ(MetricsWithoutTiming(dir_ / "job.jsonl"), want);
  ExpectSameState(dir_ / "ref", dir_ / "job", 300);
}

TEST_F(RequeueCliTest, PlainResumeStillRequiresACheckpointAndNamesTheFolder) {
  CommandResult r = RunCommand(Command("none", "--resume"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--checkpoint-dir " + (dir_ / "none").string() + " holds no checkpoint yet"));
  EXPECT_THAT(r.err, HasSubstr("--resume auto"));
  r = RunCommand(Command("bad", "--resume=sometimes"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--resume expects no value"));
  EXPECT_THAT(r.err, HasSubstr("got 'sometimes'"));
}

}  // namespace
}  // namespace onnxpipe
