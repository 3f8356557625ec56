// Importers for element-wise ops: unary math, binary arithmetic and comparisons (numpy
// broadcasting is the IR's too), logic, Where, Identity, Gelu. These map one to one.
#include "absl/strings/str_cat.h"
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

// Ops whose ONNX inputs and the IR operands are the same `n` required tensors, no attributes.
absl::Status ImportPlain(ImportContext& ctx, OpKind op, int n) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(n, n));
  std::vector<ir::ValueId> in(n);
  for (int i = 0; i < n; ++i) in[i] = ctx.input(i);
  return ctx.Emit(op, std::move(in));
}

ONNX_IMPORTER(Add) { return ImportPlain(ctx, OpKind::kAdd, 2); }
ONNX_IMPORTER(Sub) { return ImportPlain(ctx, OpKind::kSub, 2); }
ONNX_IMPORTER(Mul) { return ImportPlain(ctx, OpKind::kMul, 2); }
ONNX_IMPORTER(Div) { return ImportPlain(ctx, OpKind::kDiv, 2); }
ONNX_IMPORTER(Pow) { return ImportPlain(ctx, OpKind::kPow, 2); }
ONNX_IMPORTER(Equal) { return ImportPlain(ctx, OpKind::kEqual, 2); }
ONNX_IMPORTER(Less) { return ImportPlain(ctx, OpKind::kLess, 2); }
ONNX_IMPORTER(Greater) { return ImportPlain(ctx, OpKind::kGreater, 2); }
ONNX_IMPORTER(And) { return ImportPlain(ctx, OpKind::kAnd, 2); }
ONNX_IMPORTER(Where) { return ImportPlain(ctx, OpKind::kWhere, 3); }

ONNX_IMPORTER(Sqrt) { return ImportPlain(ctx, OpKind::kSqrt, 1); }
ONNX_IMPORTER(Reciprocal) { return ImportPlain(ctx, OpKind::kReciprocal, 1); }
ONNX_IMPORTER(Neg) { return ImportPlain(ctx, OpKind::kNeg, 1); }
ONNX_IMPORTER(Exp) { return ImportPlain(ctx, OpKind::kExp, 1); }
ONNX_IMPORTER(Log) { return ImportPlain(ctx, OpKind::kLog, 1); }
ONNX_IMPORTER(Erf) { return ImportPlain(ctx, OpKind::kErf, 1); }
ONNX_IMPORTER(Tanh) { return ImportPlain(ctx, OpKind::kTanh, 1); }
ONNX_IMPORTER(Relu) { return ImportPlain(ctx, OpKind::kRelu, 1); }
ONNX_IMPORTER(Sigmoid) { return ImportPlain(ctx, OpKind::kSigmoid, 1); }
ONNX_IMPORTER(Sin) { return ImportPlain(ctx, OpKind::kSin, 1); }
ONNX_IMPORTER(Cos) { return ImportPlain(ctx, OpKind::kCos, 1); }
ONNX_IMPORTER(Abs) { return ImportPlain(ctx, OpKind::kAbs, 1); }
ONNX_IMPORTER(Sign) { return ImportPlain(ctx, OpKind::kSign, 1); }
ONNX_IMPORTER(Ceil) { return ImportPlain(ctx, OpKind::kCeil, 1); }

// ONNX Min/Max are variadic (1..N operands, numpy broadcasting): a left fold of binary IR ops, the
// last one emitted under the node's own name and output.
absl::Status ImportMinMax(ImportContext& ctx, OpKind op) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, ir::kVariadic));
  const int n = ctx.num_inputs();
  if (n == 1) return ctx.Emit(OpKind::kIdentity, {ctx.input(0)});
  ir::ValueId acc = ctx.input(0);
  for (int i = 1; i + 1 < n; ++i) {
    acc = ctx.EmitHelper(op, {acc, ctx.input(i)});
  }
  return ctx.Emit(op, {acc, ctx.input(n - 1)});
}
ONNX_IMPORTER(Min) { return ImportMinMax(ctx, OpKind::kMin); }
ONNX_IMPORTER(Max) { return ImportMinMax(ctx, OpKind::kMax); }

