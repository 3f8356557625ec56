// Importers for the ONNX activations and logic ops that onnxpipe lowers at import to its primitive
// ops (whose kernels and gradients it has on every backend): Softplus, Softsign, Mish, Elu, Selu,
// Celu, LeakyRelu, PRelu, ThresholdedRelu, HardSigmoid, HardSwish, the variadic Sum and Mean, Or
// and Xor. Formulas are the operator specification's. The lowerings stay finite where the
// specification's form would overflow in a branch Where discards (exp of a large x), so that no
// inf * 0 reaches a gradient.
#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

// Emits helper nodes for one ONNX node; the last op goes under the node's own output.
class Lowering {
 public:
  explicit Lowering(ImportContext& ctx) : ctx_(ctx), dtype_(InferredValue(ctx, ctx.input(0)).dtype) {}

  ir::ValueId x() const { return ctx_.input(0); }
  ir::ValueId Const(double v) { return ctx_.HelperConstant(ir::Tensor::Scalar<double>(v).CastTo(dtype_)); }
  ir::ValueId Op(OpKind op, std::vector<ir::ValueId> in) { return ctx_.EmitHelper(op, std::move(in)); }
  absl::Status Result(OpKind op, std::vector<ir::ValueId> in) { return ctx_.Emit(op, std::move(in)); }

  // softplus(v) = max(v, 0) + log(1 + exp(-|v|)): no overflow for large |v|.
  ir::ValueId Softplus(ir::ValueId v) {
    const ir::ValueId tail = Op(OpKind::kExp, {Op(OpKind::kNeg, {Op(OpKind::kAbs, {v})})});
    return Op(OpKind::kAdd, {Op(OpKind::kRelu, {v}), Op(OpKind::kLog, {Op(OpKind::kAdd, {tail, Const(1.0)})})});
  }

  // alpha * (exp(min(v, 0) / scale) - 1): the negative branch of Elu (scale 1) and Celu (scale alpha).
  ir::ValueId NegativeBranch(ir::ValueId v, double alpha, double scale) {
    ir::ValueId m = Op(OpKind::kMin, {v, Const(0.0)});
    if (scale != 1.0) m = Op(OpKind::kDiv, {m, Const(scale)});
    return Op(OpKind::kMul, {Op(OpKind::kSub, {Op(OpKind::kExp, {m}), Const(1.0)}), Const(alpha)});
  }

  // max(0, min(1, alpha * v + beta))
  ir::ValueId HardSigmoid(ir::ValueId v, double alpha, double beta) {
    const ir::ValueId line = Op(OpKind::kAdd, {Op(OpKind::kMul, {v, Const(alpha)}), Const(beta)});
    return Op(OpKind::kMax, {Op(OpKind::kMin, {line, Const(1.0)}), Const(0.0)});
  }

  ir::ValueId Negative(ir::ValueId v) { return Op(OpKind::kLess, {v, Const(0.0)}); }

 private:
  ImportContext& ctx_;
  ir::DType dtype_;
};

ONNX_IMPORTER(Softplus) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  Lowering l(ctx);
  return ctx.Emit(OpKind::kIdentity, {l.Softplus(l.x())});
}

ONNX_IMPORTER(Softsign) {  // x / (1 + |x|)
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  Lowering l(ctx);
  return l.Result(OpKind::kDiv, {l.x(), l.Op(OpKind::kAdd, {l.Op(OpKind::kAbs, {l.x()}), l.Const(1.0)})});
}

ONNX_IMPORTER(Mish) {  // x * tanh(softplus(x))
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  Lowering l(ctx);
  return l.Result(OpKind::kMul, {l.x(), l.Op(OpKind::kTanh, {l.Softplus(l.x())})});
}

ONNX_IMPORTER(Elu) {  // x >= 0: x; x < 0: alpha * (exp(x) - 1)
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 1.0));
  Lowering l(ctx);
  return l.Result(OpKind::kWhere, {l.Negative(l.x()), l.NegativeBranch(l.x(), alpha, 1.0), l.x()});
}

ONNX_IMPORTER(Celu) {  // max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 1.0));
  if (alpha == 0.0) return ctx.Error() << "attribute alpha must not be 0";
  Lowering l(ctx);
  return l.Result(OpKind::kWhere, {l.Negative(l.x()), l.NegativeBranch(l.x(), alpha, alpha), l.x()});
}

ONNX_IMPORTER(Selu) {  // gamma * (x > 0: x; x <= 0: alpha * (exp(x) - 1))
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 1.67326319217681884765625));
  ASSIGN_OR_RETURN(const double gamma, ctx.attrs().Get<double>("gamma", 1.05070102214813232421875));
  Lowering l(ctx);
  const ir::ValueId elu = l.Op(OpKind::kWhere, {l.Negative(l.x()), l.NegativeBranch(l.x(), alpha, 1.0), l.x()});
  return l.Result(OpKind::kMul, {elu, l.Const(gamma)});
}

