// RotaryFusion: rewrites the rotary position embedding that PyTorch's exporters write for Hugging
// Face models (both the TorchScript and the dynamo exporter) into the fused Rotary op
// (frontend/ir/op.h). Two rewrites, the second after the first:
//
// 1. Y = Add(Mul(x, cos), Mul(rot(x), sin))   operands of the Add and of each Mul in either order
//    rotate-half (Llama, Qwen2/3, Mistral, Gemma, GPT-NeoX, Phi, Falcon, StableLM), x of width W:
//      rot(x) = Concat(Neg(Slice(x, [W/2, W))), Slice(x, [0, W/2)), axis=last)
//    interleaved (GPT-J's rotate_every_two: stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)):
//      rot(x) = Reshape(Concat(Unsqueeze(Neg(Slice(x, 1::2)), last+1), Unsqueeze(Slice(x, 0::2),
//               last+1), axis=last+1), x's shape)
//    -> Rotary(x, cos, sin) rotary_dim=W, interleaved=0|1
// 2. Partial rotary (GPT-NeoX, Phi, StableLM, GPT-J): the rotated slice put back in front of the
//    rest, Concat(Rotary(Slice(x, [0, R))), Slice(x, [R, W)), axis=last)
//    -> Rotary(x, cos, sin) rotary_dim=R
//
// Slices are along the last axis with constant bounds (any spelling of the end: W, INT64_MAX, ...)
// and step 1, or 2 in the interleaved form. cos and sin must have one shape (..., W) (R for step 2)
// that broadcasts to x's, x's dtype, and must not depend on a trainable parameter (Rotary gives
// them no gradient); Y must have x's shape. Every intermediate is used only inside the pattern; x
// may have other uses. Anything else -- another sign, another slice, another concat axis, tables
// of another width -- is left as it is.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class RotaryFusion : public Pass {
 public:
  std::string_view name() const override { return "rotary-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
