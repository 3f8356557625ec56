// DeadCodeElimination: removes every node none of whose outputs reaches a graph output.
//
// Values are never deleted; constants and parameters that lose their last use just stay unused
// (exporters and reports skip values with no use). Nodes of a valid graph have no side effects,
// so a node whose outputs are all dead (a Dropout whose result nobody reads, a Shape chain that
// folding left behind) can always go.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class DeadCodeElimination : public Pass {
 public:
  std::string_view name() const override { return "dce"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