// Clip(x, min?, max?) (opset >= 11: bounds are optional scalar inputs) = Min(Max(x, min), max), np.clip's
// order (min > max gives max). An absent bound is no bound; the gradient flows where x is inside them.
ONNX_IMPORTER(Clip) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 3));
  if (ctx.attrs().Has("min") || ctx.attrs().Has("max")) {
    return ctx.Error() << "the attribute form of min/max (opset < 11) is not supported";
  }
  const bool lo = ctx.has_input(1), hi = ctx.has_input(2);
  if (!lo && !hi) return ctx.Emit(OpKind::kIdentity, {ctx.input(0)});
  if (!hi) return ctx.Emit(OpKind::kMax, {ctx.input(0), ctx.input(1)});
  const ir::ValueId floor = lo ? ctx.EmitHelper(OpKind::kMax, {ctx.input(0), ctx.input(1)}) : ctx.input(0);
  return ctx.Emit(OpKind::kMin, {floor, ctx.input(2)});
}
ONNX_IMPORTER(Not) { return ImportPlain(ctx, OpKind::kNot, 1); }
ONNX_IMPORTER(Identity) { return ImportPlain(ctx, OpKind::kIdentity, 1); }

ONNX_IMPORTER(Mod) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  ASSIGN_OR_RETURN(int64_t fmod, ctx.attrs().Get<int64_t>("fmod", 0));
  if (fmod != 0 && fmod != 1) return ctx.Error() << "attribute fmod must be 0 or 1; got " << fmod;
  ir::Attrs attrs;
  attrs.Set("fmod", fmod);
  return ctx.Emit(OpKind::kMod, {ctx.input(0), ctx.input(1)}, std::move(attrs));
}

// ai.onnx Gelu (opset 20) and com.microsoft Gelu import straight to the fused IR op.
ONNX_IMPORTER(Gelu) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  // The StatusOr is kept, not moved into a local string: GCC 12 warns (-Wmaybe-uninitialized, a false
  // positive) about the moved-to string's inline buffer.
  const absl::StatusOr<std::string> approximate = ctx.attrs().Get<std::string>("approximate", "none");
  RETURN_IF_ERROR(approximate.status());
  if (*approximate != "none" && *approximate != "tanh") {
    return ctx.Error() << "attribute approximate must be 'none' or 'tanh'; got '" << *approximate
                       << "'";
  }
  ir::Attrs attrs;
  attrs.Set("approximate", *approximate);
  return ctx.Emit(OpKind::kGelu, {ctx.input(0)}, std::move(attrs));
}

}  // namespace

void RegisterElementwiseImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, Add);
  REGISTER_ONNX_IMPORTER(r, Sub);
  REGISTER_ONNX_IMPORTER(r, Mul);
  REGISTER_ONNX_IMPORTER(r, Div);
  REGISTER_ONNX_IMPORTER(r, Pow);
  REGISTER_ONNX_IMPORTER(r, Equal);
  REGISTER_ONNX_IMPORTER(r, Less);
  REGISTER_ONNX_IMPORTER(r, Greater);
  REGISTER_ONNX_IMPORTER(r, And);
  REGISTER_ONNX_IMPORTER(r, Where);
  REGISTER_ONNX_IMPORTER(r, Sqrt);
  REGISTER_ONNX_IMPORTER(r, Reciprocal);
  REGISTER_ONNX_IMPORTER(r, Neg);
  REGISTER_ONNX_IMPORTER(r, Exp);
  REGISTER_ONNX_IMPORTER(r, Sin);
  REGISTER_ONNX_IMPORTER(r, Cos);
  REGISTER_ONNX_IMPORTER(r, Abs);
  REGISTER_ONNX_IMPORTER(r, Sign);
  REGISTER_ONNX_IMPORTER(r, Ceil);
  REGISTER_ONNX_IMPORTER(r, Clip);
  REGISTER_ONNX_IMPORTER(r, Min);
  REGISTER_ONNX_IMPORTER(r, Max);
  REGISTER_ONNX_IMPORTER(r, Log);
  REGISTER_ONNX_IMPORTER(r, Erf);
  REGISTER_ONNX_IMPORTER(r, Tanh);
  REGISTER_ONNX_IMPORTER(r, Relu);
  REGISTER_ONNX_IMPORTER(r, Sigmoid);
  REGISTER_ONNX_IMPORTER(r, Not);
  REGISTER_ONNX_IMPORTER(r, Identity);
  REGISTER_ONNX_IMPORTER(r, Mod);
  REGISTER_ONNX_IMPORTER_SINCE(r, Gelu, 20);
  REGISTER_ONNX_IMPORTER_IN_DOMAIN(r, "com.microsoft", Gelu);
}

}  // namespace onnxpipe::onnx_frontend
