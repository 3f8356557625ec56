// `onnxpipe train --stages/--plan/--report` through the built binary: a pipelined run with one
// micro-batch writes the very metrics of the unpartitioned run; a run from `onnxpipe partition`'s
// plan reports its measured memory equal to the plan's and writes both traces (fp32 and bf16 mixed
// precision); --stages K runs the partitioner's plan at K (the same recomputed nodes as --plan); bad
// pipeline flags fail with clear errors.
#include <filesystem>
#include <fstream>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::CommandResult;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

class PipelineCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("pipeline_cli"); }
  void TearDown() override { fs::remove_all(dir_); }

  CommandResult Train(const std::string& extra) {
    return RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_gpt.onnx") + " --data " +
                      SourcePath("models/golden/tiny_gpt/data") +
                      " --batch 4 --steps 3 --optimizer sgd --lr 0.05 --momentum 0.9 --clip-norm 1 "
                      "--freeze '^blocks\\..\\.attn\\.mask$' " + extra);
  }
  std::vector<std::string> Lines(const fs::path& p) {
    std::ifstream in(p);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  nlohmann::json Json(const fs::path& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  }

  fs::path dir_;
};

TEST_F(PipelineCliTest, OneMicrobatchOnThreeStagesWritesTheUnpartitionedMetrics) {
  CommandResult ref = Train("--dtype fp64 --no-dropout --metrics " + (dir_ / "ref.jsonl").string());
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  CommandResult pipe = Train("--dtype fp64 --no-dropout --stages 3 --schedule gpipe --recompute full --metrics " +
                             (dir_ / "pipe.jsonl").string());
  ASSERT_EQ(pipe.exit_code, 0) << pipe.err;
  EXPECT_THAT(pipe.out, HasSubstr("pipelined: 3 stages, 1 micro-batches of 4, gpipe, recompute full"));
  const std::vector<std::string> a = Lines(dir_ / "ref.jsonl"), b = Lines(dir_ / "pipe.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t k = 0; k < a.size(); ++k) {
    const nlohmann::json x = nlohmann::json::parse(a[k]), y = nlohmann::json::parse(b[k]);
    EXPECT_EQ(x["loss"].get<double>(), y["loss"].get<double>()) << k;  // bitwise: round-trip doubles
    EXPECT_EQ(x["grad_norm"].get<double>(), y["grad_norm"].get<double>()) << k;
  }
}

// bf16: `partition --dtype bf16` plans the mixed-precision training graph `train --dtype bf16` runs: the
// run holds the planned bytes, bf16 activations cross the cut, and an fp32 run refuses the plan. One
// micro-batch on two stages equals the unpartitioned bf16 run bit for bit.
TEST_F(PipelineCliTest, Bf16PlanRunsAsWrittenAndOneMicrobatchEqualsTheUnpartitionedRun) {
  const fs::path plan = dir_ / "plan", report = dir_ / "report";
  CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") +
                               " --stages 2 --batch 4 --microbatches 2 --seq 32 --device cpu --dtype bf16"
                               " --momentum 0.9 --clip-norm 1 --freeze '^blocks\\..\\.attn\\.mask$' --out " +
                               plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
  const nlohmann::json pj = Json(plan / "plan.json");
  EXPECT_EQ(pj["config"]["dtype"], "bf16");
  int activations = 0;
  for (const nlohmann::json& b : pj["stages"][0]["boundary_outputs"]) {
    if (b["kind"] != "activation") continue;
    ++activations;
    EXPECT_EQ(b["dtype"], "bf16") << b["name"];
  }
  EXPECT_GT(activations, 0);
  CommandResult r = Train("--dtype bf16 --plan " + plan.string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json m = Json(report / "measured.json");
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(m["stages"][s]["measured"]["memory"]["saved_per_microbatch"],
              pj["stages"][s]["memory"]["saved_per_microbatch"]) << s;
    EXPECT_EQ(m["stages"][s]["measured"]["memory"]["activations"], pj["stages"][s]["memory"]["activations"]) << s;
  }
  r = Train("--plan " + plan.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("was made for bf16 (re-run onnxpipe partition with the same --dtype)"));

  ASSERT_EQ(Train("--dtype bf16 --no-dropout --metrics " + (dir_ / "ref.jsonl").string()).exit_code, 0);
  ASSERT_EQ(Train("--dtype bf16 --no-dropout --stages 2 --metrics " + (dir_ / "pipe.jsonl").string()).exit_code, 0);
  const std::vector<std::string> a = Lines(dir_ / "ref.jsonl"), b = Lines(dir_ / "pipe.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t k = 0; k < a.size(); ++k) {
    const nlohmann::json x = nlohmann::json::parse(a[k]), y = nlohmann::json::parse(b[k]);
    EXPECT_EQ(x["loss"].get<double>(), y["loss"].get<double>()) << k;
    EXPECT_EQ(x["grad_norm"].get<double>(), y["grad_norm"].get<double>()) << k;
  }
}

