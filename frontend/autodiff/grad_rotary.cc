// Gradient rule of the fused Rotary op: one RotaryGrad node, the transpose of the rotation, with the
// forward's tables and attributes. The tables get no gradient: the rotary fusion fuses only tables
// computed from constants and inputs (rotary's inv_freq is a frozen buffer), so a table that needs
// one means a graph this rule does not cover, and it says so rather than dropping the gradient.
#include "frontend/autodiff/grad_builder.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;

absl::Status RotaryGrad(GradBuilder& b) {
  if (b.NeedsGI(1) || b.NeedsGI(2))
    return b.Error("the rotary tables (cos, sin) depend on a trainable parameter; Rotary gives them no gradient");
  ir::Attrs a;
  a.Set("rotary_dim", b.node().attrs.Get<int64_t>("rotary_dim", -1));
  a.Set("interleaved", b.node().attrs.Get<int64_t>("interleaved", 0));
  b.SetGI(0, b.Emit(OpKind::kRotaryGrad, {b.GO(0), b.I(1), b.I(2)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

}  // namespace

void RegisterRotaryGradients(GradRegistry& r) { r.Register(OpKind::kRotary, RotaryGrad); }

}  // namespace onnxpipe::autodiff
