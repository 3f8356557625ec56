// Dim algebra shared by the shape rules, and the compile-time data of small integer tensors.
//
// Exporters compute Reshape/Expand/Slice operands from the model's own shape
// (Shape -> Gather -> Unsqueeze -> Concat, with Mul/Div/Sub of dims in between). Following those
// chains symbolically here is what lets Reshape(x, Concat(B, S, 16, 64)) come out as (B, S, 16, 64)
// before B and S are bound, instead of four unknown dims.
#include <algorithm>
#include <functional>
#include <unordered_map>

#include "frontend/ir/infer.h"
#include "frontend/ir/infer_rules.h"

namespace onnxpipe::ir::infer_internal {

int Specificity(const Dim& d) {
  if (d.is_concrete()) return 2;
  return d.is_unknown() ? 0 : 1;
}

std::optional<Dim> UnifyDims(const Dim& a, const Dim& b) {
  if (a == b) return a;
  if (a.is_concrete() && b.is_concrete()) return std::nullopt;
  return Specificity(b) > Specificity(a) ? b : a;
}

std::optional<Dim> BroadcastDims(const Dim& a, const Dim& b) {
  if (a == b) return a;
  if (IsOne(a)) return b;
  if (IsOne(b)) return a;
  if (a.is_concrete() && b.is_concrete()) return std::nullopt;
  // A concrete dim (> 1, or 0) against a symbol: the symbol must be 1 or that dim at run time.
  if (a.is_concrete()) return a;
  if (b.is_concrete()) return b;
  // A named symbol against an unknown: the result is the named one unless it is 1 at run time;
  // re-inference after binding makes it exact.
  const int sa = Specificity(a), sb = Specificity(b);
  if (sa != sb) return sa > sb ? a : b;
  return Dim::Unknown();
}

namespace {

// factor * symbols with an explicit factor, or an unknown when the factor is not positive.
Dim WithFactor(int64_t factor, const std::vector<std::string>& symbols) {
  if (symbols.empty()) return Dim(factor);
  if (factor == 0) return Dim(0);
  if (factor < 0) return Dim::Unknown();
  Dim d(factor);
  for (const std::string& s : symbols) d = d * Dim::Symbol(s);
  return d;
}

Dim Combine(const Dim& a, const Dim& b, int64_t sign) {
  if (b.is_concrete() && b.value() == 0) return a;
  if (a.is_concrete() && a.value() == 0 && sign > 0) return b;
  if (a.symbols() != b.symbols() || a.is_unknown()) return Dim::Unknown();
  return WithFactor(a.factor() + sign * b.factor(), a.symbols());
}

}  // namespace

Dim AddDims(const Dim& a, const Dim& b) { return Combine(a, b, +1); }
Dim SubDims(const Dim& a, const Dim& b) { return Combine(a, b, -1); }

// ---------------------------------------------------------------------------------------------

bool KnownData::AllConcrete() const {
  return std::all_of(elems.begin(), elems.end(), [](const Dim& d) { return d.is_concrete(); });
}

std::vector<int64_t> KnownData::Ints() const { return ToInts(elems); }

std::optional<Tensor> ConstantNodeTensor(const Node& n) {
  if (n.op != OpKind::kConstant) return std::nullopt;
  const Attrs& a = n.attrs;
  if (a.Has("value")) {
    Tensor t = a.Get<Tensor>("value");
    if (t.defined()) return t;
    return std::nullopt;
  }
  if (a.Has("value_int")) return Tensor::Scalar<int64_t>(a.Get<int64_t>("value_int"));
  if (a.Has("value_float")) return Tensor::Scalar<float>(a.Get<float>("value_float"));
  if (a.Has("value_ints")) {
    std::vector<int64_t> v = a.Get<std::vector<int64_t>>("value_ints");
    return Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v);
  }
  if (a.Has("value_floats")) {
    std::vector<double> v = a.Get<std::vector<double>>("value_floats");
    std::vector<float> f(v.begin(), v.end());
    return Tensor::FromVector<float>({static_cast<int64_t>(f.size())}, f);
  }
  return std::nullopt;
}

std::optional<Tensor> ConstantTensor(const Graph& g, ValueId v) {
  if (v == kNoValue) return std::nullopt;
  const Value& val = g.value(v);
  if (val.constant && val.constant->defined()) return *val.constant;
  if (val.producer == kNoNode || g.node(val.producer).removed) return std::nullopt;
  return ConstantNodeTensor(g.node(val.producer));
}

