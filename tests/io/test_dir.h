// A fresh scratch folder per test under the build tree's tmp, removed when the test passes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace onnxpipe {

class TestDir {
 public:
  explicit TestDir(const std::string& name) {
    path_ = std::filesystem::path(ONNXPIPE_BINARY_DIR) / "test_tmp" /
            (name + "." + std::to_string(static_cast<long>(getpid())));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() {
    if (!::testing::Test::HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  std::string path() const { return path_.string(); }
  std::string Path(const std::string& rel) const { return (path_ / rel).string(); }
  // Sorted names of the entries directly in the folder.
  std::vector<std::string> ListNames() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace onnxpipe
