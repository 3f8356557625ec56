// ONNX Pad (constant mode) through the importer (frontend/onnx/import_shape.cc: Concat with blocks of the fill), on
// the hand-built models of tests/data/onnx_pad (make_models.py: np.pad references, which onnxruntime equalled when
// they were written): the forward equals numpy (pads on chosen axes with a fill value at opset 18; on every axis at
// opset 13; pads computed in the graph from F.pad's list as TorchScript exports it; pads computed at run time from
// a dynamic dim), the gradient of X equals central finite differences, and reflect mode and negative pads fail
// naming the node.
#include <string>
#include <vector>

#include "frontend/ir/infer.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_pad", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(OnnxPadTest, ForwardEqualsNumpy) {
  for (const std::string name : {"pad_axes", "pad_all", "pad_traced", "pad_dynamic"}) {
    testing::ExpectOutputMatchesReference("onnx_pad", name, {Npy(name + ".X.npy")});  // copies only: equal
  }
}

TEST(OnnxPadTest, GradientEqualsFiniteDifferences) {
  for (const std::string name : {"pad_axes", "pad_all", "pad_traced", "pad_dynamic"}) {
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(name + ".onnx"), {{"X", Npy(name + ".X.npy")}}, 1e-6, [](const std::string&) { return true; });
    EXPECT_EQ(compared, std::vector<std::string>{"X"}) << name;
  }
}

TEST(OnnxPadTest, WhatIsNotImportedFailsNamingTheNode) {
  testing::ExpectLoadFailsNamingTheNode(
      "onnx_pad", "'/emb/pad' (Pad)",
      {{"pad_reflect", "mode 'reflect' is not supported"}, {"pad_negative", "negative pads"}});
}

}  // namespace
}  // namespace onnxpipe::autodiff
