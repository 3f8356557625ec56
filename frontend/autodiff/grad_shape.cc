// Gradient rules of data-movement ops: Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Identity,
// Concat, Split, Slice, Expand, Where, Cast, Trilu. Shape operands (Reshape's shape, Slice's
// starts..., Expand's shape, Where's condition, Trilu's k) are stop-gradient edges. The backward
// ops take the forward input as a shape-only `like` operand (ReshapeLike, SliceGrad, ConcatGrad,
// ReduceToShapeOf), so shapes stay symbolic until plan time and no Shape arithmetic is emitted.
// Shape, Constant, ConstantOfShape and Range produce no gradient.
#include <numeric>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status TransposeGrad(GradBuilder& b) {
  const int64_t r = b.Rank(b.I(0));
  std::vector<int64_t> perm = b.node().attrs.Get<std::vector<int64_t>>("perm");
  if (perm.empty()) {
    perm.resize(r);
    std::iota(perm.rbegin(), perm.rend(), 0);
  }
  if (static_cast<int64_t>(perm.size()) != r) return b.Error("perm does not match the input rank");
  std::vector<int64_t> inv(r, -1);
  for (int64_t i = 0; i < r; ++i) {
    ASSIGN_OR_RETURN(int64_t p, NormalizeAxis(perm[i], r));
    inv[p] = i;
  }
  ir::Attrs a;
  a.Set("perm", inv);
  b.SetGI(0, b.Emit(OpKind::kTranspose, {b.GO(0)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

// Reshape, Flatten, Squeeze, Unsqueeze: the gradient is dY with the input's shape.
absl::Status ReshapeGrad(GradBuilder& b) {
  b.SetGI(0, b.ReshapeLike(b.GO(0), b.I(0)));
  return absl::OkStatus();
}

absl::Status IdentityGrad(GradBuilder& b) {
  b.SetGI(0, b.GO(0));
  return absl::OkStatus();
}

absl::Status ConcatGrad(GradBuilder& b) {
  const int64_t axis = b.node().attrs.Get<int64_t>("axis", 0);
  std::vector<ValueId> ins = {b.GO(0)};
  std::vector<std::optional<ValueType>> outs;
  for (int i = 0; i < b.num_inputs(); ++i) {
    ins.push_back(b.I(i));
    outs.push_back(b.NeedsGI(i) ? std::optional<ValueType>(b.TypeOf(b.I(i))) : std::nullopt);
  }
  ir::Attrs a;
  a.Set("axis", axis);
  std::vector<ValueId> g = b.EmitMulti(OpKind::kConcatGrad, ins, outs, std::move(a));
  for (int i = 0; i < b.num_inputs(); ++i)
    if (b.NeedsGI(i)) b.SetGI(i, g[i]);
  return absl::OkStatus();
}

absl::Status SplitGrad(GradBuilder& b) {
  // Outputs that do not reach the loss contribute zeros of their shape.
  std::vector<ValueId> pieces;
  for (int k = 0; k < b.num_outputs(); ++k) {
    if (b.O(k) == ir::kNoValue) return b.Error("a Split output is absent; cannot place its gradient");
    pieces.push_back(b.GO(k) != ir::kNoValue ? b.GO(k) : b.ZerosLike(b.O(k)));
  }
  ir::Attrs a;
  a.Set("axis", b.node().attrs.Get<int64_t>("axis", 0));
  b.SetGI(0, b.Emit(OpKind::kConcat, pieces, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

absl::Status SliceGrad(GradBuilder& b) {
  std::vector<ValueId> ins = {b.GO(0), b.I(0)};
  for (int i = 1; i < b.num_inputs(); ++i) ins.push_back(b.I(i));
  b.SetGI(0, b.Emit(OpKind::kSliceGrad, ins, b.TypeOf(b.I(0))));
  return absl::OkStatus();
}

absl::Status ExpandGrad(GradBuilder& b) {
  b.SetGI(0, b.ReduceToShapeOf(b.GO(0), b.I(0)));
  return absl::OkStatus();
}

absl::Status WhereGrad(GradBuilder& b) {
  // y = where(c, x1, x2): dx1 = where(c, dy, 0), dx2 = where(c, 0, dy), each summed back to its
  // operand's shape (all three broadcast).
  ValueId c = b.I(0), dy = b.GO(0);
  const ValueType ty = b.TypeOf(dy);
  ValueId zero = b.Scalar(0.0, ty.dtype);
  if (b.NeedsGI(1)) {
    ValueId t = b.Emit(OpKind::kWhere, {c, dy, zero}, ty);
    b.SetGI(1, b.ReduceToShapeOf(t, b.I(1)));
  }
  if (b.NeedsGI(2)) {
    ValueId t = b.Emit(OpKind::kWhere, {c, zero, dy}, ty);
    b.SetGI(2, b.ReduceToShapeOf(t, b.I(2)));
  }
  return absl::OkStatus();
}

absl::Status CastGrad(GradBuilder& b) {
  // Only reached for float -> float casts: a non-float output never carries a gradient.
  b.SetGI(0, b.Cast(b.GO(0), b.TypeOf(b.I(0)).dtype));
  return absl::OkStatus();
}

absl::Status TriluGrad(GradBuilder& b) {
  // Trilu keeps a fixed set of positions: the gradient keeps the same ones.
  std::vector<ValueId> ins = {b.GO(0)};
  if (b.I(1) != ir::kNoValue) ins.push_back(b.I(1));
  b.SetGI(0, b.Emit(OpKind::kTrilu, ins, b.TypeOf(b.I(0)), b.node().attrs));
  return absl::OkStatus();
}

}  // namespace

void RegisterShapeGradients(GradRegistry& r) {
  r.Register(OpKind::kTranspose, TransposeGrad);
  r.Register(OpKind::kReshape, ReshapeGrad, {1});
  r.Register(OpKind::kFlatten, ReshapeGrad);
  r.Register(OpKind::kSqueeze, ReshapeGrad, {1});
  r.Register(OpKind::kUnsqueeze, ReshapeGrad, {1});
  r.Register(OpKind::kIdentity, IdentityGrad);
  r.Register(OpKind::kConcat, ConcatGrad);
  r.Register(OpKind::kSplit, SplitGrad, {1});
  r.Register(OpKind::kSlice, SliceGrad, {1, 2, 3, 4});
  r.Register(OpKind::kExpand, ExpandGrad, {1});
  r.Register(OpKind::kWhere, WhereGrad, {0});
  r.Register(OpKind::kCast, CastGrad);
  r.Register(OpKind::kTrilu, TriluGrad, {1});
  for (OpKind op : {OpKind::kShape, OpKind::kConstant, OpKind::kConstantOfShape, OpKind::kRange})
    r.RegisterNoGradient(op);
}

}  // namespace onnxpipe::autodiff
