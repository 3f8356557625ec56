// Multi-process training through the binary, on CPU ranks over the TCP comm: `onnxpipe launch` (and torchrun / srun
// variables set by hand) against the one-process run. Pipeline only (K = 2, 4) is bitwise the in-process run; data
// parallelism with one micro-batch per replica is bitwise one process running the D x M micro-batches (the gradient
// all-reduce folds the replicas in replica order, as the one process accumulates its micro-batches); with several
// micro-batches per replica the sum is grouped per replica and agrees within fp32 rounding. Checkpoints written by
// any K x D resume in one process, and kill -9 of a rank while they are written leaves the previous one; a killed rank,
// a stopped rank, a rank with bad data and a rank that never arrives end every rank within 10 s with an error naming
// it.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "executor/io/checkpoint_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/child_process.h"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using testing::Child;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Onnxpipe;
using testing::ReadAll;
using testing::RunCommand;
using testing::SourcePath;
using Clock = std::chrono::steady_clock;

// "train MODEL --data ... " for tiny_gpt with the flags every run here shares.
std::string TrainArgs(int64_t batch, int64_t steps) {
  return "train " + SourcePath("models/tiny_gpt.onnx") + " --data " + SourcePath("models/golden/tiny_gpt/data") +
         " --batch " + std::to_string(batch) + " --steps " + std::to_string(steps) +
         " --optimizer adamw --lr 1e-3 --clip-norm 1 --logits logits --freeze 'attn\\.mask$' ";
}

// (loss, grad_norm) of every step of a --metrics file.
std::vector<std::pair<double, double>> LossAndNorm(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::pair<double, double>> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("step")) out.emplace_back(j["loss"].get<double>(), j["grad_norm"].get<double>());
  }
  return out;
}

// A child's exit code (blocking), or -1 when it was killed by a signal.
int ExitCode(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::PinBlasThreadsForBitwiseRuns();
    dir_ = testing::MakeTempDir("multiprocess");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // One process (in-process stages) and `onnxpipe launch --nproc N`, each writing `tag`.jsonl.
  CommandResult OneProcess(const std::string& args, const std::string& tag) {
    return RunCommand(Onnxpipe() + " " + args + " --metrics " + (dir_ / (tag + ".jsonl")).string());
  }
  CommandResult Launch(int n, const std::string& args, const std::string& tag) {
    return RunCommand(Onnxpipe() + " launch --nproc " + std::to_string(n) + " -- " + args + " --metrics " +
                      (dir_ / (tag + ".jsonl")).string());
  }
  // Both runs' steps, bit for bit.
  void ExpectBitwise(const std::string& a, const std::string& b, size_t steps) {
    const auto x = LossAndNorm(dir_ / (a + ".jsonl")), y = LossAndNorm(dir_ / (b + ".jsonl"));
    ASSERT_EQ(x.size(), steps);
    ASSERT_EQ(y.size(), steps);
    for (size_t k = 0; k < steps; ++k) {
      EXPECT_EQ(x[k].first, y[k].first) << a << " vs " << b << " step " << k;
      EXPECT_EQ(x[k].second, y[k].second) << a << " vs " << b << " step " << k;
    }
  }
  // Rank r of a world of n started by hand, as torchrun would (`extra` after the shared flags).
  Child SpawnRank(int r, int n, int port, const std::string& args, const std::string& tag) {
    return testing::Spawn(
        "env RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(n) + " LOCAL_RANK=" + std::to_string(r) +
            " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + Onnxpipe() + " " + args,
        dir_, tag + std::to_string(r));
  }

  fs::path dir_;
};

TEST_F(MultiProcessTest, PipelineStagesInProcessesTrainBitForBitAsInThreads) {
  for (int k : {2, 4}) {
    const std::string args = TrainArgs(8, 3) + "--microbatches 2 --stages " + std::to_string(k);
    const std::string a = "threads" + std::to_string(k), b = "procs" + std::to_string(k);
    CommandResult one = OneProcess(args, a);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    CommandResult many = Launch(k, args, b);
    ASSERT_EQ(many.exit_code, 0) << many.err;
    // One copy of the output: rank 0's.
    EXPECT_THAT(many.out, HasSubstr("pipelined: " + std::to_string(k) + " stages, 2 micro-batches of 4"));
    EXPECT_EQ(many.out.find("step 3/3"), many.out.rfind("step 3/3"));
    ExpectBitwise(a, b, 3);
  }
}

