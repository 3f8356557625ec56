// Shape rules for the compute ops of a transformer: MatMul (numpy semantics), Gemm, reductions,
// Softmax/LogSoftmax, SoftmaxCrossEntropyLoss, and the fused Linear, LayerNorm, Attention,
// Rotary and GatedActivation (with RotaryGrad and GatedActivationGrad, which have their forward's
// operands).
#include <algorithm>

#include "frontend/ir/attention_views.h"
#include "frontend/ir/gated_activation.h"
#include "frontend/ir/infer_rules.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::ir::infer_internal {
namespace {

// A dim two operands must agree on (a contraction dim); fails naming both operands.
absl::StatusOr<Dim> Agree(const InferContext& ctx, const Dim& a, const Dim& b, const char* what, int ia, int ib) {
  std::optional<Dim> d = UnifyDims(a, b);
  if (!d) {
    return ctx.Error() << what << " differ: " << a.ToString() << " vs " << b.ToString() << " in " << ctx.Describe(ia)
                       << " and " << ctx.Describe(ib);
  }
  return *d;
}

// `from` must broadcast to `to` without changing it (bias, scale, Gemm's C).
absl::Status ExpectBroadcastsTo(const InferContext& ctx, int i, const Shape& to) {
  const Shape& from = ctx.shape(i);
  bool ok = from.size() <= to.size();
  for (size_t k = 0; ok && k < from.size(); ++k) {
    const Dim& f = from[from.size() - 1 - k];
    if (!IsOne(f) && !UnifyDims(f, to[to.size() - 1 - k])) ok = false;
  }
  if (ok) return absl::OkStatus();
  return ctx.Error() << ctx.Describe(i) << " does not broadcast to " << ShapeToString(to);
}

absl::StatusOr<Outputs> MatMulRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  if (ctx.rank(0) == 0 || ctx.rank(1) == 0)
    return ctx.Error() << "operands must have rank >= 1: " << ctx.Describe(0) << ", " << ctx.Describe(1);
  // numpy: a 1-D left operand is a row (1, K), a 1-D right operand a column (K, 1); the added dim
  // is dropped from the result.
  const bool a_vec = ctx.rank(0) == 1, b_vec = ctx.rank(1) == 1;
  Shape a = ctx.shape(0), b = ctx.shape(1);
  if (a_vec) a.insert(a.begin(), Dim(1));
  if (b_vec) b.push_back(Dim(1));
  ASSIGN_OR_RETURN(Dim k, Agree(ctx, a[a.size() - 1], b[b.size() - 2], "inner dims", 0, 1));
  (void)k;
  const Shape a_batch(a.begin(), a.end() - 2), b_batch(b.begin(), b.end() - 2);
  absl::StatusOr<Shape> batch = BroadcastShapes(ctx, {a_batch, b_batch});
  if (!batch.ok()) {
    return ctx.Error() << "batch dims " << ShapeToString(a_batch) << " and " << ShapeToString(b_batch)
                       << " do not broadcast: " << ctx.Describe(0) << ", " << ctx.Describe(1);
  }
  Shape out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b[b.size() - 1]);
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> GemmRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  if (ctx.rank(0) != 2 || ctx.rank(1) != 2)
    return ctx.Error() << "A and B must be 2-D: " << ctx.Describe(0) << ", " << ctx.Describe(1);
  const bool ta = ctx.attrs().Get<int64_t>("transA", 0) != 0;
  const bool tb = ctx.attrs().Get<int64_t>("transB", 0) != 0;
  const Shape &a = ctx.shape(0), &b = ctx.shape(1);
  const Dim m = a[ta ? 1 : 0], n = b[tb ? 0 : 1];
  ASSIGN_OR_RETURN(Dim k, Agree(ctx, a[ta ? 0 : 1], b[tb ? 1 : 0], "inner dims", 0, 1));
  (void)k;
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, 2));
    RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 2, {m, n}));
  }
  return One(ctx.dtype(0), {m, n});
}

