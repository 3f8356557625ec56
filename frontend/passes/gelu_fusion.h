// GeluFusion: rewrites the two GELU decompositions into Gelu (frontend/ir/op.h).
//
//   erf:  x * 0.5 * (1 + Erf(x / 1.41421))        (or Erf(x * 0.70711))   -> Gelu approximate=none
//   tanh: x * 0.5 * (1 + Tanh(0.79788 * (x + 0.044715 * x^3)))           -> Gelu approximate=tanh
//         with x^3 as Pow(x, 3) or any product x*x*x
//
// The outer product is matched as a tree of Mul nodes in any association and operand order
// (Mul(Mul(x, 0.5), A), Mul(x, Mul(A, 0.5)), Mul(0.5, Mul(x, A)), ...): its leaves must be exactly
// {x, 0.5, A}. Constants are compared with a relative tolerance of 1e-4. Every inner node must be
// used only inside the pattern.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class GeluFusion : public Pass {
 public:
  std::string_view name() const override { return "gelu-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