namespace {

bool IsTrackedDType(DType t) { return IsInteger(t) || t == DType::kBool; }

KnownData FromTensor(const Tensor& t) {
  KnownData d;
  d.dims = t.dims();
  for (int64_t i = 0; i < t.num_elements(); ++i) d.elems.push_back(Dim(t.GetAsInt(i)));
  return d;
}

// Element i of a broadcast operand that is either a scalar or has n elements.
const Dim& ElemAt(const KnownData& d, size_t i) {
  return d.elems.size() == 1 ? d.elems[0] : d.elems[i];
}

bool IsPositiveSymbolic(const Dim& d) {
  return !d.is_concrete() && !d.is_unknown() && d.factor() > 0;
}

class KnownDataBuilder {
 public:
  explicit KnownDataBuilder(const Graph& g) : g_(g) {}

  std::optional<KnownData> Get(ValueId v, int depth) {
    if (v == kNoValue) return std::nullopt;
    auto it = memo_.find(v);
    if (it != memo_.end()) return it->second;
    std::optional<KnownData> r = Compute(v, depth);
    memo_[v] = r;
    return r;
  }

 private:
  // Only the shape is known: a tensor of unknown elements.
  std::optional<KnownData> ShapeOnly(const Value& val) {
    if (!val.shape_known || !IsConcrete(val.shape) || !IsTrackedDType(val.dtype))
      return std::nullopt;
    std::vector<int64_t> dims = ToInts(val.shape);
    const Dim n = NumElements(val.shape);
    if (n.value() > kMaxKnownElements) return std::nullopt;
    KnownData d;
    d.dims = dims;
    for (int64_t i = 0; i < n.value(); ++i) d.elems.push_back(Dim::Unknown());
    return d;
  }

  std::optional<KnownData> Compute(ValueId v, int depth) {
    const Value& val = g_.value(v);
    if (val.constant) {
      if (!IsTrackedDType(val.constant->dtype()) ||
          val.constant->num_elements() > kMaxKnownElements)
        return std::nullopt;
      return FromTensor(*val.constant);
    }
    if (val.producer == kNoNode || depth > kMaxDepth) return ShapeOnly(val);
    const Node& p = g_.node(val.producer);
    if (p.removed) return ShapeOnly(val);
    std::optional<KnownData> r = FromProducer(val, p, depth + 1);
    if (!r) return ShapeOnly(val);
    return r;
  }

  std::optional<KnownData> In(const Node& p, int i, int depth) {
    if (i >= static_cast<int>(p.inputs.size())) return std::nullopt;
    return Get(p.inputs[i], depth);
  }

  // The output takes the (concrete) shape the rule inferred for it; elements as given.
  std::optional<KnownData> Shaped(const Value& out, std::vector<Dim> elems) {
    if (!out.shape_known || !IsConcrete(out.shape)) return std::nullopt;
    if (NumElements(out.shape).value() != static_cast<int64_t>(elems.size())) return std::nullopt;
    KnownData d;
    d.dims = ToInts(out.shape);
    d.elems = std::move(elems);
    return d;
  }

