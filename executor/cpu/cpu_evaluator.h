// The CPU backend's node evaluator: evaluates any op of frontend/ir/op.h (and any op another file
// registers a kernel for, see kernel.h) on host tensors, fp32 and fp64 for float ops (bf16/f16
// through fp32, cpu_evaluator.cc), i64/i32 for the integer-capable ops, bool for logic. An op/dtype pair without a kernel is an error naming
// the node, op and dtype, never a silently wrong result.
//
// Threads: elementwise, softmax, normalisation and reduction loops run on ThreadPool::Global()
// (ONNXPIPE_NUM_THREADS); GEMMs go to OpenBLAS (its own threads, OPENBLAS_NUM_THREADS). Results do
// not depend on the pool size.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/kernel.h"
#include "frontend/ir/evaluator.h"

namespace onnxpipe::cpu {

class CpuEvaluator : public ir::OpEvaluator {
 public:
  explicit CpuEvaluator(EvalContext ctx = {}) : ctx_(ctx) {}

  void set_context(const EvalContext& ctx) { ctx_ = ctx; }
  const EvalContext& context() const { return ctx_; }

  // Evaluates with the evaluator's context. Returns exactly node.outputs.size() tensors.
  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(
      const ir::Node& node, const std::vector<ir::Tensor>& inputs) const override;
  // Evaluates with an explicit context (concurrent callers with different contexts share one
  // evaluator this way).
  absl::StatusOr<std::vector<ir::Tensor>> Evaluate(const ir::Node& node,
                                                   const std::vector<ir::Tensor>& inputs,
                                                   const EvalContext& ctx) const;
  // Evaluates with the evaluator's context, outputs in `outputs`' slots (kernel.h).
  absl::StatusOr<std::vector<ir::Tensor>> EvaluateInto(const ir::Node& node,
                                                       const std::vector<ir::Tensor>& inputs,
                                                       ir::OutputAllocator* outputs) const override;

 private:
  EvalContext ctx_;
};

}  // namespace onnxpipe::cpu
