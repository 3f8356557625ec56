// ONNX Conv with windows that tile the input, lowered at import to a MatMul
// (frontend/onnx/import_conv.cc), on the hand-built models of tests/data/onnx_conv (make_models.py:
// numpy references of the specification's window sums, which onnxruntime equalled when they were
// written): 2-D patch embeddings (with a symbolic batch, and with rows and columns left outside every
// window), a kernel-1 1-D conv and a 3-D one equal the references; the gradients of X, W and B equal
// central finite differences; overlapping windows and groups fail naming the node.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ::testing::HasSubstr;

const char* const kModels[] = {"patch2d", "batch2d", "trim2d", "point1d", "patch3d"};

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_conv", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(OnnxConvTest, ForwardEqualsTheWindowSums) {
  for (const std::string name : kModels) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(name + ".onnx"));
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    ASSERT_TRUE(ir::InferShapes(*m->graph).ok()) << name;
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(*m->graph, {Npy(name + ".X.npy")});
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    const ir::Tensor want = Npy(name + ".Y.npy");
    ASSERT_EQ((*out)[0].dims(), want.dims()) << name;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      const double expected = want.GetAsDouble(i);
      EXPECT_NEAR((*out)[0].GetAsDouble(i), expected, 1e-5 + 1e-5 * std::abs(expected)) << name << " element " << i;
    }
  }
}

TEST(OnnxConvTest, GradientsEqualFiniteDifferences) {
  for (const std::string name : {"patch2d", "trim2d", "point1d", "patch3d"}) {
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(name + ".onnx"), {{"X", Npy(name + ".X.npy")}}, 1e-6, [](const std::string&) { return true; });
    std::vector<std::string> want = {"W", "X"};
    if (name != "trim2d") want.insert(want.begin(), "B");
    std::vector<std::string> sorted = compared;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, want) << name;
  }
}

TEST(OnnxConvTest, OverlappingWindowsAndGroupsFailNamingTheNode) {
  const std::pair<const char*, const char*> cases[] = {{"overlap", "strides other than its kernel"},
                                                       {"groups", "has groups"}};
  for (const auto& [name, message] : cases) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(std::string(name) + ".onnx"));
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_THAT(m.status().message(), HasSubstr("'/embed/patch' (Conv)")) << name;
    EXPECT_THAT(m.status().message(), HasSubstr(message)) << name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