  std::optional<KnownData> FromProducer(const Value& out, const Node& p, int depth) {
    switch (p.op) {
      case OpKind::kConstant: {
        std::optional<Tensor> t = ConstantNodeTensor(p);
        if (!t || !IsTrackedDType(t->dtype()) || t->num_elements() > kMaxKnownElements)
          return std::nullopt;
        return FromTensor(*t);
      }
      case OpKind::kShape: {
        const Value& x = g_.value(p.inputs[0]);
        if (!x.shape_known) return std::nullopt;
        const int64_t r = static_cast<int64_t>(x.shape.size());
        auto clamp = [r](int64_t a) { return std::clamp(a < 0 ? a + r : a, int64_t{0}, r); };
        const int64_t start = clamp(p.attrs.Get<int64_t>("start", 0));
        const int64_t end = clamp(p.attrs.Get<int64_t>("end", r));
        std::vector<Dim> elems;
        for (int64_t i = start; i < end; ++i) elems.push_back(x.shape[i]);
        return Shaped(out, std::move(elems));
      }
      case OpKind::kIdentity:
      case OpKind::kSqueeze:
      case OpKind::kUnsqueeze:
      case OpKind::kReshape:
      case OpKind::kFlatten: {
        std::optional<KnownData> x = In(p, 0, depth);
        if (!x) return std::nullopt;
        return Shaped(out, x->elems);
      }
      case OpKind::kCast: {
        std::optional<KnownData> x = In(p, 0, depth);
        if (!x || !IsTrackedDType(out.dtype)) return std::nullopt;
        if (out.dtype == DType::kBool) {
          // A named symbol is a dim (>= 1), so it casts to true.
          for (Dim& e : x->elems) {
            if (e.is_concrete()) {
              e = Dim(e.value() != 0 ? 1 : 0);
            } else {
              e = IsPositiveSymbolic(e) ? Dim(1) : Dim::Unknown();
            }
          }
        }
        return Shaped(out, x->elems);
      }
      case OpKind::kGather: {
        std::optional<KnownData> x = In(p, 0, depth), idx = In(p, 1, depth);
        if (!x || !idx || x->dims.size() != 1 || !idx->AllConcrete()) return std::nullopt;
        const int64_t n = x->dims[0];
        std::vector<Dim> elems;
        for (int64_t i : idx->Ints()) {
          if (i < 0) i += n;
          if (i < 0 || i >= n) return std::nullopt;
          elems.push_back(x->elems[i]);
        }
        return Shaped(out, std::move(elems));
      }
      case OpKind::kConcat: {
        // Any rank, along `axis`: per index of the dims before the axis, each input's block of
        // (its extent on the axis) x (the dims after it) in turn. Tile's lowering interleaves a
        // shape with ones this way ((n, 1) operands on axis 1).
        std::vector<KnownData> xs;
        for (int i = 0; i < static_cast<int>(p.inputs.size()); ++i) {
          std::optional<KnownData> x = In(p, i, depth);
          if (!x || x->dims.empty() || x->dims.size() != In(p, 0, depth)->dims.size()) return std::nullopt;
          xs.push_back(*std::move(x));
        }
        if (xs.empty()) return std::nullopt;
        const int64_t rank = static_cast<int64_t>(xs[0].dims.size());
        int64_t axis = p.attrs.Get<int64_t>("axis", 0);
        if (axis < 0) axis += rank;
        if (axis < 0 || axis >= rank) return std::nullopt;
        int64_t outer = 1, inner = 1;
        for (int64_t d = 0; d < rank; ++d) {
          for (const KnownData& x : xs)
            if (d != axis && x.dims[d] != xs[0].dims[d]) return std::nullopt;
          if (d < axis) outer *= xs[0].dims[d];
          if (d > axis) inner *= xs[0].dims[d];
        }
        std::vector<Dim> elems;
        for (int64_t o = 0; o < outer; ++o) {
          for (const KnownData& x : xs) {
            const int64_t block = x.dims[axis] * inner;
            elems.insert(elems.end(), x.elems.begin() + o * block, x.elems.begin() + (o + 1) * block);
          }
        }
        return Shaped(out, std::move(elems));
      }
      case OpKind::kSlice:
        return SliceData(out, p, depth);
      case OpKind::kTranspose:
        return TransposeData(out, p, depth);
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kDiv:
      case OpKind::kMod:
      case OpKind::kMax:
      case OpKind::kMin:
      case OpKind::kEqual:
        return Binary(out, p, depth);
      case OpKind::kWhere: {
        std::optional<KnownData> c = In(p, 0, depth), x = In(p, 1, depth), y = In(p, 2, depth);
        if (!c || !x || !y || !c->AllConcrete()) return std::nullopt;
        const size_t n = std::max({c->elems.size(), x->elems.size(), y->elems.size()});
        for (const KnownData* d : {&*c, &*x, &*y})
          if (d->elems.size() != 1 && d->elems.size() != n) return std::nullopt;
        std::vector<Dim> elems;
        for (size_t i = 0; i < n; ++i)
          elems.push_back(ElemAt(*c, i).value() != 0 ? ElemAt(*x, i) : ElemAt(*y, i));
        return Shaped(out, std::move(elems));
      }
      case OpKind::kConstantOfShape: {
        if (!out.shape_known || !IsConcrete(out.shape)) return std::nullopt;
        Tensor value = p.attrs.Get<Tensor>("value");
        const int64_t fill = value.defined() && value.num_elements() == 1 ? value.GetAsInt(0) : 0;
        const int64_t n = NumElements(out.shape).value();
        if (n > kMaxKnownElements) return std::nullopt;
        return Shaped(out, std::vector<Dim>(n, Dim(fill)));
      }
      default:
        return std::nullopt;
    }
  }