absl::StatusOr<Outputs> LinearRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  if (ctx.rank(1) != 2) return ctx.Error() << "weight " << ctx.Describe(1) << " must be 2-D";
  const bool tb = ctx.attrs().Get<int64_t>("trans_b", 0) != 0;
  const Shape &x = ctx.shape(0), &w = ctx.shape(1);
  const Dim n = w[tb ? 0 : 1];
  ASSIGN_OR_RETURN(Dim k, Agree(ctx, x.back(), w[tb ? 1 : 0], "inner dims", 0, 1));
  (void)k;
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, 2));
    if (ctx.rank(2) > 1) return ctx.Error() << "bias " << ctx.Describe(2) << " must be 1-D";
    RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 2, {n}));
  }
  Shape out(x.begin(), x.end() - 1);
  out.push_back(n);
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> ReduceRule(const InferContext& ctx) {
  if (ctx.dtype(0) == DType::kBool) return ctx.Error() << ctx.Describe(0) << " must be numeric";
  const Shape& in = ctx.shape(0);
  const bool keepdims = ctx.attrs().Get<int64_t>("keepdims", 1) != 0;
  const bool noop_empty = ctx.attrs().Get<int64_t>("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes = ctx.attrs().Get<std::vector<int64_t>>("axes");
  if (axes.empty()) {
    if (noop_empty) return One(ctx.dtype(0), in);
    for (int64_t i = 0; i < ctx.rank(0); ++i) axes.push_back(i);
  }
  ASSIGN_OR_RETURN(axes, ctx.Axes(axes, ctx.rank(0), "axes"));
  Shape out;
  for (int64_t i = 0; i < ctx.rank(0); ++i) {
    if (std::find(axes.begin(), axes.end(), i) == axes.end())
      out.push_back(in[i]);
    else if (keepdims)
      out.push_back(Dim(1));
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> SoftmaxRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.Axis(ctx.attrs().Get<int64_t>("axis", -1), ctx.rank(0), "axis").status());
  return One(ctx.dtype(0), ctx.shape(0));
}

// ONNX stash_type numbers (TensorProto.DataType) for LayerNormalization's Mean/InvStdDev.
absl::StatusOr<DType> StashType(const InferContext& ctx) {
  switch (ctx.attrs().Get<int64_t>("stash_type", 1)) {
    case 1:
      return DType::kF32;
    case 11:
      return DType::kF64;
    case 10:
      return DType::kF16;
    case 16:
      return DType::kBF16;
    default:
      return ctx.Error() << "stash_type " << ctx.attrs().Get<int64_t>("stash_type", 1) << " is not a float type";
  }
}

// A LayerNorm's or RMSNorm's fused residual (input `index`, when present): X's dtype and dims.
absl::Status ExpectResidual(const InferContext& ctx, int index) {
  if (!ctx.has_input(index)) return absl::OkStatus();
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, index));
  const Shape& r = ctx.shape(index);
  const Shape& x = ctx.shape(0);
  bool same = r.size() == x.size();
  for (size_t i = 0; same && i < r.size(); ++i) same = UnifyDims(r[i], x[i]).has_value();
  if (!same) return ctx.Error() << "residual " << ctx.Describe(index) << " is not " << ctx.Describe(0) << "'s shape";
  return absl::OkStatus();
}

absl::StatusOr<Outputs> LayerNormRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  const Shape& x = ctx.shape(0);
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis", -1), ctx.rank(0), "axis"));
  const Shape normalized(x.begin() + axis, x.end());
  RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 1, normalized));
  if (ctx.has_input(2)) {
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, 2));
    RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 2, normalized));
  }
  const bool residual = ctx.has_input(3);
  RETURN_IF_ERROR(ExpectResidual(ctx, 3));
  if (ctx.attrs().Get<double>("dropout", 0.0) != 0.0 && !residual) return ctx.Error() << "dropout without a residual";
  Outputs out = One(ctx.dtype(0), x);
  if (ctx.num_outputs() > 1) {
    // Mean and InvStdDev keep the normalised axes as 1 (ONNX LayerNormalization), in stash_type.
    ASSIGN_OR_RETURN(DType stash, StashType(ctx));
    Shape stats(x.begin(), x.begin() + axis);
    stats.resize(x.size(), Dim(1));
    for (int i = 1; i < std::min(ctx.num_outputs(), 3); ++i) out.push_back({stash, stats});
  }
  if (ctx.num_outputs() > 3) {
    if (!residual) return ctx.Error() << "output 3 (Sum) without a residual";
    out.push_back({ctx.dtype(0), x});
  }
  return out;
}

