// AttentionLayout: Attention reads Q, K, V and writes O in place through strided views
// (frontend/ir/strided_view.h) instead of through the layout ops exporters put around it.
//
// nn.MultiheadAttention, as PyTorch exports it, packs the projections into one (S, B, 3E) value and
// copies it four times on the way to the heads: Transpose to (3, S, B, E), Split, Transpose each
// of q, k, v to (B*H, S, Dh); then O goes back through a Transpose to (S, B, H, Dh). Every copy
// costs a read and a write of the activations, forward and backward (the transposes were 14% of
// the benchmark classifier's GPU step). Here:
//   - each Q, K, V input is traced up through Reshape, Flatten, Squeeze, Unsqueeze, Identity,
//     Transpose, Split and scalar-index Gather to the value whose buffer it is a strided view of;
//     where the chain copies (a Transpose, Split or Gather), the Attention reads that value through
//     q_view / k_view / v_view (Q, K, V may become one value: the packed projection);
//   - O is traced down through single-use Transpose, Reshape, Flatten, Squeeze, Unsqueeze and
//     Identity; where that chain copies, Attention writes its last value directly (o_view, o_shape).
// An operand is absorbed only with its last stride 1, without broadcasting (its batch dims are the
// attention's), and when the views into each traced value cover it exactly once (so AttentionGrad
// writes the value's whole gradient through them: op.h); else it keeps its input. Needs concrete
// shapes (a graph with bound symbols); on symbolic shapes it changes nothing. The chains' nodes
// become dead (dce removes them).
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

class AttentionLayout : public Pass {
 public:
  std::string_view name() const override { return "attention-layout"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;
};

}  // namespace onnxpipe::passes