TEST_F(PipelineCliTest, PlanRunReportsMeasuredMemoryEqualToThePlan) {
  const fs::path plan = dir_ / "plan", report = dir_ / "report";
  CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") +
                               " --stages 2 --batch 4 --microbatches 4 --seq 32 --schedule 1f1b --recompute selective"
                               " --device cpu --momentum 0.9 --clip-norm 1 --out " + plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
  CommandResult r = Train("--plan " + plan.string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("pipelined: 2 stages, 4 micro-batches of 1, 1f1b, recompute selective"));
  for (const char* f : {"measured.json", "measured.trace.json", "predicted.trace.json", "report.txt", "report.html"}) {
    EXPECT_TRUE(fs::exists(report / f)) << f;
  }
  const nlohmann::json m = Json(report / "measured.json"), pj = Json(plan / "plan.json");
  ASSERT_EQ(m["stages"].size(), 2u);
  ASSERT_EQ(m["steps"].size(), 3u);
  for (int s = 0; s < 2; ++s) {
    const nlohmann::json& ms = m["stages"][s]["measured"]["memory"];
    const nlohmann::json& ps = pj["stages"][s]["memory"];
    EXPECT_EQ(ms["saved_per_microbatch"], ps["saved_per_microbatch"]) << s;
    EXPECT_EQ(ms["in_flight"], ps["in_flight"]) << s;
    EXPECT_EQ(ms["activations"], ps["activations"]) << s;
    EXPECT_EQ(ms["transient"], ps["transient"]) << s;
    // --device cpu: the partitioner counted the CPU backend's kernel scratch, which the run measures.
    EXPECT_TRUE(pj["config"]["kernel_scratch_counted"].get<bool>());
    EXPECT_GT(ps["kernel_scratch"].get<int64_t>(), 0) << s;
    EXPECT_EQ(ms["kernel_scratch"], ps["kernel_scratch"]) << s;
    EXPECT_GT(m["stages"][s]["measured"]["forward_ms"].get<double>(), 0);
  }
  // Stage 0 of 1F1B with K = 2 holds two micro-batches, the last stage one.
  EXPECT_EQ(m["stages"][0]["measured"]["memory"]["in_flight"], 2);
  EXPECT_EQ(m["stages"][1]["measured"]["memory"]["in_flight"], 1);
  // The measured trace: a process per stage, F and B of every micro-batch on each.
  const nlohmann::json t = Json(report / "measured.trace.json");
  std::set<std::pair<int, std::string>> seen;
  for (const nlohmann::json& e : t["traceEvents"]) {
    if (e["ph"] == "X") seen.insert({e["pid"].get<int>(), e["name"].get<std::string>()});
  }
  for (int s = 0; s < 2; ++s) {
    for (int mb = 0; mb < 4; ++mb) {
      EXPECT_TRUE(seen.count({s, "F" + std::to_string(mb)})) << s << " F" << mb;
      EXPECT_TRUE(seen.count({s, "B" + std::to_string(mb)})) << s << " B" << mb;
    }
  }
  const std::string html = testing::ReadAll((report / "report.html").string());
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("Measured (last step"));
  EXPECT_THAT(html, HasSubstr("Predicted (plan)"));
  // The predicted trace beside it is the plan's.
  EXPECT_EQ(testing::ReadAll((report / "predicted.trace.json").string()),
            testing::ReadAll((plan / "schedule.trace.json").string()));
  // The plan is run as written: another schedule is refused, not re-derived.
  r = Train("--plan " + plan.string() + " --schedule gpipe");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--schedule gpipe but the plan in " + plan.string() + " was made for 1f1b"));
}

