// TieTransposedInitializers: re-ties a weight that an exporter split into two initializers, one
// the exact transpose of the other.
//
// A GPT-style model whose lm head shares the token embedding has one parameter used twice. The
// TorchScript exporter keeps it as one initializer (Gather + Transpose/MatMul); PyTorch 2's dynamo
// exporter folds the head's transpose into a second initializer (W and W^T, unrelated names). A
// trainer would then train two independent copies and diverge from PyTorch after the first step.
// This pass finds pairs of 2-D float initializers where B is bitwise A^T, and rewrites B's uses to
// Transpose(A), so the gradient of both uses accumulates into A. B stops being an initializer.
//
// Only exact transposes with at least two distinct values are tied: a constant-valued matrix
// (all zeros, all ones) may well be two independent parameters that happen to start equal, and
// plain equality is never used (deep-copied layers start bitwise equal and are not tied).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class TieTransposedInitializers : public Pass {
 public:
  std::string_view name() const override { return "tie-transposed-initializers"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
  // "B = A^T" per tie made by the last Run (for logs and tests).
  const std::vector<std::string>& ties() const { return ties_; }

 private:
  std::vector<std::string> ties_;
};

}  // namespace onnxpipe::passes