// A rank of `train --plan DIR` runs the stage program `partition --out DIR` wrote (no training graph of its own) and
// trains bit for bit as one process running the plan; a run whose flags are not the plan's is refused by every rank.
TEST_F(MultiProcessTest, RanksOfAPlanRunTheirStageFilesBitForBitAsOneProcess) {
  const fs::path plan = dir_ / "plan";
  CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") +
                               " --stages 2 --batch 8 --microbatches 2 --seq 32 --device cpu --optimizer adamw"
                               " --clip-norm 1 --logits logits --freeze 'attn\\.mask$' --out " + plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
  ASSERT_TRUE(fs::exists(plan / "stage_0.program") && fs::exists(plan / "stage_1.program")) << p.out;
  const std::string args = TrainArgs(8, 3) + "--plan " + plan.string();
  CommandResult one = OneProcess(args, "plan_threads");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  CommandResult many = Launch(2, args, "plan_procs");
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_THAT(many.out, HasSubstr("stage 0: its program from " + (plan / "stage_0.program").string()));
  ExpectBitwise("plan_threads", "plan_procs", 3);

  CommandResult other = Launch(2, args + " --clip-norm 2", "plan_other");
  EXPECT_NE(other.exit_code, 0);
  EXPECT_THAT(other.err, AllOf(HasSubstr("stage_"), HasSubstr("--clip-norm 1.0 vs 2.0"),
                               HasSubstr("re-run onnxpipe partition")));
  // A plan made for sequences of 16 against data of 32.
  const fs::path short_plan = dir_ / "plan16";
  p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") +
                 " --stages 2 --batch 8 --microbatches 2 --seq 16 --device cpu --optimizer adamw --clip-norm 1"
                 " --logits logits --freeze 'attn\\.mask$' --out " + short_plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
  CommandResult seq = Launch(2, TrainArgs(8, 3) + "--plan " + short_plan.string(), "plan_seq");
  EXPECT_NE(seq.exit_code, 0);
  EXPECT_THAT(seq.err, AllOf(HasSubstr("data 'tokens' has rows of (32)"), HasSubstr("micro-batches of (4, 16)"),
                             HasSubstr("--seq")));
}

// K = 4, and K = 2 x D = 2 (replicas of a stage read one file; tied weights all-reduced over their holders): the ranks
// built from the stage files train bit for bit as the ranks that build the training graph from the same plan (its
// stage files removed).
TEST_F(MultiProcessTest, StageFilesOfFourStagesAndOfReplicasTrainAsTheTrainingGraph) {
  for (const auto& [k, d] : {std::pair{4, 1}, std::pair{2, 2}}) {
    const std::string tag = "k" + std::to_string(k) + "d" + std::to_string(d);
    const fs::path plan = dir_ / ("plan_" + tag);
    CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") + " --stages " +
                                 std::to_string(k) + " --data-parallel " + std::to_string(d) +
                                 " --batch 8 --microbatches 2 --seq 32 --device cpu --optimizer adamw --clip-norm 1"
                                 " --logits logits --freeze 'attn\\.mask$' --out " + plan.string());
    ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
    const std::string args =
        TrainArgs(8, 3) + "--plan " + plan.string() + " --data-parallel " + std::to_string(d);
    CommandResult files = Launch(k * d, args, tag + "_files");
    ASSERT_EQ(files.exit_code, 0) << files.err;
    EXPECT_THAT(files.out, HasSubstr("stage 0: its program from"));
    for (int s = 0; s < k; ++s) fs::remove(plan / ("stage_" + std::to_string(s) + ".program"));
    CommandResult graph = Launch(k * d, args, tag + "_graph");
    ASSERT_EQ(graph.exit_code, 0) << graph.err;
    EXPECT_THAT(graph.out, HasSubstr("no stage program"));
    ExpectBitwise(tag + "_files", tag + "_graph", 3);
  }
}

