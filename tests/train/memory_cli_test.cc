// Out of memory is answered before the run: `onnxpipe train` with a batch whose plan cannot fit the host gives an
// error saying how much the plan needs, how much is free and the smallest change that fits, exits 1 (not an abort's
// 134) and allocates nothing large first: the run is held to 4 GB of address space (ulimit -v), where allocating
// the plan's arena would fail. The need is checked against a lower bound computed here from the model's sizes.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "executor/data/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

// "39.22 GiB" -> bytes.
double Bytes(const std::string& number, const std::string& unit) {
  const double v = std::stod(number);
  if (unit == "TiB") return v * (1ull << 40);
  if (unit == "GiB") return v * (1ull << 30);
  if (unit == "MiB") return v * (1 << 20);
  if (unit == "KiB") return v * 1024;
  return v;
}

TEST(MemoryCliTest, APlanThatCannotFitTheHostIsRefusedBeforeAllocatingWithTheSmallestChangeThatFits) {
  constexpr int64_t kBatch = 65536, kSeq = 64;  // models/tiny_classifier.json: d_model 64, ffn 256, 2 layers
  const fs::path dir = testing::MakeTempDir("memory_cli");
  ir::Tensor tokens(ir::DType::kI64, {kBatch, kSeq}), labels(ir::DType::kI64, {kBatch});
  for (int64_t i = 0; i < kBatch * kSeq; ++i) tokens.mutable_data<int64_t>()[i] = 2 + i % 1000;
  for (int64_t i = 0; i < kBatch; ++i) labels.mutable_data<int64_t>()[i] = i % 2;
  ASSERT_TRUE(data::WriteNpy((dir / "tokens.npy").string(), tokens).ok());
  ASSERT_TRUE(data::WriteNpy((dir / "labels.npy").string(), labels).ok());

  CommandResult r = RunCommand("ulimit -v 4000000 && " + Onnxpipe() + " train " +
                               SourcePath("models/tiny_classifier.onnx") + " --data " + dir.string() +
                               " --batch 65536 --steps 1 --optimizer adamw --lr 0.001 --freeze '^pos\\.table$'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::smatch m;
  const std::regex message(
      R"(out of memory before the run: the plan needs ([0-9.]+) (\w+) of cpu memory, and the host has ([0-9.]+) )"
      R"((\w+) free; the smallest change that fits: --microbatches ([0-9]+)[^(]*\(the plan then needs ([0-9.]+) (\w+)\))");
  ASSERT_TRUE(std::regex_search(r.err, m, message)) << r.err;
  const double need = Bytes(m[1], m[2]), free = Bytes(m[3], m[4]), then = Bytes(m[6], m[7]);
  // Backward keeps each layer's FFN input to the GELU: at least layers x B x S x ffn floats.
  EXPECT_GT(need, 2.0 * kBatch * kSeq * 256 * 4);
  EXPECT_LT(free, 4000000.0 * 1024);  // the address-space limit counts, not only the machine's MemAvailable
  EXPECT_LE(then, free);
  EXPECT_GT(std::stoi(m[5]), 1);
  EXPECT_EQ(kBatch % std::stoi(m[5]), 0);
  fs::remove_all(dir);
}

// --memory-budget caps what the run may allocate: a budget under the plan's need is refused before the run with the
// smallest change that fits it; that change then runs under the budget and trains exactly as it does without one.
TEST(MemoryCliTest, AMemoryBudgetIsHeldBeforeTheRunAndItsAdviceRunsUnderIt) {
  constexpr int64_t kRows = 256, kSeq = 64;
  const fs::path dir = testing::MakeTempDir("memory_budget");
  ir::Tensor tokens(ir::DType::kI64, {kRows, kSeq}), labels(ir::DType::kI64, {kRows});
  for (int64_t i = 0; i < kRows * kSeq; ++i) tokens.mutable_data<int64_t>()[i] = 2 + (i * 7) % 1000;
  for (int64_t i = 0; i < kRows; ++i) labels.mutable_data<int64_t>()[i] = i % 2;
  ASSERT_TRUE(data::WriteNpy((dir / "tokens.npy").string(), tokens).ok());
  ASSERT_TRUE(data::WriteNpy((dir / "labels.npy").string(), labels).ok());
  const std::string train = Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " +
                            dir.string() + " --batch 256 --steps 2 --optimizer adamw --lr 0.001 --freeze '^pos\\.table$'";
  std::smatch m;
  // A budget nothing fits: the need at the run's settings and what the budget allows.
  CommandResult tiny = RunCommand(train + " --memory-budget 1KiB");
  EXPECT_EQ(tiny.exit_code, 1) << tiny.err;
  ASSERT_TRUE(std::regex_search(tiny.err, m, std::regex(R"(the plan needs ([0-9.]+) (\w+) of cpu memory, )"
                                                        R"(and --memory-budget allows 1.00 KiB; no --microbatches)")))
      << tiny.err;
  const double need = Bytes(m[1], m[2]);
  // Two thirds of the need: refused, naming a change that fits it.
  const int64_t budget = static_cast<int64_t>(need * 2 / 3);
  CommandResult refused = RunCommand(train + " --memory-budget " + std::to_string(budget));
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  ASSERT_TRUE(std::regex_search(refused.err, m,
                                std::regex(R"(the smallest change that fits: ((--\w+ \w+ ?)+) \(the plan then needs )"
                                           R"(([0-9.]+) (\w+)\))")))
      << refused.err;
  const std::string change = m[1];
  EXPECT_LE(Bytes(m[3], m[4]), budget);
  // The change runs under the budget, with the losses of the same flags without one.
  CommandResult fits = RunCommand(train + " --memory-budget " + std::to_string(budget) + " " + change + " --metrics " +
                                  (dir / "budget.jsonl").string());
  ASSERT_EQ(fits.exit_code, 0) << change << ": " << fits.err;
  CommandResult free = RunCommand(train + " " + change + " --metrics " + (dir / "free.jsonl").string());
  ASSERT_EQ(free.exit_code, 0) << free.err;
  auto losses = [](const fs::path& path) {
    std::string out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) out += line.substr(0, line.find("\"samples_per_s\"")) + "\n";
    return out;
  };
  EXPECT_FALSE(losses(dir / "budget.jsonl").empty());
  EXPECT_EQ(losses(dir / "budget.jsonl"), losses(dir / "free.jsonl"));
  // A size that is not one names the flag.
  CommandResult bad = RunCommand(train + " --memory-budget lots");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.err, HasSubstr("--memory-budget lots: expected a size such as 40GiB"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxpipe
