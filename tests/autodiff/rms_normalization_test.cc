// ONNX RMSNormalization (ai.onnx opset 23) through the importer (frontend/onnx/import_reduce.cc), on
// the hand-built models of tests/data/rms_normalization (make_models.py, with references from the
// specification's formula in numpy; onnxruntime agreed with them when they were written): the node
// imports to one IR RMSNorm with the file's attributes, the forward equals numpy, the gradients of
// X and scale equal central finite differences, and malformed nodes fail with a clear message.
#include <algorithm>
#include <cmath>
#include <string>

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/precision.h"
#include "frontend/onnx/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ::testing::HasSubstr;

std::string DataPath(const std::string& file) { return testing::TestDataPath("rms_normalization", file); }

struct Case {
  std::string name;
  int64_t axis;
  double epsilon;  // as the file holds it (a FLOAT attribute)
  double fwd_tol;  // max |onnxpipe - numpy| relative to max |numpy|
};

std::vector<Case> Cases() {
  return {{"last_axis_f64", -1, static_cast<double>(1e-3f), 1e-13},
          {"two_axes_f32", 1, static_cast<double>(1e-5f), 1e-6}};
}

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

TEST(RMSNormalizationOnnxTest, ImportsToOneRMSNormWithTheFileAttributes) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    ASSERT_TRUE(m->graph);
    // Opset 23 is beyond libonnx 1.12: its checker is skipped, with a warning.
    ASSERT_EQ(m->warnings.size(), 1u) << c.name;
    EXPECT_THAT(m->warnings[0], HasSubstr("opset 23"));
    const std::vector<ir::NodeId> nodes = m->graph->LiveNodes();
    ASSERT_EQ(nodes.size(), 1u) << c.name;
    const ir::Node& n = m->graph->node(nodes[0]);
    EXPECT_EQ(n.op, ir::OpKind::kRMSNorm);
    EXPECT_EQ(n.name, "/norm/RMSNormalization");
    EXPECT_EQ(n.attrs.Get<int64_t>("axis", 0), c.axis) << c.name;
    EXPECT_EQ(n.attrs.Get<double>("epsilon", 0), c.epsilon) << c.name;
    EXPECT_EQ(n.inputs.size(), 2u);
    EXPECT_EQ(n.outputs.size(), 1u);
  }
}

TEST(RMSNormalizationOnnxTest, ForwardEqualsNumpy) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(ir::InferShapes(*m->graph).ok());
    const ir::Tensor x = Npy(c.name + ".X.npy");
    const ir::Tensor want = Npy(c.name + ".Y.npy").CastTo(ir::DType::kF64);
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(*m->graph, {x});
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 1u);
    EXPECT_EQ((*out)[0].dtype(), x.dtype());
    const ir::Tensor got = (*out)[0].CastTo(ir::DType::kF64);
    ASSERT_EQ(got.dims(), want.dims());
    double scale = 0, err = 0;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      scale = std::max(scale, std::abs(want.data<double>()[i]));
      err = std::max(err, std::abs(got.data<double>()[i] - want.data<double>()[i]));
    }
    EXPECT_LE(err, c.fwd_tol * scale) << c.name;
  }
}

TEST(RMSNormalizationOnnxTest, GradientsEqualFiniteDifferences) {
  for (const Case& c : Cases()) {
    // X bound as an initializer, so that it is differentiated like scale; the f32 model in f64.
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(c.name + ".onnx"), {{"X", Npy(c.name + ".X.npy")}}, 1e-6, [](const std::string&) { return true; });
    EXPECT_EQ(compared.size(), 2u) << c.name;  // X and scale
  }
}

TEST(RMSNormalizationOnnxTest, MalformedNodesFailClearly) {
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"bad_axis",
       {"'/norm/RMSNormalization' (RMSNormalization)", "attribute axis 3 is out of range", "of rank 3", "-3 to 2"}},
      {"bad_stash_type", {"'/norm/RMSNormalization' (RMSNormalization)", "stash_type must be a float type", "got 7"}},
      {"opset22", {"'/norm/RMSNormalization' (RMSNormalization)", "exists from opset 23", "uses 22"}},
  };
  for (const auto& [name, mentions] : cases) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(std::string(name) + ".onnx"));
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << name;
    for (const std::string& s : mentions) EXPECT_THAT(m.status().message(), HasSubstr(s)) << name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
