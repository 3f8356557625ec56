// KSumFromProducer: a weight-gradient FusedMatMul's KSum output (op.h: the following Linear's bias
// gradient, dY's column sums) moves to the kernel that wrote dY, when that kernel can sum its own
// output as it stores it (GeluGrad's dXSums; LayerNormGrad's dXSums and dXDroppedSums, a post-norm
// block's sub-layer output): the sums then cost no second read of dY, and the GEMM runs without
// cuBLASLt's BGRAD epilogue, which slows a bf16 weight-gradient GEMM by 15 to 40 %.
//
// Matched: FusedMatMul with k_sum summing over its operand's stored rows (k_sum 'a' with trans_a,
// 'b' without trans_b), the operand the producer's rank-2 output or a Flatten of it that keeps its
// last dim (autodiff's (rows, N) view of dY), the producer's sums output unused so far. The KSum value
// becomes the producer's output, in its dtype (sums_to). Runs on the training graph after autodiff
// and CastIntoGemm (which fix the KSum's dtype); a second run changes nothing.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class KSumFromProducer : public Pass {
 public:
  std::string_view name() const override { return "ksum-from-producer"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
