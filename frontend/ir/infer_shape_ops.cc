// Shape rules for ops that move or create shapes: Reshape, Flatten, Squeeze, Unsqueeze, Transpose,
// Concat, Split, Shape, Expand, ConstantOfShape, Constant, Range.
//
// Shape operands (Reshape's shape, Expand's shape, ...) are read through ComputeKnownData, so the
// exporters' Shape -> Gather -> Concat arithmetic yields symbolic dims; an element that cannot be
// derived becomes an unknown dim, and only an operand whose length is unknown leaves the output
// rank undetermined (an error: the IR has no unknown ranks).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "frontend/ir/infer_rules.h"

namespace onnxpipe::ir::infer_internal {
namespace {

// The elements of a 1-D integer shape operand, unknown dims where they are not derivable.
absl::StatusOr<std::vector<Dim>> ShapeOperand(const InferContext& ctx, int i) {
  RETURN_IF_ERROR(ctx.ExpectInteger(i));
  if (ctx.rank(i) != 1) return ctx.Error() << ctx.Describe(i) << " must be 1-D";
  std::optional<KnownData> d = ctx.data(i);
  if (!d) {
    return ctx.Error() << ctx.Describe(i)
                       << " has a length that is not known before run time, so the output rank "
                          "cannot be inferred";
  }
  return d->elems;
}

absl::StatusOr<Outputs> ReshapeRule(const InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  ASSIGN_OR_RETURN(std::vector<Dim> target, ShapeOperand(ctx, 1));
  const bool allowzero = ctx.attrs().Get<int64_t>("allowzero", 0) != 0;
  Shape out;
  int infer_at = -1;
  bool has_zero = false;
  for (size_t i = 0; i < target.size(); ++i) {
    const Dim& e = target[i];
    if (!e.is_concrete()) {
      out.push_back(e);  // a named symbol is a dim (>= 1); an unknown element an unknown dim
      continue;
    }
    const int64_t v = e.value();
    if (v == -1) {
      if (infer_at >= 0) return ctx.Error() << "shape has more than one -1";
      infer_at = static_cast<int>(i);
      out.push_back(Dim(1));
    } else if (v == 0 && !allowzero) {
      if (i >= in.size()) {
        return ctx.Error() << "shape entry " << i << " is 0 (copy the input dim) but the input "
                           << ShapeToString(in) << " has rank " << in.size();
      }
      out.push_back(in[i]);
    } else if (v < 0) {
      return ctx.Error() << "shape entry " << i << " is " << v << "; entries must be >= -1";
    } else {
      has_zero |= v == 0;
      out.push_back(e);
    }
  }
  const Dim total = NumElements(in);
  if (infer_at >= 0) {
    if (has_zero) return ctx.Error() << "shape has both -1 and 0 with allowzero=1";
    const Dim known = NumElements(out);
    if (total.is_concrete() && known.is_concrete()) {
      if (known.value() == 0 || total.value() % known.value() != 0) {
        return ctx.Error() << "cannot reshape " << ShapeToString(in) << " (" << total.value()
                           << " elements) into " << ShapeToString(out) << " with -1 at "
                           << infer_at;
      }
      out[infer_at] = Dim(total.value() / known.value());
    } else {
      std::optional<Dim> q = total.DivExact(known);
      out[infer_at] = q ? *q : Dim::Unknown();
    }
  } else {
    // Same symbols (unknown ones included: one name is one dim) with different factors, or two
    // different concrete counts, cannot hold the same number of elements.
    const Dim count = NumElements(out);
    if (count.symbols() == total.symbols() && count.factor() != total.factor()) {
      return ctx.Error() << "cannot reshape " << ShapeToString(in) << " (" << total.ToString()
                         << " elements) into " << ShapeToString(out) << " (" << count.ToString()
                         << " elements)";
    }
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> FlattenRule(const InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  // Flatten's axis lies in [-r, r] and a negative one counts from r (not r + 1 as an
  // insertion position would).
  int64_t axis = ctx.attrs().Get<int64_t>("axis", 1);
  if (axis == ctx.rank(0)) {
    // axis == r: everything goes to the outer dim.
  } else {
    ASSIGN_OR_RETURN(axis, ctx.Axis(axis, ctx.rank(0), "axis"));
  }
  Dim outer(1), inner(1);
  for (int64_t i = 0; i < ctx.rank(0); ++i) {
    Dim& side = i < axis ? outer : inner;
    side = side * in[i];
  }
  return One(ctx.dtype(0), {outer, inner});
}

absl::StatusOr<Outputs> SqueezeRule(const InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  Shape out;
  if (!ctx.attrs().Has("axes") || ctx.attrs().Get<std::vector<int64_t>>("axes").empty()) {
    // Without axes every dim of 1 goes; a symbolic dim is taken to be > 1 (exporters always give
    // axes when a symbolic dim is squeezed).
    for (const Dim& d : in)
      if (!IsOne(d)) out.push_back(d);
    return One(ctx.dtype(0), std::move(out));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> axes,
                   ctx.Axes(ctx.attrs().Get<std::vector<int64_t>>("axes"), ctx.rank(0), "axes"));
  for (int64_t i = 0; i < ctx.rank(0); ++i) {
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) {
      out.push_back(in[i]);
    } else if (in[i].is_concrete() && in[i].value() != 1) {
      return ctx.Error() << "cannot squeeze axis " << i << " of " << ShapeToString(in)
                         << ": its size is " << in[i].value() << ", not 1";
    }
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> UnsqueezeRule(const InferContext& ctx) {
  if (!ctx.attrs().Has("axes")) return ctx.Error() << "attribute 'axes' is missing";
  const std::vector<int64_t> raw = ctx.attrs().Get<std::vector<int64_t>>("axes");
  const int64_t out_rank = ctx.rank(0) + static_cast<int64_t>(raw.size());
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.Axes(raw, out_rank, "axes"));
  Shape out;
  size_t next = 0;
  for (int64_t i = 0; i < out_rank; ++i) {
    if (std::find(axes.begin(), axes.end(), i) != axes.end())
      out.push_back(Dim(1));
    else
      out.push_back(ctx.shape(0)[next++]);
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> TransposeRule(const InferContext& ctx) {
  const int64_t r = ctx.rank(0);
  std::vector<int64_t> perm(r);
  std::iota(perm.rbegin(), perm.rend(), 0);
  if (ctx.attrs().Has("perm")) perm = ctx.attrs().Get<std::vector<int64_t>>("perm");
  std::vector<bool> seen(r, false);
  bool ok = static_cast<int64_t>(perm.size()) == r;
  for (int64_t p : perm) {
    if (!ok || p < 0 || p >= r || seen[p])
      ok = false;
    else
      seen[p] = true;
  }
  if (!ok) {
    StatusBuilder b = ctx.Error();
    b << "perm [";
    for (size_t i = 0; i < perm.size(); ++i) b << (i ? "," : "") << perm[i];
    b << "] is not a permutation of the " << r << " axes of " << ShapeToString(ctx.shape(0));
    return b;
  }
  Shape out;
  for (int64_t p : perm) out.push_back(ctx.shape(0)[p]);
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> ConcatRule(const InferContext& ctx) {
  if (!ctx.attrs().Has("axis")) return ctx.Error() << "attribute 'axis' is missing";
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error() << "input " << i << " is absent";
    if (ctx.rank(i) != ctx.rank(0)) {
      return ctx.Error() << "inputs must have the same rank: " << ctx.Describe(0) << " vs "
                         << ctx.Describe(i);
    }
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
  }
  if (ctx.rank(0) == 0) return ctx.Error() << "cannot concatenate scalars";
  ASSIGN_OR_RETURN(int64_t axis, ctx.Axis(ctx.attrs().Get<int64_t>("axis"), ctx.rank(0), "axis"));
  Shape out = ctx.shape(0);
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    for (int64_t k = 0; k < ctx.rank(0); ++k) {
      if (k == axis) {
        out[k] = AddDims(out[k], ctx.shape(i)[k]);
        continue;
      }
      std::optional<Dim> d = UnifyDims(out[k], ctx.shape(i)[k]);
      if (!d) {
        return ctx.Error() << "dim " << k << " differs outside the concat axis " << axis << ": "
                           << ctx.Describe(0) << " vs " << ctx.Describe(i);
      }
      out[k] = *d;
    }
  }
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> SplitRule(const InferContext& ctx) {
  const Shape& in = ctx.shape(0);
  const int64_t n = ctx.num_outputs();
  ASSIGN_OR_RETURN(int64_t axis,
                   ctx.Axis(ctx.attrs().Get<int64_t>("axis", 0), ctx.rank(0), "axis"));
  const Dim d = in[axis];
  std::vector<Dim> sizes;
  const std::vector<int64_t> split = ctx.attrs().Get<std::vector<int64_t>>("split");
  if (!split.empty()) {
    if (static_cast<int64_t>(split.size()) != n) {
      return ctx.Error() << "split has " << split.size() << " sizes for " << n << " outputs";
    }
    int64_t sum = 0;
    for (int64_t s : split) {
      if (s < 0) return ctx.Error() << "split sizes must be >= 0, got " << s;
      sum += s;
      sizes.push_back(Dim(s));
    }
    if (d.is_concrete() && sum != d.value()) {
      return ctx.Error() << "split sizes sum to " << sum << " but axis " << axis << " of "
                         << ShapeToString(in) << " is " << d.value();
    }
  } else {
    const bool ceil_chunks = ctx.attrs().Has("num_outputs");  // opset 18: last chunk may be smaller
    if (ceil_chunks && ctx.attrs().Get<int64_t>("num_outputs") != n) {
      return ctx.Error() << "num_outputs is " << ctx.attrs().Get<int64_t>("num_outputs")
                         << " but the node has " << n << " outputs";
    }
    if (d.is_concrete()) {
      const int64_t v = d.value();
      if (!ceil_chunks && v % n != 0) {
        return ctx.Error() << "axis " << axis << " of " << ShapeToString(in) << " (" << v
                           << ") does not split evenly into " << n << " outputs";
      }
      const int64_t chunk = (v + n - 1) / n, last = v - chunk * (n - 1);
      if (last < 0) {
        return ctx.Error() << "axis " << axis << " of " << ShapeToString(in) << " (" << v
                           << ") is too small for " << n << " outputs of " << chunk;
      }
      sizes.assign(n, Dim(chunk));
      sizes.back() = Dim(last);
    } else {
      std::optional<Dim> q = d.DivExact(Dim(n));
      for (int64_t i = 0; i < n; ++i) sizes.push_back(q ? *q : Dim::Unknown());
    }
  }
  Outputs out;
  for (const Dim& s : sizes) {
    Shape o = in;
    o[axis] = s;
    out.push_back({ctx.dtype(0), std::move(o)});
  }
  return out;
}

absl::StatusOr<Outputs> ShapeRule(const InferContext& ctx) {
  const int64_t r = ctx.rank(0);
  auto clamp = [r](int64_t a) { return std::clamp(a < 0 ? a + r : a, int64_t{0}, r); };
  const int64_t start = clamp(ctx.attrs().Get<int64_t>("start", 0));
  const int64_t end = clamp(ctx.attrs().Get<int64_t>("end", r));
  return One(DType::kI64, {Dim(std::max<int64_t>(0, end - start))});
}

absl::StatusOr<Outputs> ExpandRule(const InferContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<Dim> target, ShapeOperand(ctx, 1));
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i].is_concrete() && target[i].value() < 0)
      return ctx.Error() << "shape entry " << i << " is " << target[i].value() << "; must be >= 0";
  }
  ASSIGN_OR_RETURN(Shape out, BroadcastShapes(ctx, {ctx.shape(0), target}));
  return One(ctx.dtype(0), std::move(out));
}

absl::StatusOr<Outputs> ConstantOfShapeRule(const InferContext& ctx) {
  ASSIGN_OR_RETURN(std::vector<Dim> target, ShapeOperand(ctx, 0));
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i].is_concrete() && target[i].value() < 0)
      return ctx.Error() << "shape entry " << i << " is " << target[i].value() << "; must be >= 0";
  }
  DType dtype = DType::kF32;
  if (ctx.attrs().Has("value")) {
    const Tensor v = ctx.attrs().Get<Tensor>("value");
    if (!v.defined() || v.num_elements() != 1)
      return ctx.Error() << "attribute 'value' must be a one-element tensor";
    dtype = v.dtype();
  }
  return One(dtype, std::move(target));
}

