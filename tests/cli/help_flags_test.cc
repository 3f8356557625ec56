// Every flag each command's --help lists parses with a value of its kind: `onnxpipe CMD --FLAG VALUE --help` exits 0
// (the flags are parsed before --help is answered), so the help text cannot list a flag the parser does not know.
#include <regex>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_util.h"

namespace onnxpipe {
namespace {

using testing::CommandResult;
using testing::Onnxpipe;
using testing::RunCommand;

class HelpFlagsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HelpFlagsTest, EveryListedFlagParses) {
  const std::string command = GetParam();
  CommandResult help = RunCommand(Onnxpipe() + " " + command + " --help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  // "  --name STR  help", "  --name N  help", "  --name [a|b]  help" or a boolean "  --name  help".
  static const std::regex flag_line(R"(^  --([a-z0-9-]+)( STR| N| \[[^\]]*\])?\s)");
  std::istringstream in(help.out);
  int flags = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, flag_line) || m[1] == "help") continue;
    ++flags;
    const std::string kind = m[2].str();
    std::string value;
    if (kind == " STR") value = " x";
    if (kind == " N") value = " 1";  // an integer parses as a number too
    if (!kind.empty() && kind[1] == '[') value = " " + kind.substr(2, kind.find_first_of("|]") - 2);
    CommandResult r = RunCommand(Onnxpipe() + " " + command + " --" + m[1].str() + value + " --help");
    EXPECT_EQ(r.exit_code, 0) << "onnxpipe " << command << " --" << m[1] << value << ": " << r.err;
  }
  EXPECT_GE(flags, 3) << "onnxpipe " << command << " --help lists no flags:\n" << help.out;
}

INSTANTIATE_TEST_SUITE_P(Commands, HelpFlagsTest,
                         ::testing::Values("inspect", "run", "train", "partition", "profile", "launch"));

}  // namespace
}  // namespace onnxpipe
