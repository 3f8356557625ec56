// UpcastHalfPrecision: a model stored in float16 or bfloat16 (weights, activations, Cast targets)
// becomes a float32 graph.
//
// onnxpipe keeps float32 master weights and chooses the compute precision itself (CPU: fp32/fp64;
// CUDA: bf16 compute with fp32 masters, DESIGN.md), so a half-precision export is imported as the
// same model at float32: every f16/bf16 value and constant is widened exactly, Cast-to-half nodes
// cast to f32 instead. A half graph input stays half and is cast to f32 by a new node right after
// it; a graph output stays half only when the graph produces it with an explicit Cast to half (it
// is then cast from the f32 value that computes it); other half outputs become f32. The
// roundings a half-precision run would apply between ops are not
// reproduced; the result is the model's float32 (or, with --dtype fp64, float64) evaluation.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class UpcastHalfPrecision : public Pass {
 public:
  std::string_view name() const override { return "upcast-half-precision"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
