// Gradient rules of elementwise arithmetic and activations: Add, Sub, Mul, Div, Pow, Sqrt,
// Reciprocal, Neg, Exp, Log, Erf, Tanh, Relu, Sigmoid, Sum; comparisons and logic cut the graph.
// Binary ops broadcast, so each operand's gradient is summed back to its own shape
// (ReduceToShapeOf, omitted when the shapes already agree). Rules prefer the forward output over
// recomputation where the derivative is a function of it (Exp, Tanh, Sigmoid, Sqrt, Reciprocal).
#include <cmath>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status AddGrad(GradBuilder& b) {
  ValueId dy = b.GO(0);
  if (b.NeedsGI(0)) b.SetGI(0, b.ReduceToShapeOf(dy, b.I(0)));
  if (b.NeedsGI(1)) b.SetGI(1, b.ReduceToShapeOf(dy, b.I(1)));
  return absl::OkStatus();
}

absl::Status SubGrad(GradBuilder& b) {
  ValueId dy = b.GO(0);
  if (b.NeedsGI(0)) b.SetGI(0, b.ReduceToShapeOf(dy, b.I(0)));
  // Negate after the reduction: it is the smaller tensor.
  if (b.NeedsGI(1)) b.SetGI(1, b.Unary(OpKind::kNeg, b.ReduceToShapeOf(dy, b.I(1))));
  return absl::OkStatus();
}

absl::Status MulGrad(GradBuilder& b) {
  ValueId dy = b.GO(0);
  if (b.NeedsGI(0)) {
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy, b.I(1)));
    b.SetGI(0, b.ReduceToShapeOf(t, b.I(0)));
  }
  if (b.NeedsGI(1)) {
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy, b.I(0)));
    b.SetGI(1, b.ReduceToShapeOf(t, b.I(1)));
  }
  return absl::OkStatus();
}

absl::Status DivGrad(GradBuilder& b) {
  // y = a / b: da = dy / b; db = -dy * a / b^2 = -(dy / b) * y.
  ASSIGN_OR_RETURN(ValueId dy_over_b, b.Div(b.GO(0), b.I(1)));
  if (b.NeedsGI(0)) b.SetGI(0, b.ReduceToShapeOf(dy_over_b, b.I(0)));
  if (b.NeedsGI(1)) {
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy_over_b, b.O(0)));
    b.SetGI(1, b.Unary(OpKind::kNeg, b.ReduceToShapeOf(t, b.I(1))));
  }
  return absl::OkStatus();
}

absl::Status ModGrad(GradBuilder& b) {
  // y = a - b q with q = trunc(a / b) (fmod = 1, the only form ONNX allows for floats), constant
  // between its jumps: da = dy, db = -dy q, and q = (a - y) / b (to rounding) wherever b != 0.
  ValueId dy = b.GO(0);
  if (b.NeedsGI(0)) b.SetGI(0, b.ReduceToShapeOf(dy, b.I(0)));
  if (b.NeedsGI(1)) {
    ASSIGN_OR_RETURN(ValueId a_minus_y, b.Sub(b.I(0), b.O(0)));
    ASSIGN_OR_RETURN(ValueId q, b.Div(a_minus_y, b.I(1)));
    ASSIGN_OR_RETURN(ValueId t, b.Mul(dy, q));
    b.SetGI(1, b.Unary(OpKind::kNeg, b.ReduceToShapeOf(t, b.I(1))));
  }
  return absl::OkStatus();
}

absl::Status PowGrad(GradBuilder& b) {
  // y = a^e: da = dy * e * a^(e-1); de = dy * y * ln(a) (only when the exponent is a float that
  // depends on a parameter; a constant exponent gets no gradient request).
  ValueId a = b.I(0), e = b.I(1), dy = b.GO(0);
  if (b.NeedsGI(0)) {
    ValueId ed = e;
    if (b.TypeOf(e).dtype != b.TypeOf(a).dtype) ed = b.Cast(e, b.TypeOf(a).dtype);
    ASSIGN_OR_RETURN(ValueId em1, b.Sub(ed, b.Scalar(1.0, b.TypeOf(a).dtype)));
    ASSIGN_OR_RETURN(ValueId p, b.Pow(a, em1));
    ASSIGN_OR_RETURN(ValueId t, b.Mul(p, ed));
    ASSIGN_OR_RETURN(ValueId t2, b.Mul(dy, t));
    b.SetGI(0, b.ReduceToShapeOf(t2, a));
  }
  if (b.NeedsGI(1)) {
    ValueId ln = b.Unary(OpKind::kLog, a);
    ASSIGN_OR_RETURN(ValueId t, b.Mul(b.O(0), ln));
    if (b.TypeOf(t).dtype != b.TypeOf(e).dtype) t = b.Cast(t, b.TypeOf(e).dtype);
    ValueId dye = b.TypeOf(dy).dtype == b.TypeOf(e).dtype ? dy : b.Cast(dy, b.TypeOf(e).dtype);
    ASSIGN_OR_RETURN(ValueId t2, b.Mul(dye, t));
    b.SetGI(1, b.ReduceToShapeOf(t2, e));
  }
  return absl::OkStatus();
}

