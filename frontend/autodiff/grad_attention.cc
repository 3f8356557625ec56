// Gradient rule of the fused Attention op: one AttentionGrad node -> dQ, dK, dV, and dMask when an
// additive mask needs a gradient (a learned bias such as T5's relative position bias; a bool mask
// or one built from constants and inputs gets none). The kernel recomputes the attention
// probabilities from Q, K and the mask (flash-attention style: nothing of size Sq x Sk is saved by
// the forward) and, with dropout, regenerates the forward's dropout mask from the same random
// stream: the backward node carries the forward's `rng_key`.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status AttentionGrad(GradBuilder& b) {
  std::vector<ValueId> ins = {b.GO(0), b.I(0), b.I(1), b.I(2)};
  if (b.I(3) != ir::kNoValue) ins.push_back(b.I(3));
  // Operands that are one value read through views (a packed projection's Q, K, V) share the first
  // one's gradient output, which the kernel writes through each view (ir::AttentionGradSlot).
  auto needs = [&](int i) {
    if (i == 3) return b.NeedsGI(3);
    for (int j = i; j < 3; ++j)
      if (ir::AttentionGradSlot(b.node(), j) == i && b.NeedsGI(j)) return true;
    return false;
  };
  std::vector<std::optional<ValueType>> outs;
  for (int i = 0; i < 4; ++i) outs.push_back(needs(i) ? std::optional<ValueType>(b.TypeOf(b.I(i))) : std::nullopt);
  while (outs.size() > 3 && !outs.back()) outs.pop_back();
  // The backward kernel replays the forward's dropout stream, which the CPU backend keys by the
  // node's `rng_key` attribute, else its name (executor/cpu/dropout.h).
  ir::Attrs attrs = b.node().attrs;
  if (!attrs.Has("rng_key")) attrs.Set("rng_key", b.node().name);
  std::vector<ValueId> g = b.EmitMulti(OpKind::kAttentionGrad, ins, outs, std::move(attrs));
  for (int i = 0; i < 4; ++i) {
    const int slot = i < 3 ? ir::AttentionGradSlot(b.node(), i) : i;
    if (!b.NeedsGI(i)) continue;
    if (slot == i) {
      b.SetGI(i, g[i]);
    } else {
      b.SetGIIncludedIn(i, slot);
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterAttentionGradients(GradRegistry& r) { r.Register(OpKind::kAttention, AttentionGrad); }

}  // namespace onnxpipe::autodiff
