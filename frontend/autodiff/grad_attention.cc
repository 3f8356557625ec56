// Gradient rule of the fused Attention op: one AttentionGrad node -> dQ, dK, dV, and dMask when an
// additive mask needs a gradient (a learned bias such as T5's relative position bias; a bool mask
// or one built from constants and inputs gets none). Nothing of size Sq x Sk is saved by the
// forward: the backward takes the forward's O and its per-row softmax statistics (Stats, asked of
// the forward here) or recomputes the probabilities from Q, K and the mask, and, with dropout,
// regenerates the forward's dropout mask from the same random stream: the backward node carries
// the forward's `rng_key`.
#include <optional>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

// The shape of the forward's Stats output, Q's dims (through q_view) without the last, when Q's
// batch dims are the attention's (K and V the same, broadcast from 1 or grouped); nullopt otherwise (the
// backward then recomputes everything from Q, K and V).
std::optional<ir::Shape> StatsShape(GradBuilder& b) {
  ir::Shape dims[3];
  for (int i = 0; i < 3; ++i) {
    dims[i] = b.TypeOf(b.I(i)).shape;
    if (!ir::HasAttentionView(b.node(), i)) continue;
    if (!ir::IsConcrete(dims[i])) return std::nullopt;
    absl::StatusOr<ir::StridedView> v = ir::AttentionOperandView(b.node(), i, ir::ToInts(dims[i]));
    if (!v.ok()) return std::nullopt;
    dims[i] = ir::FromInts(v->dims);
  }
  const ir::Shape& q = dims[0];
  if (q.size() < 2 || dims[1].size() != q.size() || dims[2].size() != q.size()) return std::nullopt;
  // Grouped K and V (fewer heads than Q) read as Q's heads.
  const int64_t group = ir::AttentionKvGroup(dims[0], dims[1], dims[2]);
  for (size_t d = 0; d + 2 < q.size(); ++d) {
    for (int i = 1; i < 3; ++i) {
      const ir::Dim kd = d + 3 == q.size() && group > 1 ? dims[i][d] * ir::Dim(group) : dims[i][d];
      if (!(kd == q[d]) && !(kd == ir::Dim(1))) return std::nullopt;
    }
  }
  return ir::Shape(q.begin(), q.end() - 1);
}

absl::Status AttentionGrad(GradBuilder& b) {
  std::vector<ValueId> ins = {b.GO(0), b.I(0), b.I(1), b.I(2), b.I(3)};
  // The forward's O and softmax statistics, so that a backward (cuDNN's) need not re-run it.
  if (const std::optional<ir::Shape> stats = StatsShape(b)) {
    ins.push_back(b.O(0));
    ins.push_back(b.EnsureForwardOutput(1, ValueType{ir::DType::kF32, *stats, true}));
  }
  while (ins.back() == ir::kNoValue) ins.pop_back();
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
