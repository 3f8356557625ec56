// Shape rules for the gradient and training ops autodiff builds (conventions in op.h); the
// optimizer ops' rules are in infer_train.cc.
// Most of them take the shape of a forward operand (the `like` inputs are shape-only); the rules
// check the operands that must agree so a wrong gradient graph fails here, naming the node, rather
// than in a kernel.
#include <algorithm>

#include "frontend/ir/attention_views.h"
#include "frontend/ir/infer_rules.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::ir::infer_internal {
namespace {

// `from` right-aligned must broadcast to `to` (numpy rules, `to` unchanged).
bool BroadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t k = 0; k < from.size(); ++k) {
    const Dim& f = from[from.size() - 1 - k];
    if (!IsOne(f) && !UnifyDims(f, to[to.size() - 1 - k])) return false;
  }
  return true;
}

absl::StatusOr<Outputs> SumRule(const InferContext& ctx) {
  std::vector<Shape> shapes;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error() << "input " << i << " is absent";
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
    shapes.push_back(ctx.shape(i));
  }
  ASSIGN_OR_RETURN(Shape s, BroadcastShapes(ctx, shapes));
  return One(ctx.dtype(0), std::move(s));
}

absl::StatusOr<Outputs> FusedMatMulRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 2));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(1, 2));
  const bool ta = ctx.attrs().Get<int64_t>("trans_a", 0) != 0;
  const bool tb = ctx.attrs().Get<int64_t>("trans_b", 0) != 0;
  const Shape &a = ctx.shape(0), &b = ctx.shape(1);
  const size_t ra = a.size(), rb = b.size();
  const Dim m = a[ta ? ra - 1 : ra - 2], ka = a[ta ? ra - 2 : ra - 1];
  const Dim kb = b[tb ? rb - 1 : rb - 2], n = b[tb ? rb - 2 : rb - 1];
  if (!UnifyDims(ka, kb)) {
    return ctx.Error() << "inner dims differ: " << ka.ToString() << " vs " << kb.ToString() << " in " << ctx.Describe(0)
                       << " and " << ctx.Describe(1);
  }
  ASSIGN_OR_RETURN(Shape out, BroadcastShapes(ctx, {Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)}));
  out.push_back(m);
  out.push_back(n);
  DType dtype = ctx.dtype(0);
  if (ctx.attrs().Has("to")) {
    const std::optional<DType> to = ParseDType(ctx.attrs().Get<std::string>("to"));
    if (to != DType::kF32) return ctx.Error() << "attribute 'to' (" << ctx.attrs().ToString() << ") is not f32";
    dtype = *to;
  }
  Outputs result = One(dtype, std::move(out));
  if (ctx.num_outputs() < 2) return result;
  const std::string of = ctx.attrs().Get<std::string>("k_sum", "");
  if (of != "a" && of != "b") return ctx.Error() << "has a KSum output but k_sum is '" << of << "', not a or b";
  if (ra != 2 || rb != 2)
    return ctx.Error() << "KSum needs rank-2 operands, got " << ctx.Describe(0) << " and " << ctx.Describe(1);
  result.push_back({dtype, {of == "a" ? m : n}});
  return result;
}

absl::StatusOr<Outputs> ReduceToShapeOfRule(const InferContext& ctx) {
  if (!BroadcastsTo(ctx.shape(1), ctx.shape(0)))
    return ctx.Error() << ctx.Describe(1) << " does not broadcast to " << ctx.Describe(0);
  return One(ctx.dtype(0), ctx.shape(1));
}

absl::StatusOr<Outputs> ExpandLikeRule(const InferContext& ctx) {
  Shape x = ctx.shape(0);
  const std::vector<int64_t> raw = ctx.attrs().Get<std::vector<int64_t>>("axes");
  if (!raw.empty()) {
    const int64_t out_rank = ctx.rank(0) + static_cast<int64_t>(raw.size());
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.Axes(raw, out_rank, "axes"));
    Shape u;
    size_t next = 0;
    for (int64_t i = 0; i < out_rank; ++i) {
      if (std::find(axes.begin(), axes.end(), i) != axes.end())
        u.push_back(Dim(1));
      else
        u.push_back(x[next++]);
    }
    x = std::move(u);
  }
  if (!BroadcastsTo(x, ctx.shape(1))) {
    return ctx.Error() << ctx.Describe(0) << " (as " << ShapeToString(x) << ") does not broadcast to "
                       << ctx.Describe(1);
  }
  return One(ctx.dtype(0), ctx.shape(1));
}

