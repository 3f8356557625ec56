// Gradient rule of the fused Attention op: one AttentionGrad node -> dQ, dK, dV. The kernel
// recomputes the attention probabilities from Q, K and the mask (flash-attention style: nothing
// of size Sq x Sk is saved by the forward) and, with dropout, regenerates the forward's dropout
// mask from the same random stream (the forward node is named by the backward node's origin).
// The mask is a stop-gradient edge.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status AttentionGrad(GradBuilder& b) {
  std::vector<ValueId> ins = {b.GO(0), b.I(0), b.I(1), b.I(2)};
  if (b.I(3) != ir::kNoValue) ins.push_back(b.I(3));
  std::vector<std::optional<ValueType>> outs;
  for (int i = 0; i < 3; ++i)
    outs.push_back(b.NeedsGI(i) ? std::optional<ValueType>(b.TypeOf(b.I(i))) : std::nullopt);
  std::vector<ValueId> g = b.EmitMulti(OpKind::kAttentionGrad, ins, outs, b.node().attrs);
  for (int i = 0; i < 3; ++i)
    if (b.NeedsGI(i)) b.SetGI(i, g[i]);
  return absl::OkStatus();
}

}  // namespace

void RegisterAttentionGradients(GradRegistry& r) { r.Register(OpKind::kAttention, AttentionGrad, {3}); }

}  // namespace onnxpipe::autodiff