// A CPU rank never opens cuBLASLt, which alone costs a process about 200 MB resident (the GEMM library is opened
// on first use). The dynamic loader's own log of the files it opens, for the launcher and both ranks, says so; it
// must show the CUDA runtime that the binary does link, or the check proves nothing.
TEST_F(MultiProcessTest, CpuRanksDoNotLoadTheGpuGemmLibrary) {
  CommandResult r =
      RunCommand("env LD_DEBUG=files " + Onnxpipe() + " launch --nproc 2 -- " + TrainArgs(8, 1) + "--stages 2");
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000 : 0);
  if (r.err.find("file=libcudart") == std::string::npos) GTEST_SKIP() << "built without CUDA";
  EXPECT_EQ(r.err.find("libcublasLt"), std::string::npos);
}

TEST_F(MultiProcessTest, DataParallelReplicasTrainAsOneProcessRunningTheirMicrobatches) {
  // One micro-batch per replica: bitwise.
  ASSERT_EQ(OneProcess(TrainArgs(8, 3) + "--microbatches 2", "m2").exit_code, 0);
  CommandResult d2 = Launch(2, TrainArgs(8, 3) + "--data-parallel 2", "d2");
  ASSERT_EQ(d2.exit_code, 0) << d2.err;
  EXPECT_THAT(d2.out, HasSubstr("1 stages, 1 micro-batches of 4, 1f1b, recompute none, 2 data-parallel replicas"));
  ExpectBitwise("m2", "d2", 3);
  ASSERT_EQ(OneProcess(TrainArgs(8, 3) + "--microbatches 4", "m4").exit_code, 0);
  ASSERT_EQ(Launch(4, TrainArgs(8, 3) + "--data-parallel 4", "d4").exit_code, 0);
  ExpectBitwise("m4", "d4", 3);
  // Pipeline x data parallel: 2 stages x 2 replicas.
  ASSERT_EQ(OneProcess(TrainArgs(8, 3) + "--stages 2 --microbatches 2", "k2m2").exit_code, 0);
  CommandResult k2d2 = Launch(4, TrainArgs(8, 3) + "--stages 2 --data-parallel 2", "k2d2");
  ASSERT_EQ(k2d2.exit_code, 0) << k2d2.err;
  ExpectBitwise("k2m2", "k2d2", 3);
  // Two micro-batches per replica: (g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3, fp32.
  ASSERT_EQ(Launch(2, TrainArgs(8, 3) + "--data-parallel 2 --microbatches 2", "d2m2").exit_code, 0);
  const auto x = LossAndNorm(dir_ / "m4.jsonl"), y = LossAndNorm(dir_ / "d2m2.jsonl");
  ASSERT_EQ(y.size(), 3u);
  // The first loss precedes any update: equal up to the order of the double sum of the shares.
  EXPECT_NEAR(x[0].first, y[0].first, 1e-12 * std::abs(x[0].first));
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(x[k].first, y[k].first, 1e-5 * std::abs(x[k].first)) << k;
    EXPECT_NEAR(x[k].second, y[k].second, 1e-4 * std::abs(x[k].second)) << k;
  }
}

