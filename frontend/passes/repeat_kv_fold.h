// RepeatKvFold: grouped-query attention runs as one Attention with fewer K/V heads (frontend/ir/op.h)
// instead of reading K and V repeated over the query heads.
//
// transformers' repeat_kv, which Llama, Qwen2, Mistral and the other grouped-query models apply to K
// and V before the attention, is
//   x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)
// and both torch exporters write it as
//   R = Reshape(E),  E = Expand(U, shape),  U = Unsqueeze(X) | Reshape(X)
// with the target shapes computed from Shape/Gather/Concat or constant (the importer lowers ONNX
// Tile to Reshape/Expand/Reshape too, with the copies before each axis: torch.repeat's order). The match reads the dims
// that shape inference gave the values, not the shape operands: X (..., kv, S, D); U is X with a 1
// inserted right after the heads, (..., kv, 1, S, D); E is U with that 1, and only it, grown to n_rep;
// R merges (kv, n_rep) in that order into kv * n_rep heads, the other dims unchanged. So query
// head h of R is X's head h / n_rep, what Attention's grouped K and V mean. An Attention whose K and
// V are both such repeats of the same kv and n_rep, with Q's head dim kv * n_rep (concrete dims),
// reads X_K and X_V instead; the repeats stay for any other readers, dead code elimination removes
// them otherwise. The other order, (n_rep, kv) (torch's repeat / Tile on the head axis: head h reads
// h % kv), and any expand of another axis, do not match and are left alone (op.h's grouping is
// repeat_kv's).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class RepeatKvFold : public Pass {
 public:
  std::string_view name() const override { return "repeat-kv-fold"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