// --recompute selective recomputes the same nodes with --plan (what `onnxpipe partition` wrote) and
// with --stages K (the partitioner at fixed K, in the trainer): one rule, the partitioner's, which
// keeps a value another unit's forward reads (so each unit recomputes from what it holds).
TEST_F(PipelineCliTest, SelectiveRecomputeIsTheSameWithPlanAndWithStages) {
  const fs::path plan = dir_ / "plan";
  CommandResult p = RunCommand(Onnxpipe() + " partition " + SourcePath("models/tiny_gpt.onnx") +
                               " --stages 2 --batch 4 --microbatches 2 --seq 32 --schedule gpipe --recompute selective"
                               " --device cpu --momentum 0.9 --clip-norm 1 --no-onnx --out " + plan.string());
  ASSERT_EQ(p.exit_code, 0) << p.err << p.out;
  CommandResult a = Train("--plan " + plan.string() + " --report " + (dir_ / "with_plan").string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  CommandResult b = Train("--stages 2 --microbatches 2 --schedule gpipe --recompute selective --report " +
                          (dir_ / "with_stages").string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const nlohmann::json pj = Json(plan / "plan.json"), ma = Json(dir_ / "with_plan" / "measured.json"),
                       mb = Json(dir_ / "with_stages" / "measured.json");
  size_t total = 0;
  for (int s = 0; s < 2; ++s) {
    std::vector<std::string> planned;
    for (const nlohmann::json& r : pj["stages"][s]["recompute_regions"])
      for (const nlohmann::json& n : r["nodes"]) planned.push_back(n);
    const auto with_plan = ma["stages"][s]["recompute_nodes"].get<std::vector<std::string>>();
    const auto with_stages = mb["stages"][s]["recompute_nodes"].get<std::vector<std::string>>();
    EXPECT_EQ(with_plan, planned) << "stage " << s;
    EXPECT_EQ(with_stages, planned) << "stage " << s;
    total += planned.size();
  }
  EXPECT_GT(total, 0u);
  // And the two runs are the same run, bit for bit.
  ASSERT_EQ(ma["steps"].size(), mb["steps"].size());
  for (size_t k = 0; k < ma["steps"].size(); ++k) {
    EXPECT_EQ(ma["steps"][k]["loss"].get<double>(), mb["steps"][k]["loss"].get<double>()) << k;
    EXPECT_EQ(ma["steps"][k]["grad_norm"].get<double>(), mb["steps"][k]["grad_norm"].get<double>()) << k;
  }
}

TEST_F(PipelineCliTest, BadPipelineFlagsAreClearErrors) {
  CommandResult r = Train("--stages 2 --microbatches 3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--batch 4 is not divisible by --microbatches 3"));
  r = Train("--stages 2 --recompute sometimes");
  EXPECT_THAT(r.err, HasSubstr("unknown recompute policy 'sometimes'"));
  r = Train("--stages 999");
  EXPECT_THAT(r.err, HasSubstr("--stages 999 is more than this model can be cut into"));
  r = Train("--plan " + (dir_ / "missing").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("plan.json"));
}

}  // namespace
}  // namespace onnxpipe
