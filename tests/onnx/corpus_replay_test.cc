// Replays the fuzzer's seed corpus (fuzz/corpus/onnx_loader/) through LoadOnnxModelFromBytes, as
// CI cannot run libFuzzer: every file must come back with OK or an error status, never crash.
// Seeds named valid_* are well-formed models and must load.
#include <filesystem>
#include <fstream>

#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"

namespace onnxpipe::onnx_frontend {
namespace {

namespace fs = std::filesystem;

TEST(FuzzCorpusReplayTest, EveryFileReturnsAStatus) {
  const fs::path dir = fs::path(ONNXPIPE_SOURCE_DIR) / "fuzz" / "corpus" / "onnx_loader";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0, valid = 0, ok = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    std::ifstream f(entry.path(), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string name = entry.path().filename().string();
    // As the fuzzer: no base directory, so external data is refused rather than read.
    absl::StatusOr<LoadedModel> m = LoadOnnxModelFromBytes(bytes, name, /*base_dir=*/"");
    if (m.ok()) {
      ++ok;
    } else {
      EXPECT_FALSE(m.status().message().empty()) << name;
    }
    if (name.rfind("valid_", 0) == 0) {
      ++valid;
      EXPECT_TRUE(m.ok()) << name << ": " << m.status();
    }
  }
  EXPECT_GE(files, 20);
  EXPECT_GE(valid, 5);
  EXPECT_GE(ok, valid);
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