// The backward all-reduces full buckets of complete gradients while it goes on (DDP's reducer): with 0 MiB buckets
// every gradient goes alone during the backward, with 25 MiB (more than tiny_gpt's gradients) all wait for the
// optimizer step. Where the all-reduce runs changes no bit, with 1 or 2 micro-batches per replica and 2 stages.
TEST_F(MultiProcessTest, GradientBucketsAreAllReducedDuringTheBackwardWithTheSameResults) {
  auto buckets = [](const std::string& out) {
    const size_t at = out.find("all-reduced ");
    return at == std::string::npos ? -1 : std::stoi(out.substr(at + 12));
  };
  for (const std::string extra : {"", "--microbatches 2 ", "--stages 2 "}) {
    SCOPED_TRACE(extra);
    const int n = extra.find("stages") != std::string::npos ? 4 : 2;
    CommandResult whole = Launch(n, TrainArgs(8, 3) + extra + "--data-parallel 2 --dp-bucket-mb 25", "whole");
    ASSERT_EQ(whole.exit_code, 0) << whole.err;
    CommandResult each = Launch(n, TrainArgs(8, 3) + extra + "--data-parallel 2 --dp-bucket-mb 0", "each");
    ASSERT_EQ(each.exit_code, 0) << each.err;
    EXPECT_EQ(buckets(whole.out), 0) << whole.out;
    EXPECT_GT(buckets(each.out), 5) << each.out;
    ExpectBitwise("whole", "each", 3);
  }
}

// --report of stage processes: rank 0 writes one report with every stage's measurements, which its rank sent. The
// memory each stage measured is the one process's (the same plan, kernels writing into planned slots).
TEST_F(MultiProcessTest, ReportOfStageProcessesHoldsEveryStage) {
  const std::string args = TrainArgs(8, 3) + "--stages 2 --microbatches 2 --report ";
  ASSERT_EQ(OneProcess(args + (dir_ / "one").string(), "one").exit_code, 0);
  CommandResult many = Launch(2, args + (dir_ / "many").string(), "many");
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_THAT(many.out, HasSubstr("report: " + (dir_ / "many").string()));
  auto load = [&](const std::string& name) { return nlohmann::json::parse(ReadAll((dir_ / name).string())); };
  const nlohmann::json one = load("one/measured.json"), many_j = load("many/measured.json");
  ASSERT_EQ(many_j["stages"].size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const nlohmann::json &a = one["stages"][s], &b = many_j["stages"][s];
    EXPECT_EQ(b["measured"]["memory"]["arena"], a["measured"]["memory"]["arena"]) << s;
    EXPECT_EQ(b["measured"]["memory"]["accumulators"], a["measured"]["memory"]["accumulators"]) << s;
    EXPECT_EQ(b["predicted"]["memory"], a["predicted"]["memory"]) << s;
    EXPECT_GT(b["measured"]["forward_ms"].get<double>(), 0) << s;
    EXPECT_GT(b["measured"]["bytes_sent"].get<int64_t>(), 0) << s;
  }
  // The trace has both stages' forwards of the last step.
  const nlohmann::json trace = load("many/measured.trace.json");
  std::set<int> stages_with_forward;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "forward") stages_with_forward.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(stages_with_forward, (std::set<int>{0, 1}));
  EXPECT_TRUE(fs::exists(dir_ / "many" / "report.html"));
}

