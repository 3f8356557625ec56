// Gradient rules of Sin, Cos, Abs, Min and Max.
// Abs and Min/Max follow PyTorch at their kinks: d|x|/dx = sign(x) (0 at 0), and where Min/Max's
// operands tie, each operand gets half of the gradient (torch.minimum/maximum). Broadcast
// operands get their gradient summed back to their own shape.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status SinGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), b.Unary(OpKind::kCos, b.I(0))));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status CosGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(ValueId t, b.Mul(b.GO(0), b.Unary(OpKind::kSin, b.I(0))));
  b.SetGI(0, b.Unary(OpKind::kNeg, t));
  return absl::OkStatus();
}

// A 0/1 tensor of `like`'s dtype and shape from the comparison op(a, c), whose operands
// broadcast to like's shape.
ValueId Indicator(GradBuilder& b, OpKind op, ValueId a, ValueId c, ValueId like) {
  ValueType t = b.TypeOf(like);
  const ir::DType dtype = t.dtype;
  t.dtype = ir::DType::kBool;
  return b.Cast(b.Emit(op, {a, c}, t), dtype);
}

absl::Status AbsGrad(GradBuilder& b) {
  // sign(x) = (x > 0) - (x < 0).
  const ValueId x = b.I(0);
  const ir::DType dt = b.TypeOf(x).dtype;
  const ValueId zero = b.Scalar(0.0, dt);
  ASSIGN_OR_RETURN(ValueId sign, b.Sub(Indicator(b, OpKind::kGreater, x, zero, b.GO(0)),
                                       Indicator(b, OpKind::kLess, x, zero, b.GO(0))));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), sign));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

// y = min(a, b) (kMin) or max(a, b): a's weight is (a wins) + 0.5 (tie), b's is 1 - a's.
absl::Status MinMaxGrad(GradBuilder& b, OpKind wins) {
  const ValueId a = b.I(0), c = b.I(1), dy = b.GO(0);
  const ir::DType dt = b.TypeOf(dy).dtype;
  const ValueId win = Indicator(b, wins, a, c, dy);
  ASSIGN_OR_RETURN(ValueId half_tie, b.Mul(Indicator(b, OpKind::kEqual, a, c, dy), b.Scalar(0.5, dt)));
  ASSIGN_OR_RETURN(ValueId wa, b.Add(win, half_tie));
  if (b.NeedsGI(0)) {
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy, wa));
    b.SetGI(0, b.ReduceToShapeOf(t, a));
  }
  if (b.NeedsGI(1)) {
    ASSIGN_OR_RETURN(ValueId wb, b.Sub(b.Scalar(1.0, dt), wa));
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy, wb));
    b.SetGI(1, b.ReduceToShapeOf(t, c));
  }
  return absl::OkStatus();
}

absl::Status MinGrad(GradBuilder& b) { return MinMaxGrad(b, OpKind::kLess); }
absl::Status MaxGrad(GradBuilder& b) { return MinMaxGrad(b, OpKind::kGreater); }

}  // namespace

void RegisterMathGradients(GradRegistry& r) {
  r.Register(OpKind::kSin, SinGrad);
  r.Register(OpKind::kCos, CosGrad);
  r.Register(OpKind::kAbs, AbsGrad);
  r.Register(OpKind::kMin, MinGrad);
  r.Register(OpKind::kMax, MaxGrad);
}

}  // namespace onnxpipe::autodiff