  std::optional<KnownData> Binary(const Value& out, const Node& p, int depth) {
    std::optional<KnownData> a = In(p, 0, depth), b = In(p, 1, depth);
    if (!a || !b) return std::nullopt;
    const size_t n = std::max(a->elems.size(), b->elems.size());
    if ((a->elems.size() != 1 && a->elems.size() != n) ||
        (b->elems.size() != 1 && b->elems.size() != n))
      return std::nullopt;
    std::vector<Dim> elems;
    for (size_t i = 0; i < n; ++i) {
      const Dim &x = ElemAt(*a, i), &y = ElemAt(*b, i);
      const bool concrete = x.is_concrete() && y.is_concrete();
      switch (p.op) {
        case OpKind::kAdd:
          elems.push_back(AddDims(x, y));
          break;
        case OpKind::kSub:
          elems.push_back(SubDims(x, y));
          break;
        case OpKind::kMul:
          elems.push_back(x.is_unknown() || y.is_unknown() ? Dim::Unknown() : x * y);
          break;
        case OpKind::kDiv:
          if (concrete) {
            elems.push_back(y.value() == 0 ? Dim::Unknown() : Dim(x.value() / y.value()));
          } else {
            std::optional<Dim> q = x.is_unknown() ? std::nullopt : x.DivExact(y);
            elems.push_back(q ? *q : Dim::Unknown());
          }
          break;
        case OpKind::kMod:
          // Only concrete operands (PyTorch 2's unflatten computes a Slice end as (-1 + rank) % rank).
          if (!concrete || y.value() == 0) {
            elems.push_back(Dim::Unknown());
          } else if (p.attrs.Get<int64_t>("fmod", 0) != 0) {
            elems.push_back(Dim(x.value() % y.value()));
          } else {
            const int64_t r = x.value() % y.value();
            elems.push_back(Dim(r != 0 && (r < 0) != (y.value() < 0) ? r + y.value() : r));
          }
          break;
        case OpKind::kMax:
        case OpKind::kMin: {
          // Concrete operands, equal ones, or a named symbol (a dim, >= 1) against a constant <= 1
          // (MPT's ALiBi slices from max(0, 1 - S)).
          const bool is_max = p.op == OpKind::kMax;
          if (concrete) {
            elems.push_back(Dim(is_max ? std::max(x.value(), y.value()) : std::min(x.value(), y.value())));
          } else if (x == y && !x.is_unknown()) {
            elems.push_back(x);
          } else if (IsPositiveSymbolic(x) && y.is_concrete() && y.value() <= 1) {
            elems.push_back(is_max ? x : y);
          } else if (IsPositiveSymbolic(y) && x.is_concrete() && x.value() <= 1) {
            elems.push_back(is_max ? y : x);
          } else {
            elems.push_back(Dim::Unknown());
          }
          break;
        }
        case OpKind::kEqual:
          // Symbols stand for dims (>= 1), so a named symbol never equals 0 or the -1 sentinel.
          if (x == y && !x.is_unknown()) {
            elems.push_back(Dim(1));
          } else if (concrete || (IsPositiveSymbolic(x) && y.is_concrete() && y.value() <= 0) ||
                     (IsPositiveSymbolic(y) && x.is_concrete() && x.value() <= 0)) {
            elems.push_back(Dim(0));
          } else {
            elems.push_back(Dim::Unknown());
          }
          break;
        default:
          return std::nullopt;
      }
      if (!elems.back().is_concrete() && elems.back().factor() < 0) elems.back() = Dim::Unknown();
    }
    return Shaped(out, std::move(elems));
  }

