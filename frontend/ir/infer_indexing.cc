// Shape rules for indexing ops: Slice (ONNX clamping rules, on symbolic dims where the slice
// length is expressible), Gather (the indices' shape replaces the gathered axis), GatherElements
// (the indices' shape), GatherND (the index tuples' shape and the rest of data), CumSum and
// ArgMax.
#include <algorithm>

#include "frontend/ir/infer_rules.h"

namespace onnxpipe::ir::infer_internal {
namespace {

// Exporters write "to the end" as INT64_MAX (or INT32_MAX, or a large sentinel); no real dim comes
// near this.
constexpr int64_t kToEnd = (int64_t{1} << 31) - 1;

// The slice length where some of dim/start/end are symbolic. A symbolic start or end (computed
// from the model's own shapes, e.g. x[:, :S]) is taken to lie within the dim; a concrete end inside
// a symbolic dim is not (min(end, S) is not expressible), nor is any other step than a full
// reversal. Re-inference after binding replaces the assumption by the exact answer.
Dim SymbolicSliceLength(const Dim& dim, const Dim& start, const Dim& end, int64_t step) {
  if (step == -1 && start.is_concrete() && end.is_concrete() &&
      (start.value() == -1 || start.value() >= kToEnd) && end.value() <= -kToEnd) {
    return dim;
  }
  if (step != 1 || start.is_unknown() || end.is_unknown()) return Dim::Unknown();
  Dim s = start, e = end;
  if (start.is_concrete()) {
    int64_t v = start.value();
    if (v < 0) {
      if (!dim.is_concrete()) return Dim::Unknown();
      v = std::max<int64_t>(0, v + dim.value());
    } else if (dim.is_concrete()) {
      v = std::min(v, dim.value());
    }
    s = Dim(v);
  }
  if (end.is_concrete()) {
    int64_t v = end.value();
    if (v >= kToEnd) {
      e = dim;
    } else if (dim.is_concrete()) {
      if (v < 0) v += dim.value();
      e = Dim(std::clamp<int64_t>(v, 0, dim.value()));
    } else {
      return Dim::Unknown();
    }
  }
  Dim len = SubDims(e, s);
  if (len.is_concrete() && len.value() < 0) return Dim(0);
  return len;
}

// A 1-D operand's elements (unknown dims where not derivable), checking its length.
absl::StatusOr<std::vector<Dim>> IndexOperand(const InferContext& ctx, int i, const char* what,
                                              size_t expected_len) {
  RETURN_IF_ERROR(ctx.ExpectInteger(i));
  if (ctx.rank(i) != 1) return ctx.Error() << what << " " << ctx.Describe(i) << " must be 1-D";
  std::optional<KnownData> d = ctx.data(i);
  if (!d) return std::vector<Dim>(expected_len, Dim::Unknown());
  if (expected_len != SIZE_MAX && d->elems.size() != expected_len) {
    return ctx.Error() << what << " has " << d->elems.size() << " entries but starts has "
                       << expected_len;
  }
  return d->elems;
}

absl::StatusOr<Outputs> SliceRule(const InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  const int64_t r = ctx.rank(0);
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  if (ctx.rank(1) != 1 || !ctx.shape(1)[0].is_concrete()) {
    return ctx.Error() << "starts " << ctx.Describe(1) << " must be 1-D with a known length";
  }
  const size_t n = static_cast<size_t>(ctx.shape(1)[0].value());
  ASSIGN_OR_RETURN(std::vector<Dim> starts, IndexOperand(ctx, 1, "starts", n));
  ASSIGN_OR_RETURN(std::vector<Dim> ends, IndexOperand(ctx, 2, "ends", n));
  std::vector<int64_t> axes(n);
  for (size_t k = 0; k < n; ++k) axes[k] = static_cast<int64_t>(k);
  if (ctx.has_input(3)) {
    ASSIGN_OR_RETURN(std::vector<Dim> a, IndexOperand(ctx, 3, "axes", n));
    if (!std::all_of(a.begin(), a.end(), [](const Dim& d) { return d.is_concrete(); })) {
      // Which axes are sliced is only known at run time: every dim may change.
      Shape out;
      for (int64_t i = 0; i < r; ++i) out.push_back(Dim::Unknown());
      return One(ctx.dtype(0), std::move(out));
    }
    ASSIGN_OR_RETURN(axes, ctx.Axes(ToInts(a), r, "axes"));
  } else if (static_cast<int64_t>(n) > r) {
    return ctx.Error() << "starts has " << n << " entries for an input of rank " << r;
  }
  std::vector<Dim> steps(n, Dim(1));
  if (ctx.has_input(4)) {
    ASSIGN_OR_RETURN(steps, IndexOperand(ctx, 4, "steps", n));
  }
  Shape out = in;
  for (size_t k = 0; k < n; ++k) {
    const Dim& d = in[axes[k]];
    if (!steps[k].is_concrete()) {
      out[axes[k]] = Dim::Unknown();
      continue;
    }
    const int64_t step = steps[k].value();
    if (step == 0) return ctx.Error() << "step for axis " << axes[k] << " is 0";
    if (d.is_concrete() && starts[k].is_concrete() && ends[k].is_concrete()) {
      out[axes[k]] = Dim(ClampSliceAxis(d.value(), starts[k].value(), ends[k].value(), step).length);
    } else {
      out[axes[k]] = SymbolicSliceLength(d, starts[k], ends[k], step);
    }
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> GatherRule(const InferContext& ctx) {
  const Shape& data = ctx.shape(0);
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  if (ctx.rank(0) == 0) return ctx.Error() << ctx.Describe(0) << " must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis,
                   ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis"));
  // Constant indices on a concrete axis are checked here rather than failing in a kernel.
  if (data[axis].is_concrete()) {
    if (std::optional<KnownData> idx = ctx.data(1); idx) {
      const int64_t n = data[axis].value();
      for (const Dim& i : idx->elems) {
        if (i.is_concrete() && (i.value() < -n || i.value() >= n)) {
          return ctx.Error() << "index " << i.value() << " is out of range for axis " << axis
                             << " of " << ctx.Describe(0);
        }
      }
    }
  }
  Shape out(data.begin(), data.begin() + axis);
  out.insert(out.end(), ctx.shape(1).begin(), ctx.shape(1).end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> GatherElementsRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  if (ctx.rank(1) != ctx.rank(0)) {
    return ctx.Error() << "indices " << ctx.Describe(1) << " must have the rank of data "
                       << ctx.Describe(0);
  }
  RETURN_IF_ERROR(ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis").status());
  return One(ctx.dtype(0), ctx.shape(1));
}

// GatherND: indices (..., k) picks k leading coordinates (after batch_dims) of data; the output is
// indices' dims without the last, then data's dims after batch_dims + k.
absl::StatusOr<Outputs> GatherNDRule(const InferContext& ctx) {
  RETURN_IF_ERROR(ctx.ExpectInteger(1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(1, 1));
  const int64_t r = ctx.rank(0), q = ctx.rank(1);
  const int64_t b = ctx.attrs().Get<int64_t>("batch_dims", 0);
  if (b < 0 || b >= std::min(r, q)) {
    return ctx.Error() << "batch_dims " << b << " must be in [0, min(rank(data), rank(indices)))";
  }
  const Dim& last = ctx.shape(1)[q - 1];
  if (!last.is_concrete()) {
    return ctx.Error() << "the last dim of indices " << ctx.Describe(1) << " must be known";
  }
  const int64_t k = last.value();
  if (k < 1 || k > r - b) {
    return ctx.Error() << "index tuples of length " << k << " do not fit data " << ctx.Describe(0)
                       << " with batch_dims " << b;
  }
  for (int64_t d = 0; d < b; ++d) {
    if (!UnifyDims(ctx.shape(0)[d], ctx.shape(1)[d])) {
      return ctx.Error() << "batch dim " << d << " differs between " << ctx.Describe(0) << " and "
                         << ctx.Describe(1);
    }
  }
  Shape out(ctx.shape(1).begin(), ctx.shape(1).end() - 1);
  out.insert(out.end(), ctx.shape(0).begin() + b + k, ctx.shape(0).end());
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> CumSumRule(const InferContext& ctx) {
  if (ctx.dtype(0) == DType::kBool) return ctx.Error() << ctx.Describe(0) << " must be numeric";
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  RETURN_IF_ERROR(ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis").status());
  return One(ctx.dtype(0), ctx.shape(0));
}

absl::StatusOr<Outputs> ArgMaxRule(const InferContext& ctx) {
  if (ctx.dtype(0) == DType::kBool) return ctx.Error() << ctx.Describe(0) << " must be numeric";
  RETURN_IF_ERROR(ctx.ExpectRankAtLeast(0, 1));
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis"));
  Shape out = ctx.shape(0);
  if (ctx.attrs().Get<int64_t>("keepdims", 1) != 0) {
    out[axis] = Dim(1);
  } else {
    out.erase(out.begin() + axis);
  }
  return One(DType::kI64, std::move(out));
}

}  // namespace

void RegisterIndexingRules(RuleTable& t) {
  SetRule(t, OpKind::kArgMax, ArgMaxRule);
  SetRule(t, OpKind::kGatherElements, GatherElementsRule);
  SetRule(t, OpKind::kGatherND, GatherNDRule);
  SetRule(t, OpKind::kCumSum, CumSumRule);
  SetRule(t, OpKind::kSlice, SliceRule);
  SetRule(t, OpKind::kGather, GatherRule);
}

}  // namespace onnxpipe::ir::infer_internal