absl::Status SqrtGrad(GradBuilder& b) {
  // dx = dy * 0.5 / y.
  ASSIGN_OR_RETURN(ValueId q, b.Div(b.GO(0), b.O(0)));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(q, b.Scalar(0.5, b.TypeOf(q).dtype)));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status ReciprocalGrad(GradBuilder& b) {
  // dx = -dy * y^2.
  ASSIGN_OR_RETURN(ValueId y2, b.Mul(b.O(0), b.O(0)));
  ASSIGN_OR_RETURN(ValueId t, b.Mul(b.GO(0), y2));
  b.SetGI(0, b.Unary(OpKind::kNeg, t));
  return absl::OkStatus();
}

absl::Status NegGrad(GradBuilder& b) {
  b.SetGI(0, b.Unary(OpKind::kNeg, b.GO(0)));
  return absl::OkStatus();
}

absl::Status ExpGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), b.O(0)));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status LogGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(ValueId dx, b.Div(b.GO(0), b.I(0)));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status ErfGrad(GradBuilder& b) {
  // d erf(x) = 2/sqrt(pi) * exp(-x^2).
  ValueId x = b.I(0);
  const ir::DType dt = b.TypeOf(x).dtype;
  ASSIGN_OR_RETURN(ValueId x2, b.Mul(x, x));
  ValueId e = b.Unary(OpKind::kExp, b.Unary(OpKind::kNeg, x2));
  ASSIGN_OR_RETURN(ValueId s, b.Mul(e, b.Scalar(2.0 / std::sqrt(M_PI), dt)));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), s));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status TanhGrad(GradBuilder& b) {
  // dx = dy * (1 - y^2).
  ValueId y = b.O(0);
  ASSIGN_OR_RETURN(ValueId y2, b.Mul(y, y));
  ASSIGN_OR_RETURN(ValueId d, b.Sub(b.Scalar(1.0, b.TypeOf(y).dtype), y2));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), d));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status SigmoidGrad(GradBuilder& b) {
  // dx = dy * y * (1 - y).
  ValueId y = b.O(0);
  ASSIGN_OR_RETURN(ValueId om, b.Sub(b.Scalar(1.0, b.TypeOf(y).dtype), y));
  ASSIGN_OR_RETURN(ValueId d, b.Mul(y, om));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.GO(0), d));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status ReluGrad(GradBuilder& b) {
  // y > 0 exactly where x > 0, so the output (kept anyway by the next op) decides.
  b.SetGI(0, b.Emit(OpKind::kReluGrad, {b.GO(0), b.O(0)}, b.TypeOf(b.I(0))));
  return absl::OkStatus();
}

absl::Status SumGrad(GradBuilder& b) {
  for (int i = 0; i < b.num_inputs(); ++i)
    if (b.NeedsGI(i)) b.SetGI(i, b.ReduceToShapeOf(b.GO(0), b.I(i)));
  return absl::OkStatus();
}

}  // namespace

void RegisterElementwiseGradients(GradRegistry& r) {
  r.Register(OpKind::kAdd, AddGrad);
  r.Register(OpKind::kSub, SubGrad);
  r.Register(OpKind::kMul, MulGrad);
  r.Register(OpKind::kDiv, DivGrad);
  r.Register(OpKind::kMod, ModGrad);
  r.Register(OpKind::kPow, PowGrad);
  r.Register(OpKind::kSqrt, SqrtGrad);
  r.Register(OpKind::kReciprocal, ReciprocalGrad);
  r.Register(OpKind::kNeg, NegGrad);
  r.Register(OpKind::kExp, ExpGrad);
  r.Register(OpKind::kLog, LogGrad);
  r.Register(OpKind::kErf, ErfGrad);
  r.Register(OpKind::kTanh, TanhGrad);
  r.Register(OpKind::kRelu, ReluGrad);
  r.Register(OpKind::kSigmoid, SigmoidGrad);
  r.Register(OpKind::kSum, SumGrad);
  for (OpKind op : {OpKind::kEqual, OpKind::kLess, OpKind::kGreater, OpKind::kGreaterOrEqual,
                    OpKind::kLessOrEqual, OpKind::kIsNaN, OpKind::kArgMax, OpKind::kNot, OpKind::kAnd,
                    OpKind::kSign, OpKind::kCeil})  // piecewise constant: zero almost everywhere
    r.RegisterNoGradient(op);
}

}  // namespace onnxpipe::autodiff