absl::StatusOr<Outputs> ReshapeLikeRule(const InferContext& ctx) {
  const Dim a = NumElements(ctx.shape(0)), b = NumElements(ctx.shape(1));
  if (a.symbols() == b.symbols() && a.factor() != b.factor()) {
    return ctx.Error() << ctx.Describe(0) << " and " << ctx.Describe(1) << " have different element counts";
  }
  return One(ctx.dtype(0), ctx.shape(1));
}

absl::StatusOr<Outputs> ZerosLikeRule(const InferContext& ctx) { return One(ctx.dtype(0), ctx.shape(0)); }

// GatherElementsGrad / GatherNDGrad (dY, indices, like): like's shape, dY's dtype.
absl::StatusOr<Outputs> ScatterBackRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(2, 1));
  return One(ctx.dtype(0), ctx.shape(2));
}

absl::StatusOr<Outputs> GatherGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(2, 1));
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(2), "axis"));
  // dY = like[:axis] + indices + like[axis+1:].
  if (ctx.rank(0) != ctx.rank(2) - 1 + ctx.rank(1)) {
    return ctx.Error() << ctx.Describe(0) << " is not a Gather output of " << ctx.Describe(2) << " with "
                       << ctx.Describe(1) << " on axis " << axis;
  }
  return One(ctx.dtype(0), ctx.shape(2));
}

absl::StatusOr<Outputs> SliceGradRule(const InferContext& ctx) {
  if (ctx.rank(0) != ctx.rank(1))
    return ctx.Error() << ctx.Describe(0) << " and " << ctx.Describe(1) << " must have the same rank";
  return One(ctx.dtype(0), ctx.shape(1));
}

absl::StatusOr<Outputs> ConcatGradRule(const InferContext& ctx) {
  const int n = ctx.num_inputs() - 1;
  if (ctx.num_outputs() != n) {
    return ctx.Error() << "has " << ctx.num_outputs() << " outputs for " << n << " like inputs";
  }
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis"));
  (void)axis;
  Outputs out;
  for (int i = 1; i <= n; ++i) {
    if (!ctx.has_input(i)) return ctx.Error() << "input " << i << " is absent";
    if (ctx.rank(i) != ctx.rank(0))
      return ctx.Error() << ctx.Describe(i) << " must have the rank of " << ctx.Describe(0);
    out.push_back({ctx.dtype(0), ctx.shape(i)});
  }
  return out;
}

// dY with the shape of the forward operand (ReluGrad's Y, GeluGrad's X, DropoutGrad's mask...).
absl::StatusOr<Outputs> PointwiseGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  ASSIGN_OR_RETURN(Shape s, SameShape(ctx, 0, 1));
  return One(ctx.dtype(0), std::move(s));
}

// A gradient's column sums (GeluGrad's and LayerNormGrad's dXSums): the last dim of the gradient (dims
// `s`), of dtype attr sums_to (default `dx`).
absl::StatusOr<TypeAndShape> SumsType(const InferContext& ctx, DType dx, const Shape& s) {
  const std::string to = ctx.attrs().Get<std::string>("sums_to", std::string(DTypeName(dx)));
  const std::optional<DType> t = ParseDType(to);
  if (!t || !IsFloat(*t)) return ctx.Error() << "sums_to is '" << to << "', expected a float dtype name";
  if (s.empty()) return ctx.Error() << "column sums need a gradient of rank >= 1, X is " << ctx.Describe(1);
  return TypeAndShape{*t, Shape{s.back()}};
}

