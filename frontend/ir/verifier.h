// Structural checks run between passes: SSA (one producer per value), operands defined before
// use in the stored order, arity within the op list's bounds, graph outputs defined, constants'
// data matching their declared dtype and shape.
#pragma once

#include "absl/status/status.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

absl::Status Verify(const Graph& g);

}  // namespace onnxpipe::ir
