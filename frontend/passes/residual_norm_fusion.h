// ResidualNormFusion: LayerNorm(Add(a, b)) with a and b of the LayerNorm input's shape becomes one
// LayerNorm with a fused residual (op.h): LayerNorm(b, scale, bias, residual = a), and when b is a
// Dropout's output that only the Add reads (its mask unread), the Dropout goes into the LayerNorm
// too (attrs dropout and rng_key: the Dropout's ratio and key, so the mask is the one it drew).
// Post-LN transformers (BERT, the benchmark encoder) add each sub-layer's dropped output to its
// input and normalise that; one kernel then reads both and writes the normalised value (and S)
// instead of three passes over the activations. The Add's value stays, as the LayerNorm's output
// 3 (Sum), when anything else reads it (pre-LN's residual stream). RMSNorm(Add(a, b)) fuses the same
// way (residual input 2, Sum output 2; a Dropout stays a node): the pre-norm Llama family's blocks.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class ResidualNormFusion : public Pass {
 public:
  std::string_view name() const override { return "residual-norm-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