// PointwiseGradRule's, and the forward's keep bits (input 2), when given, packed from X's dims;
// dXSums (X's last dim, of dtype sums_to).
absl::StatusOr<Outputs> GeluGradRule(const InferContext& ctx) {
  ASSIGN_OR_RETURN(Outputs out, PointwiseGradRule(ctx));
  if (ctx.num_outputs() > 1) {
    ASSIGN_OR_RETURN(TypeAndShape t, SumsType(ctx, out[0].dtype, out[0].shape));
    out.push_back(std::move(t));
  }
  if (!ctx.has_input(2)) return out;
  const std::optional<Shape> bits = KeepBitsShape(out[0].shape);
  if (!bits) return ctx.Error() << "keep bits (input 2) need X's last dim a multiple of 8, X is " << ctx.Describe(1);
  if (ctx.dtype(2) != DType::kU8 || !(ctx.shape(2) == *bits)) {
    return ctx.Error() << ctx.Describe(2) << " must be u8 keep bits of X's dims with the last / 8, "
                       << ShapeToString(*bits);
  }
  return out;
}

// dY's shape, and the mask's when it is given.
absl::StatusOr<Outputs> DropoutGradRule(const InferContext& ctx) {
  if (ctx.has_input(1)) return PointwiseGradRule(ctx);
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> SoftmaxGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  ASSIGN_OR_RETURN(Shape s, SameShape(ctx, 0, 1));
  RETURN_IF_ERROR(ctx.Axis(ctx.attrs().Get<int64_t>("axis", -1), ctx.rank(0), "axis").status());
  return One(ctx.dtype(0), std::move(s));
}

absl::StatusOr<Outputs> LayerNormGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  ASSIGN_OR_RETURN(Shape s, SameShape(ctx, 0, 1));
  if (const int dres = NormGradResidualInput(ctx.node().op); ctx.has_input(dres)) {
    RETURN_IF_ERROR(SameShape(ctx, 1, dres).status());
  }
  const int dy2 = NormGradDy2Input(ctx.node().op);
  if (ctx.has_input(dy2)) RETURN_IF_ERROR(SameShape(ctx, 0, dy2).status());
  RETURN_IF_ERROR(ctx.Axis(ctx.attrs().Get<int64_t>("axis", -1), ctx.rank(1), "axis").status());
  if (ctx.has_output(3) && ctx.attrs().Get<double>("dropout", 0.0) == 0.0) {
    return ctx.Error() << "output 3 (dX through the forward's dropout) needs a nonzero attribute dropout";
  }
  if (ctx.has_output(5) && !ctx.has_output(3)) return ctx.Error() << "output 5 (dXDropped's sums) needs output 3";
  Outputs out = One(ctx.dtype(1), s);
  for (int i = 1; i < ctx.num_outputs(); ++i) {
    if (i == 3) {
      out.push_back({ctx.dtype(1), s});
    } else if (i >= 4) {
      ASSIGN_OR_RETURN(TypeAndShape t, SumsType(ctx, ctx.dtype(1), s));
      out.push_back(std::move(t));
    } else {
      out.push_back({ctx.dtype(2), ctx.shape(2)});
    }
  }
  return out;
}

absl::StatusOr<Outputs> AttentionGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  // dO has O's shape: Q's with the last dim replaced by V's (o_shape when O is written through a view).
  ASSIGN_OR_RETURN(const std::vector<Shape> operands, AttentionOperandShapes(ctx, 1));
  Shape o = operands[0];
  o.back() = operands[2].back();
  if (HasAttentionView(ctx.node(), 3)) {
    if (!IsConcrete(o)) return ctx.Error() << "o_view needs concrete operand shapes";
    o = FromInts(AttentionOutputDims(ctx.node(), ToInts(o)));
  }
  bool ok = o.size() == ctx.shape(0).size();
  for (size_t k = 0; ok && k < o.size(); ++k) ok = UnifyDims(o[k], ctx.shape(0)[k]).has_value();
  if (!ok) {
    return ctx.Error() << ctx.Describe(0) << " does not have the attention output's shape " << ShapeToString(o);
  }
  // The forward's O (dO's shape) and Stats (f32), when given.
  if (ctx.has_input(5)) RETURN_IF_ERROR(SameShape(ctx, 0, 5).status());
  if (ctx.has_input(6) && ctx.dtype(6) != DType::kF32) {
    return ctx.Error() << ctx.Describe(6) << ": the forward's Stats must be f32";
  }
  Outputs out = {{ctx.dtype(1), ctx.shape(1)}, {ctx.dtype(2), ctx.shape(2)}, {ctx.dtype(3), ctx.shape(3)}};
  if (ctx.num_outputs() > 3) {
    if (!ctx.has_input(4) || !IsFloat(ctx.dtype(4))) {
      return ctx.Error() << "dMask (output 3) needs an additive float mask (input 4)";
    }
    out.push_back({ctx.dtype(4), ctx.shape(4)});
  }
  return out;
}