TEST_F(MultiProcessTest, CheckpointsOfAnyLayoutResumeInOneProcessAndSaveOneModel) {
  const std::string ck = (dir_ / "ck").string();
  ASSERT_EQ(OneProcess(TrainArgs(8, 6) + "--save " + (dir_ / "one.onnx").string(), "full").exit_code, 0);
  // 2 stages write the first 3 steps; one process resumes them, and so do 4 stage processes.
  CommandResult first = Launch(2, TrainArgs(8, 3) + "--checkpoint-dir " + ck, "first");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.out, HasSubstr("checkpoint: " + ck + "/step_3.ckpt (step 3)"));
  ASSERT_TRUE(fs::exists(ck + "/latest"));
  // Each stage's rank wrote its own shard; rank 0's step file only names them (no tensor of stage 1 went to rank 0).
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(fs::exists(ck + "/step_3.shard-" + std::to_string(i) + "-of-2.ckpt")) << i;
  EXPECT_LT(fs::file_size(ck + "/step_3.ckpt"), fs::file_size(ck + "/step_3.shard-1-of-2.ckpt") / 10);
  const std::string ck4 = (dir_ / "ck4").string();
  fs::copy(ck, ck4, fs::copy_options::recursive);
  CommandResult rest = OneProcess(
      TrainArgs(8, 6) + "--checkpoint-dir " + ck + " --resume --save " + (dir_ / "resumed.onnx").string(), "rest");
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  const auto full = LossAndNorm(dir_ / "full.jsonl"), tail = LossAndNorm(dir_ / "rest.jsonl");
  ASSERT_EQ(tail.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(full[3 + k], tail[k]) << "step " << 3 + k;
  // The 2 shards resharded over 4 stage processes, which write 4 shards at the end.
  CommandResult four_rest = Launch(4, TrainArgs(8, 6) + "--stages 4 --checkpoint-dir " + ck4 + " --resume", "rest4");
  ASSERT_EQ(four_rest.exit_code, 0) << four_rest.err;
  const auto tail4 = LossAndNorm(dir_ / "rest4.jsonl");
  ASSERT_EQ(tail4.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_EQ(full[3 + k], tail4[k]) << "step " << 3 + k;
  EXPECT_TRUE(fs::exists(ck4 + "/step_6.shard-3-of-4.ckpt"));
  // --save from 4 ranks (the model gathered on rank 0): the one-process file, byte for byte.
  CommandResult saved = Launch(4, TrainArgs(8, 6) + "--stages 4 --save " + (dir_ / "four.onnx").string(), "four");
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  EXPECT_EQ(ReadAll((dir_ / "four.onnx").string()), ReadAll((dir_ / "one.onnx").string()));
}

// kill -9 of either rank at several moments of a 2-stage run that checkpoints every step (each rank its shard, rank 0
// the manifest and `latest` once both are on disk): `latest` always loads with its shards, and the run resumes.
TEST_F(MultiProcessTest, KillDashNineOfARankDuringShardedCheckpointsLeavesALoadableLatest) {
  const std::string ck = (dir_ / "ck").string();
  int64_t previous = -1;
  for (int round = 0; round < 4; ++round) {
    const std::string tag = "launcher" + std::to_string(round);
    Child launcher = testing::Spawn(Onnxpipe() + " launch --nproc 2 -- " + TrainArgs(8, 1000000) +
                                        "--stages 2 --checkpoint-every 1 --keep-checkpoints 2 --checkpoint-dir " + ck +
                                        (previous >= 0 ? " --resume" : ""),
                                    dir_, tag);
    ASSERT_TRUE(testing::WaitForOutput(launcher, "checkpoint: ")) << ReadAll(launcher.err.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(11 * round));
    const int victim_rank = round % 2;
    const std::string err = ReadAll(launcher.err.string());
    const std::string key = "rank " + std::to_string(victim_rank) + " of 2: pid ";
    const size_t at = err.find(key);
    ASSERT_NE(at, std::string::npos) << err;
    ASSERT_EQ(kill(std::stoi(err.substr(at + key.size())), SIGKILL), 0);
    EXPECT_NE(ExitCode(launcher.pid), 0);
    absl::StatusOr<io::Checkpoint> latest = io::CheckpointManager(ck, 2).LoadLatest();
    ASSERT_TRUE(latest.ok()) << "round " << round << ": " << latest.status();
    EXPECT_GT(latest->metadata.step, previous) << "round " << round;
    previous = latest->metadata.step;
  }
  CommandResult rest =
      Launch(2, TrainArgs(8, previous + 2) + "--stages 2 --checkpoint-dir " + ck + " --resume", "rest");
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_THAT(rest.out, HasSubstr("at step " + std::to_string(previous)));
  EXPECT_EQ(LossAndNorm(dir_ / "rest.jsonl").size(), 2u);
}

TEST_F(MultiProcessTest, SigtermToTheLauncherStopsEveryRankAfterTheSameStepWithACheckpoint) {
  const std::string ck = (dir_ / "ck").string();
  Child launcher = testing::Spawn(
      Onnxpipe() + " launch --nproc 2 -- " + TrainArgs(8, 1000000) + "--log-every 1 --checkpoint-dir " + ck, dir_,
      "launcher");
  ASSERT_TRUE(testing::WaitForOutput(launcher, "step 3/")) << ReadAll(launcher.err.string());
  kill(launcher.pid, SIGTERM);
  EXPECT_EQ(ExitCode(launcher.pid), 0) << ReadAll(launcher.err.string());
  EXPECT_THAT(ReadAll(launcher.out.string()), AllOf(HasSubstr("interrupted (SIGTERM)"), HasSubstr("checkpoint: ")));
  CommandResult resumed = OneProcess(TrainArgs(8, 1) + "--checkpoint-dir " + ck + " --resume auto", "resumed");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_THAT(resumed.out, HasSubstr("resumed from"));
}

TEST_F(MultiProcessTest, AKilledRankEndsEveryRankWithinTenSecondsNamingIt) {
  Child launcher =
      testing::Spawn(Onnxpipe() + " launch --nproc 4 -- " + TrainArgs(8, 1000000) + "--log-every 1", dir_, "launcher");
  ASSERT_TRUE(testing::WaitForOutput(launcher, "step 3/")) << ReadAll(launcher.err.string());
  const std::string err = ReadAll(launcher.err.string());
  const size_t at = err.find("rank 2 of 4: pid ");
  ASSERT_NE(at, std::string::npos) << err;
  const pid_t victim = std::stoi(err.substr(at + 17));
  const Clock::time_point t0 = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const int code = ExitCode(launcher.pid);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10);
  EXPECT_NE(code, 0);
  const std::string after = ReadAll(launcher.err.string());
  EXPECT_THAT(after, HasSubstr("rank 2 (pid " + std::to_string(victim) + ") was killed by signal 9"));
  // The survivors name the rank that went and the step they were in.
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(after, HasSubstr("rank " + std::to_string(r) + " of 4: step ")) << after;
  }
  EXPECT_THAT(after, HasSubstr("rank 2 is gone"));
}

