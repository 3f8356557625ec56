// Shape rules for element-wise ops: unary math, numpy-broadcasting binary arithmetic, comparisons
// and logic, IsNaN, Where, Cast, Dropout, Trilu and the fused Gelu.
#include "frontend/ir/infer_rules.h"

namespace onnxpipe::ir::infer_internal {
namespace {

// Exp, Log, Erf...: defined on floats only.
absl::StatusOr<Outputs> FloatUnary(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> NumericUnary(const InferContext& ctx) {
  if (ctx.dtype(0) == DType::kBool)
    return ctx.Error() << ctx.Describe(0) << " must be numeric, not bool";
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> IdentityRule(const InferContext& ctx) {
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> IsNaNRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  return One(DType::kBool, ctx.shape(0));
}

absl::StatusOr<Outputs> NotRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectBool(0));
  return One(DType::kBool, ctx.shape(0));
}

// Add, Sub, Mul, Div, Mod: both operands of one numeric type.
absl::StatusOr<Outputs> Arithmetic(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  if (ctx.dtype(0) == DType::kBool)
    return ctx.Error() << ctx.Describe(0) << " must be numeric, not bool";
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, {ctx.shape(0), ctx.shape(1)}));
  return One(ctx.dtype(0), std::move(s));
}

// Pow: the exponent may have its own numeric type; the result has the base's.
absl::StatusOr<Outputs> PowRule(const InferContext& ctx) {
  if (ctx.dtype(0) == DType::kBool || ctx.dtype(1) == DType::kBool)
    return ctx.Error() << "operands must be numeric, got " << ctx.Describe(0) << " and "
                       << ctx.Describe(1);
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, {ctx.shape(0), ctx.shape(1)}));
  return One(ctx.dtype(0), std::move(s));
}

// Equal, Less, Greater, GreaterOrEqual, LessOrEqual: same-typed operands, bool result.
absl::StatusOr<Outputs> Comparison(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, {ctx.shape(0), ctx.shape(1)}));
  return One(DType::kBool, std::move(s));
}

absl::StatusOr<Outputs> AndRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectBool(0));
  RETURN_IF_ERROR(ctx.ExpectBool(1));
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, {ctx.shape(0), ctx.shape(1)}));
  return One(DType::kBool, std::move(s));
}

absl::StatusOr<Outputs> WhereRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectBool(0));
  RETURN_IF_ERROR(ctx.ExpectSameDType(1, 2));
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, {ctx.shape(0), ctx.shape(1), ctx.shape(2)}));
  return One(ctx.dtype(1), std::move(s));
}

// ONNX TensorProto.DataType numbers, for a `to` that an importer left as ONNX wrote it.
std::optional<DType> DTypeFromOnnxEnum(int64_t e) {
  switch (e) {
    case 1:
      return DType::kF32;
    case 2:
      return DType::kU8;
    case 3:
      return DType::kI8;
    case 6:
      return DType::kI32;
    case 7:
      return DType::kI64;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kF16;
    case 11:
      return DType::kF64;
    case 16:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<Outputs> CastRule(const InferContext& ctx) {
  const Attrs& a = ctx.attrs();
  std::optional<DType> to;
  if (!a.Has("to")) return ctx.Error() << "attribute 'to' is missing";
  const std::string name = a.Get<std::string>("to");
  if (!name.empty()) {
    to = ParseDType(name);
  } else if (int64_t e = a.Get<int64_t>("to", -1); e >= 0) {
    to = DTypeFromOnnxEnum(e);
  }
  if (!to) {
    return ctx.Error() << "attribute 'to' (" << a.ToString()
                       << ") is not a supported element type name (f32, f64, bf16, f16, i64, i32, "
                          "bool, u8, i8)";
  }
  return One(*to, ctx.shape(0));
}

absl::StatusOr<Outputs> DropoutRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  const double ratio = ctx.attrs().Get<double>("ratio", 0.5);
  if (!(ratio >= 0.0 && ratio < 1.0))
    return ctx.Error() << "ratio " << ratio << " must be in [0, 1)";
  Outputs out = One(ctx.dtype(0), ctx.shape(0));
  if (ctx.num_outputs() > 1) out.push_back({DType::kBool, ctx.shape(0)});
  return out;
}

absl::StatusOr<Outputs> TriluRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 2));
  if (ctx.has_input(1)) {
    RETURN_IF_ERROR(ctx.ExpectInteger(1));
    if (ctx.rank(1) != 0 && !(ctx.rank(1) == 1 && IsOne(ctx.shape(1)[0])))
      return ctx.Error() << ctx.Describe(1) << " (k) must be a scalar";
  }
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> GeluRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  const std::string approx = ctx.attrs().Get<std::string>("approximate", "none");
  if (approx != "none" && approx != "tanh")
    return ctx.Error() << "approximate must be \"none\" or \"tanh\", got \"" << approx << "\"";
  Outputs out = One(ctx.dtype(0), ctx.shape(0));
  if (ctx.num_outputs() > 1) {
    const std::optional<Shape> bits = KeepBitsShape(ctx.shape(0));
    if (!bits) return ctx.Error() << "KeepBits (output 1) needs a last dim that is a multiple of 8, X is " << ctx.Describe(0);
    out.push_back({DType::kU8, *bits});
  }
  return out;
}

}  // namespace

void RegisterElementwiseRules(RuleTable& t) {
  for (OpKind op : {OpKind::kSqrt, OpKind::kReciprocal, OpKind::kExp, OpKind::kLog, OpKind::kErf,
                    OpKind::kTanh, OpKind::kSigmoid, OpKind::kSin, OpKind::kCos})
    SetRule(t, op, FloatUnary);
  SetRule(t, OpKind::kNeg, NumericUnary);
  SetRule(t, OpKind::kAbs, NumericUnary);
  SetRule(t, OpKind::kSign, NumericUnary);
  SetRule(t, OpKind::kCeil, FloatUnary);
  SetRule(t, OpKind::kRelu, NumericUnary);
  SetRule(t, OpKind::kIdentity, IdentityRule);
  SetRule(t, OpKind::kNot, NotRule);
  for (OpKind op : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kMod,
                    OpKind::kMin, OpKind::kMax})
    SetRule(t, op, Arithmetic);
  SetRule(t, OpKind::kPow, PowRule);
  for (OpKind op : {OpKind::kEqual, OpKind::kLess, OpKind::kGreater, OpKind::kGreaterOrEqual,
                    OpKind::kLessOrEqual})
    SetRule(t, op, Comparison);
  SetRule(t, OpKind::kIsNaN, IsNaNRule);
  SetRule(t, OpKind::kAnd, AndRule);
  SetRule(t, OpKind::kWhere, WhereRule);
  SetRule(t, OpKind::kCast, CastRule);
  SetRule(t, OpKind::kDropout, DropoutRule);
  SetRule(t, OpKind::kTrilu, TriluRule);
  SetRule(t, OpKind::kGelu, GeluRule);
}

}  // namespace onnxpipe::ir::infer_internal
