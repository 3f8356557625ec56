// GathersToSplit: a tensor taken apart along one axis by scalar Gathers or by Slices becomes one
// Split.
//
//   q = Gather(X, 0, axis a), k = Gather(X, 1, axis a), v = Gather(X, 2, axis a)
//   ->  X0, X1, X2 = Split(X, axis a, split 1,1,1);  q = Squeeze(X0, a), k = Squeeze(X1, a), ...
//   q = Slice(X, [0], [E], [a]), k = Slice(X, [E], [2E], [a]), v = Slice(X, [2E], [inf], [a])
//   ->  q, k, v = Split(X, axis a, split E,E,E)
//
// (torch.nn.MultiheadAttention's packed projection exports one way or the other, depending on
// the torch version.) It fires when every use of X is such a Gather (constant scalar index) or
// Slice (constant operands, one axis, step 1), all along the same axis, the pieces tile the axis's
// static extent exactly (each index once, no gap), and X is not a graph output. The forward moves
// the same bytes; the backward is one Concat instead of a zero-filled table per piece and their Sum.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class GathersToSplit : public Pass {
 public:
  std::string_view name() const override { return "gathers-to-split"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
