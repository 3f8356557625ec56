// Helpers for pass tests: a terse graph builder, op histograms, and a tiny evaluator that knows
// just the few ops the folding tests need (elementwise arithmetic, Gather, Unsqueeze, Concat,
// Cast, Equal on small tensors), so folding is tested independently of the CPU backend.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::passes::testing {

class GraphBuilder {
 public:
  ir::Graph& graph() { return g_; }

  ir::ValueId Input(const std::string& name, ir::Shape shape, ir::DType dtype = ir::DType::kF32);
  // A trainable parameter: float initializer with deterministic pseudo-random data.
  ir::ValueId Param(const std::string& name, std::vector<int64_t> dims, float scale = 0.5f);
  // A frozen constant (as a Constant node's value becomes on import).
  ir::ValueId Const(const std::string& name, ir::Tensor t);
  ir::ValueId Scalar(float v);
  ir::ValueId IntVec(std::vector<int64_t> v);
  // Adds a node with one output of the given shape and dtype; returns the output.
  ir::ValueId Op(ir::OpKind op, std::vector<ir::ValueId> inputs, ir::Shape out_shape,
                 ir::Attrs attrs = {}, ir::DType dtype = ir::DType::kF32);
  // The node that produced `v` (for inspecting attributes).
  ir::NodeId last_node() const { return last_node_; }
  void Output(ir::ValueId v) { g_.outputs().push_back(v); }

 private:
  ir::Graph g_;
  int counter_ = 0;
  uint32_t seed_ = 12345;
  ir::NodeId last_node_ = ir::kNoNode;
};

ir::Attrs MakeAttrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv);

std::map<std::string, int> Histogram(const ir::Graph& g);
// "Add:2 MatMul:1" for failure messages.
std::string HistogramString(const ir::Graph& g);
// Live nodes of one op kind.
std::vector<const ir::Node*> NodesOf(const ir::Graph& g, ir::OpKind op);

class TinyEvaluator : public ir::OpEvaluator {
 public:
  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(
      const ir::Node& node, const std::vector<ir::Tensor>& inputs) const override;
  mutable int calls = 0;
};

}  // namespace onnxpipe::passes::testing
