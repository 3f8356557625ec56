// Helpers shared by the ONNX frontend tests.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/onnx/loader.h"
#include "gtest/gtest.h"

namespace onnxpipe::onnx_frontend::testing {

// Path of a model written by make_test_models.py ("ops/Add.onnx").
inline std::string TestModel(const std::string& rel) {
  return std::string(ONNX_TEST_MODELS) + "/" + rel;
}

// Loads a model that must import; fails the test otherwise.
inline LoadedModel LoadOk(const std::string& rel, const LoadOptions& options = {}) {
  absl::StatusOr<LoadedModel> m = LoadOnnxModel(TestModel(rel), options);
  EXPECT_TRUE(m.ok()) << rel << ": " << m.status();
  if (!m.ok()) return {};
  return *std::move(m);
}

// The live nodes of a graph, in order.
inline std::vector<const ir::Node*> Nodes(const ir::Graph& g) {
  std::vector<const ir::Node*> out;
  for (ir::NodeId id : g.LiveNodes()) out.push_back(&g.node(id));
  return out;
}

// Element values of a tensor as doubles.
inline std::vector<double> Values(const ir::Tensor& t) {
  std::vector<double> v(t.num_elements());
  for (int64_t i = 0; i < t.num_elements(); ++i) v[i] = t.GetAsDouble(i);
  return v;
}

}  // namespace onnxpipe::onnx_frontend::testing
