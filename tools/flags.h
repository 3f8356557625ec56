// A small per-subcommand flag parser: each subcommand declares its flags with help text, so
// `onnxpipe <cmd> --help` lists exactly its flags and a bad flag is named in the error.
// Accepts `--name value`, `--name=value`, and `--flag` / `--no-flag` for booleans.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace onnxpipe::tools {

class FlagSet {
 public:
  FlagSet(std::string command, std::string usage, std::string description);

  void String(const std::string& name, std::string* out, const std::string& help);
  void Int(const std::string& name, int64_t* out, const std::string& help);
  void Double(const std::string& name, double* out, const std::string& help);
  void Bool(const std::string& name, bool* out, const std::string& help);
  // A flag whose value may be left out: `--name` alone sets `implicit`; `--name=V`, or `--name V` where V is one
  // of `values`, sets V (any other next argument is left for the next flag or the positionals).
  void OptionalString(const std::string& name, std::string* out, const std::string& implicit,
                      const std::vector<std::string>& values, const std::string& help);

  // Parses args (without the program and command names). Positional arguments are collected in
  // positional(). Sets help_requested() on --help / -h.
  absl::Status Parse(const std::vector<std::string>& args);
  // Whether the flag appeared on the command line.
  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool help_requested() const { return help_; }
  std::string Usage() const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool, kOptionalString };
  struct Flag {
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
    std::string implicit = {};             // kOptionalString: the value of `--name` alone
    std::vector<std::string> values = {};  // kOptionalString: the values `--name V` accepts as a separate argument
  };
  absl::Status Assign(const std::string& name, Flag& f, const std::string& value);

  std::string command_, usage_, description_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::map<std::string, bool> set_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace onnxpipe::tools
