// onnxpipe: the command-line tool. `onnxpipe <command> --help` documents each command.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "tools/commands.h"

namespace onnxpipe::tools {
namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args&);
};

constexpr Command kCommands[] = {
    {"inspect", "import an ONNX model and explain it: inputs, ops before/after fusion, parameters", RunInspect},
    {"run", "evaluate the forward pass on the CPU or a GPU (.pb or .npy inputs -> .npy outputs)", RunRun},
    {"train", "train on the CPU or GPUs, one stage or a pipeline plan (npy data, SGD/AdamW, metrics JSONL)", RunTrain},
    {"partition", "split the training graph into pipeline stages that fit the GPUs; plan + reports", RunPartition},
    {"profile", "measure per-op times of the training graph on the CPU or a GPU (for partition --profile)", RunProfile},
    {"launch", "start and supervise the ranks of a multi-process run (as torchrun): launch --nproc N -- train ...",
     RunLaunch},
};

void PrintUsage(FILE* out) {
  std::fprintf(out,
               "onnxpipe — compile ONNX transformer graphs for pipelined training\n\n"
               "usage: onnxpipe <command> [flags]   (onnxpipe <command> --help for its flags)\n\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
}

}  // namespace

int Fail(const std::string& command, const std::string& message, int code) {
  std::fprintf(stderr, "onnxpipe %s: %s\n", command.c_str(), message.c_str());
  return code;
}

}  // namespace onnxpipe::tools

int main(int argc, char** argv) {
  using namespace onnxpipe::tools;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // An allocation that fails anywhere is an error naming it, never an abort (the plan's own memory is checked
    // before the run; this catches what is allocated outside it: data, host copies, kernels' temporaries).
    try {
      return c.run(Args(argv + 2, argv + argc));
    } catch (const std::bad_alloc& e) {
      return Fail(c.name, std::string("out of host memory: ") + e.what());
    }
  }
  std::fprintf(stderr, "onnxpipe: unknown command '%s'\n\n", argv[1]);
  PrintUsage(stderr);
  return 2;
}
