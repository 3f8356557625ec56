// CastIntoGemm: a FusedMatMul over bf16 operands whose every output is read only by one Cast to
// f32 writes f32 itself (attribute `to`, op.h): the GEMM accumulates in fp32 either way, so the
// result is the same rounding-once of the fp32 sum minus the bf16 rounding in between, and the
// separate cast kernel and bf16 buffer go. Under mixed precision (passes/mixed_precision.h) this is
// each weight gradient and bias gradient (KSum) of a Linear on its way to its f32 master, so it runs
// on the training graph, after autodiff.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class CastIntoGemm : public Pass {
 public:
  std::string_view name() const override { return "cast-into-gemm"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