// Input 1 is the forward's scores when Stats (input 4) is given, else its log_prob (op.h).
absl::StatusOr<Outputs> SoftmaxCrossEntropyLossGradRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(1));
  RETURN_IF_ERROR(ctx.ExpectInteger(2));
  const char* x = ctx.has_input(4) ? "scores" : "log_prob";
  if (ctx.rank(2) + 1 != ctx.rank(1)) {
    return ctx.Error() << "labels " << ctx.Describe(2) << " do not match " << x << " " << ctx.Describe(1);
  }
  if (ctx.has_input(4)) {
    const DType compute = IsHalf(ctx.dtype(1)) ? DType::kF32 : ctx.dtype(1);
    Shape stats = ctx.shape(2);
    stats.push_back(Dim(2));
    bool ok = ctx.dtype(4) == compute && ctx.rank(4) == static_cast<int64_t>(stats.size());
    for (size_t k = 0; ok && k < stats.size(); ++k) ok = UnifyDims(stats[k], ctx.shape(4)[k]).has_value();
    if (!ok) {
      return ctx.Error() << "the forward's Stats " << ctx.Describe(4) << " must be " << DTypeName(compute)
                         << ShapeToString(stats) << " (the labels' dims and 2)";
    }
  }
  return One(ctx.dtype(1), ctx.shape(1));
}

}  // namespace

void RegisterGradRules(RuleTable& t) {
  SetRule(t, OpKind::kSum, SumRule);
  SetRule(t, OpKind::kFusedMatMul, FusedMatMulRule);
  SetRule(t, OpKind::kReduceToShapeOf, ReduceToShapeOfRule);
  SetRule(t, OpKind::kExpandLike, ExpandLikeRule);
  SetRule(t, OpKind::kReshapeLike, ReshapeLikeRule);
  SetRule(t, OpKind::kZerosLike, ZerosLikeRule);
  SetRule(t, OpKind::kGatherGrad, GatherGradRule);
  SetRule(t, OpKind::kGatherElementsGrad, ScatterBackRule);
  SetRule(t, OpKind::kGatherNDGrad, ScatterBackRule);
  SetRule(t, OpKind::kSliceGrad, SliceGradRule);
  SetRule(t, OpKind::kConcatGrad, ConcatGradRule);
  SetRule(t, OpKind::kReluGrad, PointwiseGradRule);
  SetRule(t, OpKind::kGeluGrad, GeluGradRule);
  SetRule(t, OpKind::kDropoutGrad, DropoutGradRule);
  SetRule(t, OpKind::kSoftmaxGrad, SoftmaxGradRule);
  SetRule(t, OpKind::kLogSoftmaxGrad, SoftmaxGradRule);
  SetRule(t, OpKind::kLayerNormGrad, LayerNormGradRule);
  SetRule(t, OpKind::kRMSNormGrad, LayerNormGradRule);  // dX like X, dScale like scale
  SetRule(t, OpKind::kAttentionGrad, AttentionGradRule);
  SetRule(t, OpKind::kSoftmaxCrossEntropyLossGrad, SoftmaxCrossEntropyLossGradRule);
}

}  // namespace onnxpipe::ir::infer_internal
