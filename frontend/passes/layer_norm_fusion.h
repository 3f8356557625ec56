// LayerNormFusion: rewrites the opset < 17 decomposition of nn.LayerNorm that PyTorch's exporter
// writes into the fused LayerNorm op (frontend/ir/op.h); ONNX LayerNormalization (opset 17)
// already imports as LayerNorm.
//
//   m = ReduceMean(x, axes=[-1])          axes may also name the last axis positively
//   d = Sub(x, m)
//   p = Pow(d, 2)  |  Mul(d, d)           optionally with float Casts around d/p/v (the exporter
//   v = ReduceMean(p, axes=[-1])          inserts them for reduced-precision inputs)
//   s = Sqrt(Add(v, eps))                 eps a scalar constant, either operand order
//   n = Div(d, s)  |  Mul(d, Reciprocal(s))
//   y = Mul(n, scale) [Add(y, bias)]      either operand order
//   -> LayerNorm(x, scale, bias) axis=-1 epsilon=eps
//
// scale and bias must be 1-D (the normalized dim). Every intermediate (m, d, p, v, s, n and the
// scaled value when a bias follows) must be used only inside the pattern; otherwise nothing is
// rewritten. keepdims must be 1 on both reductions.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class LayerNormFusion : public Pass {
 public:
  std::string_view name() const override { return "layer-norm-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
