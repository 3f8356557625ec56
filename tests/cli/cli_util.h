// Helpers for tests that run the onnxpipe binary and the Python reference scripts.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace onnxpipe::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// For tests that compare one process with launched ranks bit for bit: every onnxpipe they start runs OpenBLAS on one
// thread. A rank sizes OpenBLAS's pool by its share of the CPUs and one process by all of them, and on some CPUs
// (AVX2 kernels, seen on AMD EPYC) OpenBLAS's sums depend on its thread count; the property under test is the
// pipeline's and the comm's, not OpenBLAS's.
inline void PinBlasThreadsForBitwiseRuns() { setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1); }

// A fresh temporary folder, removed by the caller's TearDown if wanted.
inline std::filesystem::path MakeTempDir(const std::string& tag) {
  std::string templ = (std::filesystem::temp_directory_path() / ("onnxpipe_" + tag + "_XXXXXX")).string();
  char* made = mkdtemp(templ.data());
  return made ? std::filesystem::path(made) : std::filesystem::path();
}

// `s` as one single-quoted shell word.
inline std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` through the shell, capturing stdout and stderr separately.
inline CommandResult RunCommand(const std::string& command) {
  static int counter = 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(getpid()) + "_" + std::to_string(counter++);
  const std::string out = (dir / ("onnxpipe_cmd_" + tag + ".out")).string();
  const std::string err = (dir / ("onnxpipe_cmd_" + tag + ".err")).string();
  const int status = std::system((command + " >" + out + " 2>" + err).c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

inline std::string Onnxpipe() { return std::string(ONNXPIPE_BINARY_DIR) + "/tools/onnxpipe"; }
inline std::string SourcePath(const std::string& rel) { return std::string(ONNXPIPE_SOURCE_DIR) + "/" + rel; }
inline std::string Python() { return std::string(ONNXPIPE_PYTHON); }

}  // namespace onnxpipe::testing
