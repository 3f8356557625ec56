// Evaluates one node on host tensors. The CPU backend implements it; constant folding in
// frontend/passes is handed one, so the frontend never depends on a backend.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

class OpEvaluator {
 public:
  virtual ~OpEvaluator() = default;
  // inputs[i] is undefined (Tensor::defined() == false) for an absent optional input.
  // Returns one tensor per node output (undefined for outputs it does not compute).
  virtual absl::StatusOr<std::vector<Tensor>> Evaluate(const Node& node,
                                                       const std::vector<Tensor>& inputs) const = 0;
};

}  // namespace onnxpipe::ir
