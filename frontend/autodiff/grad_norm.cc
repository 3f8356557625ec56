// Gradient rules of normalisations and smooth activations: Softmax, LogSoftmax, LayerNorm, RMSNorm,
// Gelu. Each maps to one fused backward kernel (SoftmaxGrad, LogSoftmaxGrad, LayerNormGrad,
// RMSNormGrad, GeluGrad)
// rather than a chain of primitives: one pass over the data instead of four or five.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

// Softmax and LogSoftmax follow opset-13 semantics: one axis (default -1).
absl::Status SoftmaxFamilyGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(b.node().attrs.Get<int64_t>("axis", -1), b.Rank(b.I(0))));
  ir::Attrs a;
  a.Set("axis", axis);
  const OpKind op = b.node().op == OpKind::kSoftmax ? OpKind::kSoftmaxGrad : OpKind::kLogSoftmaxGrad;
  b.SetGI(0, b.Emit(op, {b.GO(0), b.O(0)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

absl::Status LayerNormGrad(GradBuilder& b) {
  if (b.GO(1) != ir::kNoValue || b.GO(2) != ir::kNoValue) {
    return b.Error("gradient through LayerNorm's Mean/InvStdDev outputs is not supported");
  }
  // With a fused residual the node normalises S = residual + X' (op.h), its output 3: LayerNormGrad
  // of S, plus S's gradient from its other readers (added by the kernel: its dresidual), is the
  // residual's gradient, and X's is that through the fused dropout (its mask regenerated from the
  // forward's random stream), which the same LayerNormGrad writes as its output 3.
  const bool residual = b.node().inputs.size() > 3 && b.I(3) != ir::kNoValue;
  ValueId x = residual ? b.EnsureForwardOutput(3, b.TypeOf(b.I(0))) : b.I(0);
  const ir::DType dt = b.TypeOf(x).dtype;
  if (b.NeedsGI(2)) {
    const ValueType ts = b.TypeOf(b.I(1)), tb = b.TypeOf(b.I(2));
    if (ts.shape_known && tb.shape_known && ts.shape != tb.shape) {
      // LayerNormGrad returns dScale and dBias in scale's shape.
      return b.Error("bias " + ir::ShapeToString(tb.shape) + " and scale " + ir::ShapeToString(ts.shape) +
                     " differ in shape; not supported");
    }
  }
  ir::Attrs a;
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(b.node().attrs.Get<int64_t>("axis", -1), b.Rank(x)));
  a.Set("axis", axis);
  a.Set("epsilon", b.node().attrs.Get<double>("epsilon", 1e-5));
  std::vector<ValueId> ins = {b.GO(0), x, b.I(1)};
  // Saved statistics are used when the forward computes them in the input's precision (else the
  // kernel recomputes them: cheaper than a precision mismatch in fp64 gradient checks).
  ValueId mean = b.O(1), inv = b.O(2);
  const bool stats = mean != ir::kNoValue && inv != ir::kNoValue && b.TypeOf(mean).dtype == dt &&
                     b.TypeOf(inv).dtype == dt;
  ins.push_back(stats ? mean : ir::kNoValue);
  ins.push_back(stats ? inv : ir::kNoValue);
  const bool needs_x = b.NeedsGI(0) || (residual && b.NeedsGI(3));
  if (residual && needs_x && b.GO(3) != ir::kNoValue) ins.push_back(b.GO(3));
  while (ins.back() == ir::kNoValue) ins.pop_back();
  const ir::Attrs& fwd = b.node().attrs;
  const double ratio = fwd.Get<double>("dropout", 0.0);
  const bool dropped = residual && ratio != 0.0 && b.NeedsGI(0);
  if (dropped) {
    a.Set("dropout", ratio);
    a.Set("rng_key", fwd.Get<std::string>("rng_key", b.node().name));
  }
  std::vector<std::optional<ValueType>> outs = {
      needs_x ? std::optional<ValueType>(b.TypeOf(x)) : std::nullopt,
      b.NeedsGI(1) ? std::optional<ValueType>(b.TypeOf(b.I(1))) : std::nullopt,
      b.NeedsGI(2) ? std::optional<ValueType>(b.TypeOf(b.I(2))) : std::nullopt,
      dropped ? std::optional<ValueType>(b.TypeOf(b.I(0))) : std::nullopt};
  while (outs.size() > 1 && !outs.back()) outs.pop_back();
  std::vector<ValueId> g = b.EmitMulti(OpKind::kLayerNormGrad, ins, outs, std::move(a));
  for (int i = 1; i <= 2 && i < static_cast<int>(g.size()); ++i)
    if (b.NeedsGI(i)) b.SetGI(i, g[i]);
  if (!needs_x) return absl::OkStatus();
  if (!residual) {
    b.SetGI(0, g[0]);
    return absl::OkStatus();
  }
  if (b.NeedsGI(3)) b.SetGI(3, g[0]);
  if (b.NeedsGI(0)) b.SetGI(0, dropped ? g[3] : g[0]);
  return absl::OkStatus();
}

absl::Status RMSNormGrad(GradBuilder& b) {
  if (b.GO(1) != ir::kNoValue) return b.Error("gradient through RMSNorm's InvStdDev output is not supported");
  // A fused residual as LayerNorm's (without dropout): the gradient of S = residual + X is both operands'.
  const bool residual = b.node().inputs.size() > 2 && b.I(2) != ir::kNoValue;
  const ValueId x = residual ? b.EnsureForwardOutput(2, b.TypeOf(b.I(0))) : b.I(0);
  ir::Attrs a;
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(b.node().attrs.Get<int64_t>("axis", -1), b.Rank(x)));
  a.Set("axis", axis);
  a.Set("epsilon", b.node().attrs.Get<double>("epsilon", 1e-5));
  std::vector<ValueId> ins = {b.GO(0), x, b.I(1)};
  const bool stats = b.O(1) != ir::kNoValue && b.TypeOf(b.O(1)).dtype == b.TypeOf(x).dtype;
  ins.push_back(stats ? b.O(1) : ir::kNoValue);
  const bool needs_x = b.NeedsGI(0) || (residual && b.NeedsGI(2));
  if (residual && needs_x && b.GO(2) != ir::kNoValue) {
    ins.resize(ir::NormGradResidualInput(ir::OpKind::kRMSNormGrad), ir::kNoValue);
    ins.push_back(b.GO(2));
  }
  while (ins.back() == ir::kNoValue) ins.pop_back();
  std::vector<std::optional<ValueType>> outs = {
      needs_x ? std::optional<ValueType>(b.TypeOf(x)) : std::nullopt,
      b.NeedsGI(1) ? std::optional<ValueType>(b.TypeOf(b.I(1))) : std::nullopt};
  while (outs.size() > 1 && !outs.back()) outs.pop_back();
  std::vector<ValueId> g = b.EmitMulti(OpKind::kRMSNormGrad, ins, outs, std::move(a));
  if (b.NeedsGI(1)) b.SetGI(1, g[1]);
  if (!needs_x) return absl::OkStatus();
  if (b.NeedsGI(0)) b.SetGI(0, g[0]);
  if (residual && b.NeedsGI(2)) b.SetGI(2, g[0]);
  return absl::OkStatus();
}

absl::Status GeluGrad(GradBuilder& b) {
  ir::Attrs a;
  a.Set("approximate", b.node().attrs.Get<std::string>("approximate", "none"));
  std::vector<ValueId> ins = {b.GO(0), b.I(0)};
  // A fused dropout: the backward reads the forward's keep decisions as bits (an eighth of a byte
  // an element, where X's last dim allows) or else regenerates them from its random stream.
  if (const double ratio = b.node().attrs.Get<double>("dropout", 0.0); ratio != 0.0) {
    a.Set("dropout", ratio);
    a.Set("rng_key", b.node().attrs.Get<std::string>("rng_key", b.node().name));
    if (const std::optional<ir::Shape> bits = ir::KeepBitsShape(b.TypeOf(b.I(0)).shape))
      ins.push_back(b.EnsureForwardOutput(1, ValueType{ir::DType::kU8, *bits, true}));
  }
  b.SetGI(0, b.Emit(OpKind::kGeluGrad, ins, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

}  // namespace

void RegisterNormActivationGradients(GradRegistry& r) {
  r.Register(OpKind::kSoftmax, SoftmaxFamilyGrad);
  r.Register(OpKind::kLogSoftmax, SoftmaxFamilyGrad);
  r.Register(OpKind::kLayerNorm, LayerNormGrad);
  r.Register(OpKind::kRMSNorm, RMSNormGrad);
  r.Register(OpKind::kGelu, GeluGrad);
}

}  // namespace onnxpipe::autodiff
