// A child process running an onnxpipe command line, for CLI tests that signal or kill it mid-run.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/cli/cli_util.h"

namespace onnxpipe::testing {

// A child running `command` (through exec, so the pid is onnxpipe's) with stdout/stderr in files.
struct Child {
  pid_t pid = -1;
  std::filesystem::path out, err;
};

inline Child Spawn(const std::string& command, const std::filesystem::path& dir, const std::string& tag) {
  Child c;
  c.out = dir / (tag + ".out");
  c.err = dir / (tag + ".err");
  const std::string cmd = "exec " + command + " >" + c.out.string() + " 2>" + c.err.string();
  c.pid = fork();
  if (c.pid == 0) {
    signal(SIGINT, SIG_DFL);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return c;
}

// Waits until the child's stdout holds `text` (or the child ended); false on timeout.
inline bool WaitForOutput(const Child& c, const std::string& text, int timeout_s = 120) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadAll(c.out.string()).find(text) != std::string::npos) return true;
    int status;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

}  // namespace onnxpipe::testing
