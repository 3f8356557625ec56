// Shape rules of the optimizer ops (SumSquares, SumScalars, ClipScale, SGDUpdate, AdamWUpdate; op.h states
// their semantics). Updates produce values shaped like the parameter; the norm ops produce scalars.
#include "frontend/ir/infer_rules.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::ir::infer_internal {
namespace {

absl::Status ExpectScalarInput(const InferContext& ctx, int i, std::string_view what) {
  if (!ctx.has_input(i)) return ctx.Error() << what << " (input " << i << ") is required";
  const Dim n = NumElements(ctx.shape(i));
  if (!n.is_concrete() || n.value() != 1) {
    return ctx.Error() << what << " must be a scalar, got " << ctx.Describe(i);
  }
  return absl::OkStatus();
}

// Inputs `others` must have the dtype and shape of input `like`.
absl::Status ExpectSameAs(const InferContext& ctx, int like, std::initializer_list<int> others) {
  for (int i : others) {
    if (!ctx.has_input(i)) return ctx.Error() << "input " << i << " is required";
    RETURN_IF_ERROR(ctx.ExpectSameDType(like, i));
    const Shape& a = ctx.shape(like);
    const Shape& b = ctx.shape(i);
    bool same = a.size() == b.size();
    for (size_t k = 0; same && k < a.size(); ++k) same = UnifyDims(a[k], b[k]).has_value();
    if (!same) {
      return ctx.Error() << ctx.Describe(i) << " must have the shape of " << ctx.Describe(like);
    }
  }
  return absl::OkStatus();
}

// The dtype attribute `to` of SumSquares and SumScalars: a float type name, input 0's by default.
absl::StatusOr<DType> ResultDType(const InferContext& ctx) {
  if (!ctx.attrs().Has("to")) return ctx.dtype(0);
  const std::optional<DType> to = ParseDType(ctx.attrs().Get<std::string>("to", ""));
  if (!to || !IsFloat(*to)) {
    return ctx.Error() << "attribute 'to' (" << ctx.attrs().ToString() << ") is not a float type name (f64, f32, ...)";
  }
  return *to;
}

absl::StatusOr<Outputs> InferSumSquares(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    if (ctx.has_input(i)) RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
  }
  ASSIGN_OR_RETURN(const DType to, ResultDType(ctx));
  return One(to, Shape{});
}

absl::StatusOr<Outputs> InferSumScalars(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (i > 0) RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
    RETURN_IF_ERROR(ExpectScalarInput(ctx, i, "term"));
  }
  ASSIGN_OR_RETURN(const DType to, ResultDType(ctx));
  return One(to, Shape{});
}

absl::StatusOr<Outputs> InferClipScale(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ExpectScalarInput(ctx, 0, "norm"));
  return One(ctx.dtype(0), Shape{});
}

// An update's outputs `out` followed by its optional ones (op.h) where the node has their slots: the gradient's sum
// of squares (an f64 scalar) and the parameter's compute copy (attr copy_to, a half dtype).
absl::StatusOr<Outputs> WithExtras(const InferContext& ctx, Outputs out) {
  const OpKind op = ctx.node().op;
  if (ctx.num_outputs() > UpdateSumSquaresOutput(op)) out.push_back({DType::kF64, Shape{}});
  if (ctx.num_outputs() > UpdateComputeCopyOutput(op)) {
    const std::optional<DType> to = ParseDType(ctx.attrs().Get<std::string>("copy_to", ""));
    if (!to || !IsHalf(*to)) {
      return ctx.Error() << "the compute copy output needs attribute copy_to naming a half dtype (bf16, f16), got '"
                         << ctx.attrs().Get<std::string>("copy_to", "") << "'";
    }
    out.push_back({*to, ctx.shape(0)});
  }
  return out;
}

absl::StatusOr<Outputs> InferSGDUpdate(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ExpectSameAs(ctx, 0, {1}));
  const bool momentum = ctx.attrs().Get<double>("momentum", 0.0) != 0;
  if (momentum) RETURN_IF_ERROR(ExpectSameAs(ctx, 0, {3}));
  if (momentum != ctx.has_output(1)) {
    return ctx.Error() << "the momentum buffer output must be present exactly when momentum != 0";
  }
  RETURN_IF_ERROR(ExpectScalarInput(ctx, 2, "lr"));
  if (ctx.has_input(4)) RETURN_IF_ERROR(ExpectScalarInput(ctx, 4, "scale"));
  const TypeAndShape p{ctx.dtype(0), ctx.shape(0)};
  return WithExtras(ctx, Outputs(std::min(ctx.num_outputs(), 2), p));
}

absl::StatusOr<Outputs> InferAdamWUpdate(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ExpectSameAs(ctx, 0, {1, 2, 3}));
  RETURN_IF_ERROR(ExpectScalarInput(ctx, 4, "lr"));
  RETURN_IF_ERROR(ExpectScalarInput(ctx, 5, "step"));
  RETURN_IF_ERROR(ctx.ExpectInteger(5));
  if (ctx.has_input(6)) RETURN_IF_ERROR(ExpectScalarInput(ctx, 6, "scale"));
  const TypeAndShape p{ctx.dtype(0), ctx.shape(0)};
  return WithExtras(ctx, Outputs{p, p, p});
}

}  // namespace

void RegisterTrainRules(RuleTable& t) {
  SetRule(t, OpKind::kSumSquares, InferSumSquares);
  SetRule(t, OpKind::kSumScalars, InferSumScalars);
  SetRule(t, OpKind::kClipScale, InferClipScale);
  SetRule(t, OpKind::kSGDUpdate, InferSGDUpdate);
  SetRule(t, OpKind::kAdamWUpdate, InferAdamWUpdate);
}

}  // namespace onnxpipe::ir::infer_internal
