// The onnxpipe subcommands. Each returns the process exit code: 0 success, 1 failure (the error
// was printed), 2 usage error.
#pragma once

#include <string>
#include <vector>

namespace onnxpipe::tools {

using Args = std::vector<std::string>;

int RunInspect(const Args& args);
int RunRun(const Args& args);
int RunTrain(const Args& args);
int RunPartition(const Args& args);
int RunProfile(const Args& args);
int RunLaunch(const Args& args);

// Prints "onnxpipe <command>: <message>" to stderr and returns 1 (or 2 for usage errors).
int Fail(const std::string& command, const std::string& message, int code = 1);

}  // namespace onnxpipe::tools
