// The README holds what the code does: its main-job block is what scripts/main_job.sh prints (every line, every
// word; numbers to the rounding another processor's BLAS kernels give, samples/s aside), and every `$ onnxpipe`
// example command in it runs on the shipped models. The reference for the block is the main job itself, run here,
// not a copy kept in the test.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::Onnxpipe;
using testing::ReadAll;
using testing::RunCommand;
using testing::ShellQuote;
using testing::SourcePath;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The first ``` block after the line `heading`.
std::vector<std::string> BlockAfter(const std::vector<std::string>& readme, const std::string& heading) {
  std::vector<std::string> block;
  bool seen = false, in_block = false;
  for (const std::string& line : readme) {
    if (line == heading) seen = true;
    if (!seen || line.rfind("```", 0) != 0) {
      if (in_block) block.push_back(line);
      continue;
    }
    if (in_block) return block;
    in_block = true;
  }
  return {};
}

// A line split into its words with every number replaced by '#', and the numbers; samples/s figures dropped.
struct Shape {
  std::string words;
  std::vector<double> numbers;
};
Shape ShapeOf(std::string line) {
  line = std::regex_replace(line, std::regex(R"([0-9.]+ samples/s)"), "samples/s");
  static const std::regex number(R"(-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?)");
  Shape s;
  for (std::sregex_iterator it(line.begin(), line.end(), number), end; it != end; ++it)
    s.numbers.push_back(std::stod(it->str()));
  s.words = std::regex_replace(line, number, "#");
  return s;
}

TEST(ReadmeTest, MainJobBlockIsWhatTheMainJobPrints) {
  const fs::path out = testing::MakeTempDir("readme_main_job");
  CommandResult r = RunCommand("cd " + ShellQuote(SourcePath("")) + " && scripts/main_job.sh " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The job prints its output folder; the README shows the default one.
  const std::string printed = std::regex_replace(r.out, std::regex(out.string()), ".build/main_job");
  const std::vector<std::string> want = BlockAfter(Lines(ReadAll(SourcePath("README.md"))), "## The main job");
  const std::vector<std::string> got = Lines(printed);
  ASSERT_FALSE(want.empty()) << "README.md has no code block after '## The main job'";
  ASSERT_EQ(got.size(), want.size()) << "README.md's main-job block has " << want.size() << " lines, the job printed "
                                     << got.size() << ":\n"
                                     << printed;
  for (size_t i = 0; i < got.size(); ++i) {
    const Shape g = ShapeOf(got[i]), w = ShapeOf(want[i]);
    EXPECT_EQ(g.words, w.words) << "README.md main-job line " << i + 1 << " differs from the job's";
    ASSERT_EQ(g.numbers.size(), w.numbers.size()) << got[i];
    // Another processor's OpenBLAS kernels sum in another order: agreement to 1e-5 relative (docs/ARCHITECTURE.md).
    for (size_t k = 0; k < g.numbers.size(); ++k) {
      EXPECT_NEAR(g.numbers[k], w.numbers[k], 1e-5 * std::abs(w.numbers[k]) + 1e-9)
          << "README.md main-job line " << i + 1 << ": " << want[i] << "\nprinted: " << got[i];
    }
  }
  fs::remove_all(out);
}

// Every `$ onnxpipe ...` line of the README's code blocks (with its `\` continuations), in order, from a folder where
// models/ is the repository's: each exits 0.
TEST(ReadmeTest, ExampleCommandsRunOnTheShippedModels) {
  const std::vector<std::string> readme = Lines(ReadAll(SourcePath("README.md")));
  std::vector<std::string> commands;
  for (size_t i = 0; i < readme.size(); ++i) {
    if (readme[i].rfind("$ onnxpipe ", 0) != 0) continue;
    std::string cmd = readme[i].substr(2);
    while (!cmd.empty() && cmd.back() == '\\' && i + 1 < readme.size()) cmd.pop_back(), cmd += readme[++i];
    commands.push_back(cmd);
  }
  ASSERT_GE(commands.size(), 6u) << "README.md: expected an example per command";
  const fs::path dir = testing::MakeTempDir("readme_examples");
  fs::create_directory_symlink(SourcePath("models"), dir / "models");
  for (const std::string& cmd : commands) {
    const std::string run = "cd " + dir.string() + " && " + Onnxpipe() + cmd.substr(std::string("onnxpipe").size());
    CommandResult r = RunCommand(run);
    EXPECT_EQ(r.exit_code, 0) << "README.md example failed: " << cmd << "\n" << r.err;
  }
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace onnxpipe
