// AttentionFusion: rewrites scaled dot-product attention, as PyTorch's exporter writes it for
// nn.MultiheadAttention (torch 1.13) and for hand-written GPT/BERT attention, into the fused
// Attention op (frontend/ir/op.h):
//
//   S = MatMul(Q', K^T)        Q' = Q, or Q pre-scaled by Mul/Div with a scalar constant (as
//                              nn.MultiheadAttention does); K^T = Transpose(K', perm) with a perm
//                              that swaps the last two axes of K's head layout (K' may be
//                              pre-scaled too: "sqrt of the scale on both sides"), or K^T spelled
//                              through a flattening (Reshape(Transpose(Reshape(K, (N, Sk, Dh)),
//                              [0, 2, 1]), (..., Dh, Sk)), as torch's dynamo exporter writes SDPA's),
//                              or any other value, which is then transposed explicitly
//   S = S * c | S / c          any number of scalar scalings (including baddbmm's Mul by 1)
//   S = S + M                  optional additive masks (either operand order; a Mul by 1 on M is
//                              stripped); several (T5: relative bias, then padding) are summed
//   S = Where(C, -big, S)      optional masked_fill (C true = masked) or Where(C, S, -big)
//                              (C true = kept); -big is a scalar <= -1e4 or -inf
//   P = Softmax(S, axis=-1) [Dropout(P, ratio)]
//   O = MatMul(P, V)
//   -> Attention(Q, K, V[, mask]) scale=c_total causal dropout=ratio mask_kind
//
// Masks. A constant mask (or, given an evaluator, one computed from constants and buffer
// initializers, like GPT's `mask[:, :, :S, :S]` slice of a registered triangle) is proven causal
// by reading it: additive 0 on and below the diagonal and
// <= -1e4 above it; boolean (normalised to true = attend) true exactly on and below the diagonal,
// in every slice over its leading dims (of any extents: a (B, 1, S, S) mask has one per batch row). A proven causal mask sets causal=1 and is dropped. Otherwise
// it is passed as the mask input, mask_kind "additive" or "bool" (true = attend; a masked_fill
// condition is negated with a Not, folded when constant). An additive mask computed from
// parameters (T5's relative position bias plus the padding mask) is never read as a constant: it
// is the mask input, and AttentionGrad's dMask trains it. Several additive masks become one
// (their sum, a new Add); an additive and a boolean non-causal mask together are not expressible
// and leave the pattern alone. A scaling applied after the mask is not absorbed
// (it would scale the mask too) and prevents the match.
//
// The head reshapes and transposes around the core stay: Attention works on any leading dims. A
// Transpose is inserted for K when the K^T producer's perm does not reduce to the identity. Every
// intermediate (scores, probabilities, the scalings, K^T) must be used only inside the pattern;
// a pre-scaling of Q or K with other uses is kept and simply not absorbed.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

// The most elements a computed mask (and each value it is computed from) may have for the pass to compute it and
// read whether it is causal. Hugging Face decoders exported with torch.export materialise their causal mask,
// (B, 1, S, S) from Range and LessOrEqual: 8.4M elements at batch 8, seq 1024, beyond constant folding's limit;
// read as causal, the attention skips the masked half instead of reading a mask (cuDNN: twice as fast).
inline constexpr int64_t kMaxProvenMaskElements = int64_t{1} << 25;

class AttentionFusion : public Pass {
 public:
  // `evaluator` (optional) lets the pass read masks that are computed from initializers.
  explicit AttentionFusion(const ir::OpEvaluator* evaluator = nullptr,
                           int64_t max_mask_elements = kMaxProvenMaskElements)
      : evaluator_(evaluator), max_mask_elements_(max_mask_elements) {}
  std::string_view name() const override { return "attention-fusion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;

 private:
  const ir::OpEvaluator* evaluator_;
  int64_t max_mask_elements_;
};

}  // namespace onnxpipe::passes
