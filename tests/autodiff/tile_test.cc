// ONNX Tile through the importer's lowering (frontend/onnx/import_shape.cc: Reshape, Expand, Reshape
// with the shapes computed in the graph), on the models of tests/data/tile (make_models.py, numpy.tile
// references; onnxruntime agreed with them when they were written): constant and graph-computed
// repeats give numpy's result exactly, and the gradient of X (a sum over the copies) equals central
// finite differences.
#include <cmath>
#include <string>
#include <vector>

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/precision.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"
#include "tests/autodiff/onnx_grad_check.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

std::string DataPath(const std::string& file) { return testing::TestDataPath("tile", file); }

ir::Tensor Npy(const std::string& file) { return testing::ReadTestNpy(DataPath(file)); }

struct Case {
  std::string name;
  std::vector<std::string> inputs;  // graph inputs, in order
};

std::vector<Case> Cases() { return {{"const_f64", {"X"}}, {"dynamic_f32", {"X", "R"}}}; }

TEST(TileOnnxTest, LowersToOpsWithKernelsAndGradients) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    int expands = 0;
    for (ir::NodeId id : m->graph->LiveNodes()) {
      const ir::Node& n = m->graph->node(id);
      EXPECT_NE(ir::OpName(n.op), "Tile") << c.name;
      expands += n.op == ir::OpKind::kExpand;
    }
    EXPECT_EQ(expands, 1) << c.name;
    // The lowering's last node keeps the ONNX node's name and output.
    const ir::ValueId y = m->graph->FindValue("Y");
    ASSERT_NE(y, ir::kNoValue);
    EXPECT_EQ(m->graph->node(m->graph->value(y).producer).name, "/blk/Tile") << c.name;
  }
}

TEST(TileOnnxTest, ForwardEqualsNumpyTile) {
  for (const Case& c : Cases()) {
    absl::StatusOr<onnx_frontend::LoadedModel> m = onnx_frontend::LoadOnnxModel(DataPath(c.name + ".onnx"));
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(ir::InferShapes(*m->graph).ok());
    std::vector<ir::Tensor> in;
    for (const std::string& name : c.inputs) in.push_back(Npy(c.name + "." + name + ".npy"));
    const ir::Tensor want = Npy(c.name + ".Y.npy");
    absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(*m->graph, in);
    ASSERT_TRUE(out.ok()) << c.name << ": " << out.status();
    ASSERT_EQ(out->size(), 1u);
    const ir::Tensor& got = (*out)[0];
    EXPECT_EQ(got.dtype(), want.dtype()) << c.name;
    ASSERT_EQ(got.dims(), want.dims()) << c.name;
    for (int64_t i = 0; i < want.num_elements(); ++i)
      EXPECT_EQ(got.GetAsDouble(i), want.GetAsDouble(i)) << c.name << " [" << i << "]";  // copies: exact
  }
}

TEST(TileOnnxTest, GradientOfXEqualsFiniteDifferences) {
  for (const Case& c : Cases()) {
    // Every input bound as an initializer, so that X is differentiated (R is read for its shape only).
    std::map<std::string, ir::Tensor> constants;
    for (const std::string& name : c.inputs) constants[name] = Npy(c.name + "." + name + ".npy");
    const std::vector<std::string> compared = testing::ExpectGradientsMatchFiniteDifferences(
        DataPath(c.name + ".onnx"), std::move(constants), 1e-7, [](const std::string& name) { return name == "X"; });
    EXPECT_EQ(compared, std::vector<std::string>{"X"}) << c.name;
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
