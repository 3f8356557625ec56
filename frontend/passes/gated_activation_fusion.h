// GatedActivationFusion: rewrites the gated MLP activation that PyTorch's exporters (TorchScript and
// dynamo) write for Llama, Qwen2/3, Mistral, OLMo2, StableLM (SwiGLU) and Gemma (GeGLU) into the
// fused GatedActivation op (frontend/ir/op.h). Runs after GeluFusion, so a GELU is one Gelu node:
//
//   Y = Mul(act(gate), up)                          operands in either order
//   act = SiLU: Mul(gate, Sigmoid(gate))            operands in either order (nn.SiLU, F.silu)
//       | Gelu(gate), approximate none or tanh      (without a fused dropout)
//   -> GatedActivation(gate, up) activation=silu | gelu (approximate as the Gelu's)
//
// gate, up and Y must have one shape -- equal dim for dim, a symbolic dim only to the same symbol,
// so nothing broadcasts -- and one float dtype. The activation's nodes must be used only inside the
// pattern: an act(gate) that something else also reads stays as it is, and so does its product.
// gate and up may have other uses (and may be one value). Anything else is left alone: a Sigmoid
// of another value, a Mul of two plain values, HardSwish (an ONNX op that is not SiLU; the importer
// does not take it).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class GatedActivationFusion : public Pass {
 public:
  std::string_view name() const override { return "gated-activation-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