// A rank that stops (SIGSTOP: alive, silent) is noticed by its missing heartbeats: the others end, naming it.
TEST_F(MultiProcessTest, AStoppedRankEndsTheOthersWithinTheHeartbeatTimeoutNamingIt) {
  const int port = 20000 + (getpid() + 13) % 20000;
  std::vector<Child> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(SpawnRank(r, 3, port, TrainArgs(8, 1000000) + "--log-every 1 --heartbeat-timeout 3", "rank"));
  }
  ASSERT_TRUE(testing::WaitForOutput(ranks[0], "step 3/")) << ReadAll(ranks[0].err.string());
  const Clock::time_point t0 = Clock::now();
  ASSERT_EQ(kill(ranks[1].pid, SIGSTOP), 0);
  for (int r : {0, 2}) EXPECT_EQ(ExitCode(ranks[r].pid), 1) << "rank " << r;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10);
  kill(ranks[1].pid, SIGKILL);
  ExitCode(ranks[1].pid);
  const std::string errs = ReadAll(ranks[0].err.string()) + ReadAll(ranks[2].err.string());
  EXPECT_THAT(errs, HasSubstr("rank 1 has not been heard from for 3 s"));
}

TEST_F(MultiProcessTest, ARankWithBadDataEndsEveryRankNamingTheFile) {
  // Rank 1's labels are cut short: it fails reading them; the others stop with its reason.
  const fs::path bad = dir_ / "bad";
  fs::create_directories(bad);
  fs::copy(SourcePath("models/golden/tiny_gpt/data/tokens.npy"), bad / "tokens.npy");
  const std::string labels = ReadAll(SourcePath("models/golden/tiny_gpt/data/labels.npy"));
  std::ofstream(bad / "labels.npy", std::ios::binary) << labels.substr(0, labels.size() / 2);
  const int port = 20000 + getpid() % 20000;
  std::vector<Child> ranks;
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < 4; ++r) {
    std::string args = TrainArgs(8, 1000000);
    if (r == 1) args += " --data " + bad.string();  // the later --data wins
    ranks.push_back(SpawnRank(r, 4, port, args, "rank"));
  }
  std::vector<int> codes;
  for (const Child& c : ranks) codes.push_back(ExitCode(c.pid));
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10);
  for (int r = 0; r < 4; ++r) EXPECT_NE(codes[r], 0) << "rank " << r;
  EXPECT_THAT(ReadAll(ranks[1].err.string()), AllOf(HasSubstr("rank 1 of 4"), HasSubstr("labels.npy")));
  for (int r : {0, 2, 3}) EXPECT_THAT(ReadAll(ranks[r].err.string()), HasSubstr("rank 1")) << "rank " << r;
}

