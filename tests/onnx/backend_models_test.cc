// ONNX's own backend-test models (Debian libonnx-testdata), ~930 single-op models: each loads,
// or fails for one of the documented reasons (opset outside 13-23, an unsupported dtype or
// non-tensor type, a static operand such as axes fed as a graph input), never otherwise.
#include <filesystem>
#include <set>

#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"

namespace onnxpipe::onnx_frontend {
namespace {

namespace fs = std::filesystem;

TEST(BackendModelsTest, SupportedNodeTestsImport) {
  const fs::path root = "/usr/share/libonnx-testdata/data/node";
  if (!fs::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  LoadOptions options;
  options.allow_unsupported = true;
  int imported = 0;
  std::vector<std::string> failures;
  for (const auto& dir : fs::directory_iterator(root)) {
    const fs::path model = dir.path() / "model.onnx";
    if (!fs::exists(model)) continue;
    absl::StatusOr<LoadedModel> m = LoadOnnxModel(model.string(), options);
    if (!m.ok()) {
      failures.push_back(dir.path().filename().string() + ": " + std::string(m.status().message()));
      continue;
    }
    if (m->graph) ++imported;
  }
  const char* kExpected[] = {"onnxpipe supports opsets 13 to 23", "is not supported",
                             "must be a constant", "imports no ai.onnx opset"};
  for (const std::string& f : failures) {
    bool expected = false;
    for (const char* reason : kExpected) expected |= f.find(reason) != std::string::npos;
    EXPECT_TRUE(expected) << f;
  }
  // 1.12's node tests hold 273 models of supported ops at opsets 13-17 with static operands.
  EXPECT_GE(imported, 250) << failures.size() << " failed";
}

}  // namespace
}  // namespace onnxpipe::onnx_frontend