// Y (X's type), optionally InvStdDev (X's dims with the normalised ones 1, in X's dtype) and, with a
// residual, Sum (X's type).
absl::StatusOr<Outputs> RMSNormRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  const Shape& x = ctx.shape(0);
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis", -1), ctx.rank(0), "axis"));
  RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 1, Shape(x.begin() + axis, x.end())));
  RETURN_IF_ERROR(ExpectResidual(ctx, 2));
  Outputs out = One(ctx.dtype(0), x);
  if (ctx.num_outputs() > 1) {
    Shape stats(x.begin(), x.begin() + axis);
    stats.resize(x.size(), Dim(1));
    out.push_back({ctx.dtype(0), stats});
  }
  if (ctx.num_outputs() > 2) {
    if (!ctx.has_input(2)) return ctx.Error() << "output 2 (Sum) without a residual";
    out.push_back({ctx.dtype(0), x});
  }
  return out;
}

// Rotary and RotaryGrad (op.h): X's type; cos and sin of one shape (..., rotary_dim) whose leading
// dims broadcast to X's.
absl::StatusOr<Outputs> RotaryRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 1));
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, 2));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(1, 1));
  const Shape& x = ctx.shape(0);
  const int64_t rotary_dim = ctx.attrs().Get<int64_t>("rotary_dim", -1);
  const Dim& head = x.back();
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || (head.is_concrete() && rotary_dim > head.value()))
    return ctx.Error() << "rotary_dim " << rotary_dim << " must be even, positive and at most " << ctx.Describe(0)
                       << "'s last dim";
  const int64_t interleaved = ctx.attrs().Get<int64_t>("interleaved", 0);
  if (interleaved != 0 && interleaved != 1) return ctx.Error() << "interleaved must be 0 or 1, not " << interleaved;
  if (ctx.shape(1) != ctx.shape(2))
    return ctx.Error() << ctx.Describe(1) << " and " << ctx.Describe(2) << " must have one shape";
  Shape table_to = x;
  table_to.back() = Dim(rotary_dim);
  const Dim& r = ctx.shape(1).back();
  if (!r.is_concrete() || r.value() != rotary_dim)
    return ctx.Error() << ctx.Describe(1) << "'s last dim must be rotary_dim " << rotary_dim;
  RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 1, table_to));
  return One(ctx.dtype(0), x);
}

// GatedActivation (gate, up) -> Y and GatedActivationGrad (dY, gate, up) -> dGate, dUp (op.h): gate,
// up (and dY) of one float dtype and one shape, no broadcast.
absl::StatusOr<Outputs> GatedActivationRule(const InferContext& ctx) {
  const bool grad = ctx.node().op == OpKind::kGatedActivationGrad;
  const int gate = grad ? 1 : 0, up = gate + 1;
  if (!GatedActOf(ctx.attrs()))
    return ctx.Error() << "attributes " << ctx.attrs().ToString()
                       << " name no gated activation (activation \"silu\", or \"gelu\" with approximate "
                          "\"none\" | \"tanh\")";
  RETURN_IF_ERROR(ctx.ExpectFloat(gate));
  RETURN_IF_ERROR(ctx.ExpectSameDType(gate, up));
  ASSIGN_OR_RETURN(Shape shape, SameShape(ctx, gate, up));
  if (!grad) return One(ctx.dtype(gate), std::move(shape));
  RETURN_IF_ERROR(ctx.ExpectSameDType(0, gate));
  RETURN_IF_ERROR(SameShape(ctx, 0, gate).status());
  Outputs out = One(ctx.dtype(gate), shape);  // dGate, then dUp when the node has it
  if (ctx.num_outputs() > 1) out.push_back({ctx.dtype(up), shape});
  return out;
}

