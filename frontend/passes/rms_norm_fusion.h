// RMSNormFusion: rewrites the decompositions of RMSNorm that exporters write for Llama, Qwen2,
// Mistral and T5 (LlamaRMSNorm, T5LayerNorm) into the fused RMSNorm op (frontend/ir/op.h):
//
//   xf = x | Cast(x, f32)                  Llama computes in fp32: hidden.to(float32)
//   p  = Pow(xf, 2) | Mul(xf, xf)
//   v  = ReduceMean(p, axes)               axes: the trailing dims (usually [-1]), keepdims 1
//   s  = Add(v, eps)                       eps a frozen scalar constant >= 0, either operand order
//   n  = Mul(xf, Reciprocal(Sqrt(s)))      torch.rsqrt as both exporters write it; also
//      | Mul(xf, Div(1, Sqrt(s)))          1 / sqrt, and
//      | Mul(xf, Pow(s, -0.5))             s ** -0.5, and
//      | Div(xf, Sqrt(s))                  x / sqrt   (Casts allowed around Sqrt's operand and result)
//   y  = Mul(w, Cast?(n)) | Mul(Cast?(n), w)   w any value of x's dtype and the normalised shape (a
//                                          weight, or Gemma's 1 + weight)
//   -> RMSNorm(x, w) axis=<first reduced dim> epsilon=eps
//
// Every intermediate (p, v, s, the square root, the reciprocal, n and the Casts) must be used only
// inside the pattern; x may have other uses (the residual stream). Only float-to-float Casts are
// skipped; the fused node computes in x's dtype, which the folded graph of an fp32 or fp64 run
// has throughout (a Cast to the dtype a value already has folds away before fusion).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class RMSNormFusion : public Pass {
 public:
  std::string_view name() const override { return "rms-norm-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
