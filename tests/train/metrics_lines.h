// Reading `onnxpipe train --metrics` files in CLI tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace onnxpipe::testing {

// Every metrics line without its timing field (samples_per_s), so runs compare with ==.
inline std::vector<nlohmann::json> MetricsWithoutTiming(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    j.erase("samples_per_s");
    out.push_back(j);
  }
  return out;
}

}  // namespace onnxpipe::testing