absl::StatusOr<Outputs> SoftmaxCrossEntropyRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectFloat(0));
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  const Shape &scores = ctx.shape(0), &labels = ctx.shape(1);
  if (scores.size() < 2) return ctx.Error() << "scores " << ctx.Describe(0) << " must be (N, C, ...)";
  if (labels.size() + 1 != scores.size()) {
    return ctx.Error() << "labels " << ctx.Describe(1) << " must have rank " << scores.size() - 1 << " to match scores "
                       << ctx.Describe(0);
  }
  // labels are (N, D1, ..., Dk) against scores (N, C, D1, ..., Dk).
  Shape per_item;
  for (size_t i = 0; i < labels.size(); ++i) {
    const Dim& s = scores[i == 0 ? 0 : i + 1];
    std::optional<Dim> d = UnifyDims(s, labels[i]);
    if (!d) {
      return ctx.Error() << "labels " << ctx.Describe(1) << " do not match scores " << ctx.Describe(0)
                         << " (expected (N, D1, ..., Dk) of (N, C, D1, ..., Dk))";
    }
    per_item.push_back(*d);
  }
  // Half scores are read as they are and the loss computes in f32 (op.h): its outputs are f32.
  const DType compute = IsHalf(ctx.dtype(0)) ? DType::kF32 : ctx.dtype(0);
  if (ctx.has_input(2)) {
    if (ctx.dtype(2) != ctx.dtype(0) && ctx.dtype(2) != compute) {
      return ctx.Error() << "weights " << ctx.Describe(2) << " must have the scores' dtype "
                         << DTypeName(ctx.dtype(0)) << (compute != ctx.dtype(0) ? " or f32" : "");
    }
    if (ctx.rank(2) != 1 || !UnifyDims(ctx.shape(2)[0], scores[1]))
      return ctx.Error() << "weights " << ctx.Describe(2) << " must be (C) with C = " << scores[1].ToString();
  }
  const std::string reduction = ctx.attrs().Get<std::string>("reduction", "mean");
  Outputs out;
  if (reduction == "none") {
    out = One(compute, per_item);
  } else if (reduction == "mean" || reduction == "sum") {
    out = One(compute, {});
  } else {
    return ctx.Error() << "reduction must be none, mean or sum, got \"" << reduction << "\"";
  }
  if (ctx.num_outputs() > 1) out.push_back({compute, scores});  // log_prob
  if (ctx.num_outputs() > 2) {  // Stats: (m, s) per position
    Shape stats = per_item;
    stats.push_back(Dim(2));
    out.push_back({compute, stats});
  }
  return out;
}

