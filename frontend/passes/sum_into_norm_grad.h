// SumIntoNormGrad: a LayerNormGrad or RMSNormGrad whose dY is a Sum read by nothing else takes the
// Sum's last addend as its dY2 input (op.h) and the Sum's other addends as dY (the Sum itself when
// more than one is left, else that one value), so the kernel adds the two as it loads the incoming
// gradient instead of a separate kernel writing their sum and the norm's backward reading it back.
// Autodiff writes that Sum where a normalised value has several readers: the residual stream of a
// post-norm block (the next sub-layer's input and its residual), the separate Q, K and V
// projections of one norm's output. The addends must have the Sum's dtype and shape (no
// broadcast). Runs on the training graph, after autodiff; a second run changes nothing.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class SumIntoNormGrad : public Pass {
 public:
  std::string_view name() const override { return "sum-into-norm-grad"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
