// RowLayoutMotion: moves the layout copies exporters put around attention's projections to the
// attention's side of them, where AttentionLayout turns them into strided views.
//
// A layout op that only rearranges rows (a Transpose that keeps the last axis in place; a Reshape,
// Flatten, Squeeze, Unsqueeze or Identity that keeps the last dim) commutes with an op whose rows
// are independent (Linear's input; a MatMul by a rank-2 matrix): P(R(x)) = R'(P(x)), where R'
// rearranges the same rows of P's output, of P's width. PyTorch's batch_first nn.MultiheadAttention
// transposes (B, S, E) to (S, B, E) before its packed input projection and back after its output
// projection; those two copies are outside the chains AttentionLayout absorbs. Here:
//   - up: a row Transpose whose output only a projection reads, where that projection's output
//     only reaches Attention's Q, K, V through layout ops, moves below the projection
//     (x -> T -> P -> ... -> Attention becomes x -> P -> T -> ... -> Attention);
//   - down: a run of single-use row layout ops containing a Transpose after a projection whose
//     input is an Attention's output through single-use layout ops moves above the projection
//     (Attention -> ... -> P -> R1..Rk becomes Attention -> ... -> R1'..Rk' -> P).
//   - across Rotary: a row Transpose whose output only a Rotary reads as X, where the Rotary's output
//     only reaches Attention's Q, K through layout ops, moves below the Rotary, whose cos and sin tables
//     are rearranged to follow the rows (a Reshape where that only moves dims of extent 1, as for
//     Llama's (B, 1, S, R) tables); Hugging Face decoders transpose Q and K to (B, H, S, D) before
//     rotating them.
// The moved ops become part of the chains AttentionLayout absorbs (run it after this pass).
// Needs concrete shapes (a graph with bound symbols); changes nothing on symbolic ones.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class RowLayoutMotion : public Pass {
 public:
  std::string_view name() const override { return "row-layout-motion"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
