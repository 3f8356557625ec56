// An ir::OpEvaluator over a backend, for host-side node-by-node drivers (the interpreter behind
// `onnxpipe run`): each node's host operands go to the backend, the node runs there with fresh
// output buffers, and its outputs come back by ToHost. Every value crosses the host link twice:
// a correctness path (conformance tests of a backend's kernels), not a fast one.
#pragma once

#include <memory>
#include <vector>

#include "executor/backend/backend.h"
#include "frontend/ir/evaluator.h"

namespace onnxpipe::backend {

class BackendEvaluator : public ir::OpEvaluator {
 public:
  BackendEvaluator(std::shared_ptr<const Backend> backend, ExecContext ctx = {})
      : backend_(std::move(backend)), ctx_(ctx) {}
  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Node& node,
                                                   const std::vector<ir::Tensor>& inputs) const override;

 private:
  std::shared_ptr<const Backend> backend_;
  ExecContext ctx_;
};

}  // namespace onnxpipe::backend
