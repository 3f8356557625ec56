// DropoutFusion: a Dropout that is the only reader of a Gelu's output becomes the Gelu's fused
// dropout (attributes dropout and rng_key, op.h), so that the backends apply it in the Gelu's own
// pass over the elements (one read and one write instead of two of each, forward and backward). The
// backward reads the forward's keep decisions as bits (autodiff asks the Gelu for its KeepBits output:
// an eighth of a byte an element, not a draw of the random stream again), or regenerates them where
// the last dim is no multiple of 8.
//
// The fused Gelu's rng_key is the Dropout's key (its rng_key, else its name), so its mask is the
// unfused Dropout's element for element, and the fused graph computes what the unfused one does.
// A Dropout whose mask output is read stays.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class DropoutFusion : public Pass {
 public:
  std::string_view name() const override { return "dropout-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
