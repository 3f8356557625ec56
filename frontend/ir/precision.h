// Changes the floating-point precision a graph computes in: every f32 value (inputs, constants,
// intermediates, Cast targets) becomes `to` (f64 for gradient checks and bitwise references).
// Outputs keep their new dtype; callers convert feeds with Tensor::CastTo.
#pragma once

#include "absl/status/status.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

absl::Status ConvertFloatPrecision(Graph& g, DType from, DType to);

}  // namespace onnxpipe::ir