ONNX_IMPORTER(LeakyRelu) {  // x >= 0: x; x < 0: alpha * x
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 0.01));
  Lowering l(ctx);
  return l.Result(OpKind::kWhere, {l.Negative(l.x()), l.Op(OpKind::kMul, {l.x(), l.Const(alpha)}), l.x()});
}

ONNX_IMPORTER(PRelu) {  // x >= 0: x; x < 0: slope * x (slope broadcast to X)
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  Lowering l(ctx);
  return l.Result(OpKind::kWhere, {l.Negative(l.x()), l.Op(OpKind::kMul, {l.x(), ctx.input(1)}), l.x()});
}

ONNX_IMPORTER(ThresholdedRelu) {  // x > alpha: x; else 0
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 1.0));
  Lowering l(ctx);
  return l.Result(OpKind::kWhere, {l.Op(OpKind::kGreater, {l.x(), l.Const(alpha)}), l.x(), l.Const(0.0)});
}

ONNX_IMPORTER(HardSigmoid) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  ASSIGN_OR_RETURN(const double alpha, ctx.attrs().Get<double>("alpha", 0.2));
  ASSIGN_OR_RETURN(const double beta, ctx.attrs().Get<double>("beta", 0.5));
  Lowering l(ctx);
  return ctx.Emit(OpKind::kIdentity, {l.HardSigmoid(l.x(), alpha, beta)});
}

ONNX_IMPORTER(HardSwish) {  // x * HardSigmoid(x) with alpha 1/6, beta 1/2
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  Lowering l(ctx);
  return l.Result(OpKind::kMul, {l.x(), l.HardSigmoid(l.x(), 1.0 / 6.0, 0.5)});
}

// Sum and Mean: a left fold of Add over 1..N operands (numpy broadcasting); Mean divides by N.
absl::Status ImportSumOrMean(ImportContext& ctx, bool mean) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, ir::kVariadic));
  const int n = ctx.num_inputs();
  const int folded = mean ? n : n - 1;  // operands added by helper nodes
  Lowering l(ctx);
  ir::ValueId acc = ctx.input(0);
  for (int i = 1; i < folded; ++i) acc = l.Op(OpKind::kAdd, {acc, ctx.input(i)});
  if (mean) return l.Result(OpKind::kDiv, {acc, l.Const(static_cast<double>(n))});
  if (n == 1) return ctx.Emit(OpKind::kIdentity, {acc});
  return l.Result(OpKind::kAdd, {acc, ctx.input(n - 1)});
}
ONNX_IMPORTER(Sum) { return ImportSumOrMean(ctx, false); }
ONNX_IMPORTER(Mean) { return ImportSumOrMean(ctx, true); }

ONNX_IMPORTER(Or) {  // not (not a and not b)
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  const ir::ValueId both_false = ctx.EmitHelper(
      OpKind::kAnd, {ctx.EmitHelper(OpKind::kNot, {ctx.input(0)}), ctx.EmitHelper(OpKind::kNot, {ctx.input(1)})});
  return ctx.Emit(OpKind::kNot, {both_false});
}

ONNX_IMPORTER(Xor) {  // a != b
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 2));
  return ctx.Emit(OpKind::kNot, {ctx.EmitHelper(OpKind::kEqual, {ctx.input(0), ctx.input(1)})});
}

}  // namespace

void RegisterActivationImporters(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, Softplus);
  REGISTER_ONNX_IMPORTER(r, Softsign);
  REGISTER_ONNX_IMPORTER_SINCE(r, Mish, 18);
  REGISTER_ONNX_IMPORTER(r, Elu);
  REGISTER_ONNX_IMPORTER(r, Celu);
  REGISTER_ONNX_IMPORTER(r, Selu);
  REGISTER_ONNX_IMPORTER(r, LeakyRelu);
  REGISTER_ONNX_IMPORTER(r, PRelu);
  REGISTER_ONNX_IMPORTER(r, ThresholdedRelu);
  REGISTER_ONNX_IMPORTER(r, HardSigmoid);
  REGISTER_ONNX_IMPORTER(r, HardSwish);
  REGISTER_ONNX_IMPORTER(r, Sum);
  REGISTER_ONNX_IMPORTER(r, Mean);
  REGISTER_ONNX_IMPORTER(r, Or);
  REGISTER_ONNX_IMPORTER(r, Xor);
}

}  // namespace onnxpipe::onnx_frontend