absl::StatusOr<Outputs> AttentionRule(const InferContext& ctx) {
  for (int i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(ctx.ExpectFloat(i));
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
  }
  ASSIGN_OR_RETURN(const std::vector<Shape> operands, AttentionOperandShapes(ctx, 0));
  const Shape &q = operands[0], &k = operands[1], &v = operands[2];
  const Dim sq = q[q.size() - 2], sk = k[k.size() - 2], dv = v.back();
  ASSIGN_OR_RETURN(Dim dh, Agree(ctx, q.back(), k.back(), "head dims of Q and K", 0, 1));
  (void)dh;
  ASSIGN_OR_RETURN(Dim skv, Agree(ctx, sk, v[v.size() - 2], "key lengths of K and V", 1, 2));
  // Grouped-query attention: K and V with fewer heads than Q (AttentionKvGroup).
  const int64_t group = AttentionKvGroup(q, k, v);
  const Shape qb(q.begin(), q.end() - 2), kb = UngroupedBatch(Shape(k.begin(), k.end() - 2), group),
      vb = UngroupedBatch(Shape(v.begin(), v.end() - 2), group);
  absl::StatusOr<Shape> batch = BroadcastShapes(ctx, {qb, kb, vb});
  if (!batch.ok()) {
    return ctx.Error() << "batch dims of Q, K, V do not broadcast: " << ctx.Describe(0) << ", " << ctx.Describe(1)
                       << ", " << ctx.Describe(2);
  }
  const double dropout = ctx.attrs().Get<double>("dropout", 0.0);
  if (!(dropout >= 0.0 && dropout < 1.0)) return ctx.Error() << "dropout " << dropout << " must be in [0, 1)";
  if (ctx.has_input(3)) {
    const std::string kind = ctx.attrs().Get<std::string>("mask_kind", "additive");
    if (kind == "bool") {
      RETURN_IF_ERROR(ctx.ExpectBool(3));
    } else if (kind == "additive") {
      RETURN_IF_ERROR(ctx.ExpectFloat(3));
    } else {
      return ctx.Error() << "mask_kind must be \"additive\" or \"bool\", got \"" << kind << "\"";
    }
    Shape scores = *batch;
    scores.push_back(sq);
    scores.push_back(skv);
    RETURN_IF_ERROR(ExpectBroadcastsTo(ctx, 3, scores));
  }
  Shape out = *batch;
  out.push_back(sq);
  out.push_back(dv);
  Shape stats = *batch;  // the optional output 1: f32 (..., Sq)
  stats.push_back(sq);
  auto with_stats = [&](Shape o) {
    Outputs r = {{ctx.dtype(0), std::move(o)}};
    if (ctx.num_outputs() > 1) r.push_back({DType::kF32, stats});
    return r;
  };
  if (!HasAttentionView(ctx.node(), 3)) return with_stats(std::move(out));
  // O written in place into an output of dims o_shape, which its view must cover exactly.
  const std::vector<int64_t> o_shape = ctx.attrs().Get<std::vector<int64_t>>("o_shape", {});
  ASSIGN_OR_RETURN(const StridedView o, AttentionOutputView(ctx.node(), o_shape));
  int64_t numel = 1;
  for (int64_t d : o_shape) numel *= d;
  if (!IsConcrete(out) || o.dims != ToInts(out) || !CoversExactly(numel, {o})) {
    return ctx.Error() << "o_view " << ShapeToString(FromInts(o.dims)) << " must be the output " << ShapeToString(out)
                       << " and cover o_shape " << ShapeToString(FromInts(o_shape)) << " exactly";
  }
  return with_stats(FromInts(o_shape));
}

}  // namespace

absl::StatusOr<std::vector<Shape>> AttentionOperandShapes(const InferContext& ctx, int first) {
  std::vector<Shape> out;
  for (int i = 0; i < 3; ++i) {
    if (!HasAttentionView(ctx.node(), i)) {
      RETURN_IF_ERROR(ctx.ExpectRankAtLeast(first + i, 2));
      out.push_back(ctx.shape(first + i));
      continue;
    }
    if (!IsConcrete(ctx.shape(first + i))) {
      return ctx.Error() << AttentionViewAttr(i) << " needs a concrete input shape, got " << ctx.Describe(first + i);
    }
    ASSIGN_OR_RETURN(const StridedView v, AttentionOperandView(ctx.node(), i, ToInts(ctx.shape(first + i))));
    out.push_back(FromInts(v.dims));
  }
  return out;
}

void RegisterNnRules(RuleTable& t) {
  SetRule(t, OpKind::kMatMul, MatMulRule);
  SetRule(t, OpKind::kGemm, GemmRule);
  SetRule(t, OpKind::kLinear, LinearRule);
  for (OpKind op : {OpKind::kReduceMean, OpKind::kReduceSum, OpKind::kReduceMax}) SetRule(t, op, ReduceRule);
  SetRule(t, OpKind::kSoftmax, SoftmaxRule);
  SetRule(t, OpKind::kLogSoftmax, SoftmaxRule);
  SetRule(t, OpKind::kLayerNorm, LayerNormRule);
  SetRule(t, OpKind::kRMSNorm, RMSNormRule);
  SetRule(t, OpKind::kSoftmaxCrossEntropyLoss, SoftmaxCrossEntropyRule);
  SetRule(t, OpKind::kAttention, AttentionRule);
  SetRule(t, OpKind::kRotary, RotaryRule);
  SetRule(t, OpKind::kRotaryGrad, RotaryRule);  // dX like X
  SetRule(t, OpKind::kGatedActivation, GatedActivationRule);
  SetRule(t, OpKind::kGatedActivationGrad, GatedActivationRule);  // dGate, dUp like gate, up
}

}  // namespace onnxpipe::ir::infer_internal
