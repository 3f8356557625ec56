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
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ::testing::HasSubstr;

std::string DataPath(const std::string& file) { return testing::TestDataPath("onnx_pad", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(OnnxPadTest, ForwardEqualsNumpy) {
  for (const std::string name : {"pad_axes", "pad_all", "pad_traced", "pad_dynamic"}) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(name + ".onnx"));
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    ASSERT_TRUE(ir::InferShapes(*m->graph).ok()) << name;
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(*m->graph, {Npy(name + ".X.npy")});
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    const ir::Tensor want = Npy(name + ".Y.npy");
    ASSERT_EQ((*out)[0].dims(), want.dims()) << name;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      ASSERT_EQ((*out)[0].data<float>()[i], want.data<float>()[i]) << name << " element " << i;  // copies only
    }
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
  const std::pair<const char*, const char*> cases[] = {
      {"pad_reflect", "mode 'reflect' is not supported"},
      {"pad_negative", "negative pads"},
  };
  for (const auto& [name, message] : cases) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(std::string(name) + ".onnx"));
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_THAT(m.status().message(), HasSubstr("'/emb/pad' (Pad)")) << name;
    EXPECT_THAT(m.status().message(), HasSubstr(message)) << name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