TEST_F(MultiProcessTest, ARankThatNeverArrivesEndsTheRendezvousNamingIt) {
  const int port = 20000 + (getpid() + 7) % 20000;
  std::vector<Child> ranks;
  const Clock::time_point t0 = Clock::now();
  for (int r = 0; r < 3; ++r) {  // rank 3 of 4 is never started
    ranks.push_back(SpawnRank(r, 4, port, TrainArgs(8, 2) + "--rendezvous-timeout 2", "rank"));
  }
  for (const Child& c : ranks) EXPECT_EQ(ExitCode(c.pid), 1);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10);
  for (const Child& c : ranks) {
    EXPECT_THAT(ReadAll(c.err.string()),
                AllOf(HasSubstr("rank(s) 3 of 4 did not arrive within 2 s"), HasSubstr("--rendezvous-timeout")));
  }
}

TEST_F(MultiProcessTest, LaunchVariablesAndFlagsAreCheckedWithClearErrors) {
  const std::string train = Onnxpipe() + " " + TrainArgs(8, 1);
  CommandResult r = RunCommand("env RANK=0 WORLD_SIZE=2 MASTER_PORT=1234 " + train);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("MASTER_ADDR is not set"));
  r = RunCommand("env RANK=2 WORLD_SIZE=2 MASTER_ADDR=x MASTER_PORT=1234 " + train);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("rank 2 is not below the world size 2"));
  r = RunCommand("env RANK=0 WORLD_SIZE=two MASTER_ADDR=x MASTER_PORT=1234 " + train);
  EXPECT_THAT(r.err, HasSubstr("WORLD_SIZE='two' is not a non-negative integer"));
  r = RunCommand("env RANK=0 WORLD_SIZE=3 MASTER_ADDR=x MASTER_PORT=1234 " + train + " --data-parallel 2");
  EXPECT_THAT(r.err, HasSubstr("the world has 3 ranks, not a multiple of --data-parallel 2"));
  r = RunCommand(train + " --data-parallel 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("needs one process per rank"));
  // An srun step: the master is the node list's first host, the port the job's.
  r = RunCommand(
      "env SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=8 SLURM_LOCALID=0 "
      "SLURM_STEP_NODELIST='gpu[07-09,12],login1' SLURM_JOB_ID=40001 " +
      train + " --rendezvous-timeout 1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("rendezvous at gpu07:20001: rank(s) 1 of 2 did not arrive within 1 s"));
  r = RunCommand("env SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=0 SLURM_JOB_ID=1 " + train);
  EXPECT_THAT(r.err, HasSubstr("neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set"));
  // launch's own flags.
  r = RunCommand(Onnxpipe() + " launch --nproc 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("no command: give it after --"));
  r = RunCommand(Onnxpipe() + " launch --nproc 0 -- train x.onnx");
  EXPECT_THAT(r.err, HasSubstr("--nproc must be >= 1"));
  r = RunCommand(Onnxpipe() + " launch --nproc 2 --nnodes 2 --node-rank 2 -- train x.onnx");
  EXPECT_THAT(r.err, HasSubstr("--node-rank must be in 0..1"));
  // A failing command fails the launch, naming the rank.
  r = RunCommand(Onnxpipe() + " launch --nproc 2 -- train " + (dir_ / "missing.onnx").string() +
                 " --data x --batch 2 --steps 1 --lr 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, AllOf(HasSubstr("missing.onnx"), HasSubstr("onnxpipe launch: failed: rank ")));
}

}  // namespace
}  // namespace onnxpipe
