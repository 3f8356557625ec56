// An ir::OpEvaluator over a backend, for host-side node-by-node drivers (the interpreter behind
// `onnxpipe run`, `train --eval`).
//
// Default: each node's host operands go to the backend, the node runs there with fresh output
// buffers, and its outputs come back by ToHost. Every value crosses the host link twice: a
// correctness path (conformance tests of a backend's kernels), not a fast one.
//
// Resident (constructed with the graph it will evaluate): the graph's constants are uploaded once,
// node outputs stay on the backend and only the graph's outputs come back to the host, so a forward
// pass moves its feeds and its outputs across the link and nothing else.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "executor/backend/backend.h"
#include "frontend/ir/evaluator.h"

namespace onnxpipe::backend {

class BackendEvaluator : public ir::OpEvaluator {
 public:
  BackendEvaluator(std::shared_ptr<const Backend> backend, ExecContext ctx = {})
      : backend_(std::move(backend)), ctx_(ctx) {}
  // Resident over `g` (which must outlive the evaluator and keep its constants).
  static absl::StatusOr<std::unique_ptr<BackendEvaluator>> Resident(std::shared_ptr<const Backend> backend,
                                                                    const ir::Graph& g, ExecContext ctx = {});

  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Node& node,
                                                   const std::vector<ir::Tensor>& inputs) const override;

 private:
  // An operand as the node reads it on the backend: its constant's upload, or a fresh one.
  absl::StatusOr<ir::Tensor> OnBackend(const ir::Tensor& t) const;

  std::shared_ptr<const Backend> backend_;
  ExecContext ctx_;
  bool resident_ = false;
  std::map<const void*, ir::Tensor> constants_;  // by the host bytes of the graph's constant
  std::set<ir::ValueId> host_values_;            // the graph's outputs (resident mode)
};

}  // namespace onnxpipe::backend