  // Any rank, any axes (ONNX's clamping, negative steps included): the kept indices per axis, then
  // the elements at their row-major combinations.
  std::optional<KnownData> SliceData(const Value& out, const Node& p, int depth) {
    std::optional<KnownData> x = In(p, 0, depth), starts = In(p, 1, depth), ends = In(p, 2, depth);
    if (!x || x->dims.empty() || !starts || !ends || !starts->AllConcrete() || !ends->AllConcrete() ||
        starts->elems.size() != ends->elems.size())
      return std::nullopt;
    const int64_t rank = static_cast<int64_t>(x->dims.size());
    const size_t n_axes = starts->elems.size();
    std::vector<int64_t> axes(n_axes), steps(n_axes, 1);
    for (size_t i = 0; i < n_axes; ++i) axes[i] = static_cast<int64_t>(i);
    auto optional_ints = [&](int input, std::vector<int64_t>& to) {
      if (static_cast<int>(p.inputs.size()) <= input || p.inputs[input] == kNoValue) return true;
      std::optional<KnownData> d = In(p, input, depth);
      if (!d || !d->AllConcrete() || d->elems.size() != n_axes) return false;
      to = d->Ints();
      return true;
    };
    if (!optional_ints(3, axes) || !optional_ints(4, steps)) return std::nullopt;
    std::vector<std::vector<int64_t>> kept(rank);
    for (int64_t d = 0; d < rank; ++d) {
      for (int64_t i = 0; i < x->dims[d]; ++i) kept[d].push_back(i);
    }
    for (size_t i = 0; i < n_axes; ++i) {
      const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
      if (axis < 0 || axis >= rank || steps[i] == 0) return std::nullopt;
      const int64_t n = x->dims[axis], step = steps[i];
      int64_t s = starts->elems[i].value(), e = ends->elems[i].value();
      if (s < 0) s += n;
      if (e < 0) e += n;
      kept[axis].clear();
      if (step > 0) {
        s = std::clamp<int64_t>(s, 0, n);
        e = std::clamp<int64_t>(e, 0, n);
        for (int64_t k = s; k < e; k += step) kept[axis].push_back(k);
      } else {
        s = std::clamp<int64_t>(s, 0, n - 1);
        e = std::clamp<int64_t>(e, -1, n - 1);
        for (int64_t k = s; k > e; k += step) kept[axis].push_back(k);
      }
    }
    return Shaped(out, Gathered(*x, kept));
  }

  // Elements of `x` at every combination of the per-axis indices, in row-major order of the result.
  static std::vector<Dim> Gathered(const KnownData& x, const std::vector<std::vector<int64_t>>& index) {
    const int64_t rank = static_cast<int64_t>(x.dims.size());
    std::vector<int64_t> stride(rank, 1);
    for (int64_t d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * x.dims[d + 1];
    std::vector<Dim> elems;
    std::vector<size_t> at(rank, 0);
    if (std::any_of(index.begin(), index.end(), [](const auto& v) { return v.empty(); })) return elems;
    while (true) {
      int64_t flat = 0;
      for (int64_t d = 0; d < rank; ++d) flat += index[d][at[d]] * stride[d];
      elems.push_back(x.elems[flat]);
      int64_t d = rank - 1;
      while (d >= 0 && ++at[d] == index[d].size()) at[d--] = 0;
      if (d < 0) return elems;
    }
  }

  std::optional<KnownData> TransposeData(const Value& out, const Node& p, int depth) {
    std::optional<KnownData> x = In(p, 0, depth);
    if (!x) return std::nullopt;
    const int64_t rank = static_cast<int64_t>(x->dims.size());
    std::vector<int64_t> perm(rank);
    for (int64_t d = 0; d < rank; ++d) perm[d] = rank - 1 - d;
    if (p.attrs.Has("perm")) perm = p.attrs.Get<std::vector<int64_t>>("perm");
    if (static_cast<int64_t>(perm.size()) != rank) return std::nullopt;
    std::vector<int64_t> stride(rank, 1);
    for (int64_t d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * x->dims[d + 1];
    std::vector<int64_t> out_dims(rank), out_stride(rank);
    for (int64_t d = 0; d < rank; ++d) {
      if (perm[d] < 0 || perm[d] >= rank) return std::nullopt;
      out_dims[d] = x->dims[perm[d]];
      out_stride[d] = stride[perm[d]];
    }
    std::vector<Dim> elems;
    std::vector<int64_t> at(rank, 0);
    for (size_t i = 0; i < x->elems.size(); ++i) {
      int64_t flat = 0;
      for (int64_t d = 0; d < rank; ++d) flat += at[d] * out_stride[d];
      elems.push_back(x->elems[flat]);
      for (int64_t d = rank - 1; d >= 0 && ++at[d] == out_dims[d]; --d) at[d] = 0;
    }
    return Shaped(out, std::move(elems));
  }

  static constexpr int kMaxDepth = 48;
  const Graph& g_;
  std::unordered_map<ValueId, std::optional<KnownData>> memo_;
};

}  // namespace

std::optional<KnownData> ComputeKnownData(const Graph& g, ValueId v) {
  KnownDataBuilder b(g);
  return b.Get(v, 0);
}

}  // namespace onnxpipe::ir::infer_internal

namespace onnxpipe::ir {

std::optional<std::vector<int64_t>> KnownInts(const Graph& g, ValueId v) {
  std::optional<infer_internal::KnownData> d = infer_internal::ComputeKnownData(g, v);
  if (!d || !d->AllConcrete()) return std::nullopt;
  return d->Ints();
}

}  // namespace onnxpipe::ir