absl::StatusOr<Outputs> ConstantRule(const InferContext& ctx) {
  std::optional<Tensor> t = ConstantNodeTensor(ctx.node());
  if (!t) {
    return ctx.Error() << "has no tensor attribute (value, value_int(s), value_float(s)); attrs: "
                       << ctx.attrs().ToString();
  }
  return One(t->dtype(), FromInts(t->dims()));
}

absl::StatusOr<Outputs> RangeRule(const InferContext& ctx) {
  for (int i = 0; i < 3; ++i) {
    if (!(ctx.rank(i) == 0 || (ctx.rank(i) == 1 && IsOne(ctx.shape(i)[0]))))
      return ctx.Error() << ctx.Describe(i) << " must be a scalar";
    RETURN_IF_ERROR(ctx.ExpectSameDType(0, i));
  }
  const DType t = ctx.dtype(0);
  if (t == DType::kBool) return ctx.Error() << "start, limit and delta must be numeric";
  // Float ranges: only from constants.
  const std::optional<Tensor> c[3] = {ConstantTensor(ctx.graph(), ctx.node().inputs[0]),
                                      ConstantTensor(ctx.graph(), ctx.node().inputs[1]),
                                      ConstantTensor(ctx.graph(), ctx.node().inputs[2])};
  if (IsFloat(t)) {
    if (!c[0] || !c[1] || !c[2]) return One(t, {Dim::Unknown()});
    const double start = c[0]->GetAsDouble(0), limit = c[1]->GetAsDouble(0),
                 delta = c[2]->GetAsDouble(0);
    if (delta == 0) return ctx.Error() << "delta is 0";
    const double n = std::ceil((limit - start) / delta);
    return One(t, {Dim(n > 0 ? static_cast<int64_t>(n) : 0)});
  }
  std::optional<KnownData> s = ctx.data(0), l = ctx.data(1), d = ctx.data(2);
  if (!s || !l || !d || s->elems.size() != 1 || l->elems.size() != 1 || d->elems.size() != 1)
    return One(t, {Dim::Unknown()});
  const Dim start = s->elems[0], limit = l->elems[0], delta = d->elems[0];
  if (!delta.is_concrete()) return One(t, {Dim::Unknown()});
  const int64_t step = delta.value();
  if (step == 0) return ctx.Error() << "delta is 0";
  // Length ceil((limit - start) / delta), clamped at 0. The span may be symbolic (arange(S)); it is
  // exact when the step divides it.
  const Dim span = step > 0 ? SubDims(limit, start) : SubDims(start, limit);
  const int64_t abs_step = step > 0 ? step : -step;
  if (span.is_concrete()) {
    const int64_t v = span.value();
    return One(t, {Dim(v <= 0 ? 0 : (v + abs_step - 1) / abs_step)});
  }
  std::optional<Dim> n = span.is_unknown() ? std::nullopt : span.DivExact(Dim(abs_step));
  return One(t, {n ? *n : Dim::Unknown()});
}

}  // namespace

void RegisterShapeOpRules(RuleTable& t) {
  SetRule(t, OpKind::kReshape, ReshapeRule);
  SetRule(t, OpKind::kFlatten, FlattenRule);
  SetRule(t, OpKind::kSqueeze, SqueezeRule);
  SetRule(t, OpKind::kUnsqueeze, UnsqueezeRule);
  SetRule(t, OpKind::kTranspose, TransposeRule);
  SetRule(t, OpKind::kConcat, ConcatRule);
  SetRule(t, OpKind::kSplit, SplitRule);
  SetRule(t, OpKind::kShape, ShapeRule);
  SetRule(t, OpKind::kExpand, ExpandRule);
  SetRule(t, OpKind::kConstantOfShape, ConstantOfShapeRule);
  SetRule(t, OpKind::kConstant, ConstantRule);
  SetRule(t, OpKind::kRange, RangeRule);
}

}  // namespace onnxpipe::ir::infer_internal
