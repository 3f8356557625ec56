// ONNX Conv with windows that tile the input, lowered at import to a MatMul
// (frontend/onnx/import_conv.cc), on the hand-built models of tests/data/onnx_conv (make_models.py:
// numpy references of the specification's window sums, which onnxruntime equalled when they were
// written): 2-D patch embeddings (with a symbolic batch, and with rows and columns left outside every
// window), a kernel-1 1-D conv, a 3-D one, a 2-D AveragePool and a 1-D MaxPool equal the references; the gradients
// of X, W and B equal central finite differences; overlapping windows and groups fail naming the node.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

const char* const kModels[] = {"patch2d", "batch2d", "trim2d", "point1d", "patch3d", "avgpool2d", "maxpool1d"};

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_conv", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(OnnxConvTest, ForwardEqualsTheWindowSums) {
  for (const std::string name : kModels) {
    testing::ExpectOutputMatchesReference("onnx_conv", name, {Npy(name + ".X.npy")}, 1e-5, 1e-5);
  }
}

TEST(OnnxConvTest, GradientsEqualFiniteDifferences) {
  for (const std::string name : {"patch2d", "trim2d", "point1d", "patch3d", "avgpool2d", "maxpool1d"}) {
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(name + ".onnx"), {{"X", Npy(name + ".X.npy")}}, 1e-6, [](const std::string&) { return true; });
    std::vector<std::string> want = {"W", "X"};
    if (name != "trim2d") want.insert(want.begin(), "B");
    if (name == "avgpool2d" || name == "maxpool1d") want = {"X"};
    std::vector<std::string> sorted = compared;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, want) << name;
  }
}

TEST(OnnxConvTest, OverlappingWindowsAndGroupsFailNamingTheNode) {
  testing::ExpectLoadFailsNamingTheNode("onnx_conv", "'/embed/patch' (Conv)",
                                        {{"overlap", "strides other than its kernel"}, {"groups", "has groups"}});
  testing::ExpectLoadFailsNamingTheNode("onnx_conv", "'/embed/patch' (MaxPool)",
                                        {{"overlap_pool", "strides other than its kernel"}});
}

}  // namespace
}  // namespace onnxpipe::autodiff
