// FreezeBuffers: decides which float initializers are trained (autodiff/trainable.h's rule) and
// marks the others ir::ParamState::kFrozen, so that the passes after it treat the buffers and
// constants an exporter wrote as initializers (rotary inv_freq, mask fill values, eps, attention
// scales) as constants: an attention scale is read into Attention's attribute, a mask built from
// them is a mask rather than a learned bias. It runs first in the forward pipeline, on the graph as
// imported (before folding removes the Casts of positions the rule looks for). Initializers already
// decided (`onnxpipe train` decides them on the imported graph with the user's --freeze and
// --train-only) are left as they are; a second run changes nothing.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class FreezeBuffers : public Pass {
 public:
  std::string_view name() const override { return "freeze-buffers"; }
  // True when it froze anything.
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
