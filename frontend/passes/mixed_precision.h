// MixedPrecision: a float32 forward graph computes in bf16 (or f16) with float32 master weights, as
// PyTorch autocast and Megatron-LM's bf16 mode train:
//   - every f32 value a node computes becomes the compute dtype, except the outputs
//     ir::KeepsF32Output names (normalisation statistics) and those of the ops that stay in f32
//     (the loss, SoftmaxCrossEntropyLoss: it reads its scores, the logits, in the compute dtype and
//     computes in f32 inside its kernels; its other float operand, the class weights, is cast to f32);
//   - a trainable parameter (a float initializer not frozen by the trainable rule and not matched by
//     freeze_regex: autodiff's own test) stays an f32 master, and each of its uses reads it through
//     its own Cast, so the backward turns each use's gradient back into f32 (Cast's gradient) and
//     sums a tied weight's contributions in f32;
//   - every other f32 constant (masks, scales, frozen buffers, folded constants) becomes the compute
//     dtype with ir::CastSaturating: a finite value stays finite, -inf stays -inf;
//   - an f32 graph input stays f32 and is cast once at entry; an f32 graph output keeps its name and
//     dtype, cast back from the value that computes it;
//   - Cast(to=f32) casts to the compute dtype, and Constant/ConstantOfShape values follow their output.
// Values of other dtypes (integers, bool, f64) are left alone. It runs on the fused forward graph
// (after passes/pipeline.h), before the loss and autodiff are added, so fusion matches the graph as
// exported and the fused ops read bf16 values. Not a pipeline pass: the trainer applies it for
// `--dtype bf16`. A second run changes nothing.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

struct MixedPrecisionOptions {
  ir::DType compute = ir::DType::kBF16;  // kBF16 | kF16
  std::string freeze_regex;              // as autodiff::GradOptions::freeze_regex
};

class MixedPrecision : public Pass {
 public:
  explicit MixedPrecision(MixedPrecisionOptions options) : options_(std::move(options)) {}
  std::string_view name() const override { return "mixed-precision"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;

 private:
  MixedPrecisionOptions options_;
};

}  // namespace onnxpipe::passes
