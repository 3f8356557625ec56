// LinearFusion: matches the ways PyTorch's TorchScript exporter (torch 1.13, opsets 14-17) writes
// nn.Linear and rewrites them to the fused Linear op (frontend/ir/op.h):
//
//   MatMul(X, W) [+ Add(b)]                 -> Linear(X, W, b) trans_b=0   W constant (K, N)
//   MatMul(X, Transpose(W, [1,0])) [+ Add(b)] -> Linear(X, W, b) trans_b=1 W constant (N, K)
//   Gemm(X, W, b) alpha=beta=1, transA=0     -> Linear(X, W, b) trans_b=transB
//
// W must hold constant data (a parameter or a constant) and be 2-D; the bias must be a constant
// of shape (N), on either side of the Add. The Add is absorbed only when the MatMul result has no
// other consumer; a Transpose of W that other nodes still use stays for them. Gemm with any other
// attributes (alpha, beta != 1, transA) or a 2-D/scalar C stays Gemm. X may have any rank for
// MatMul (the exporter's 3-D (S, B, D) activations), and must be 2-D for Gemm.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class LinearFusion : public Pass {
 public:
  std::string_view name() const override { return "linear-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
