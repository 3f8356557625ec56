// Shape inference driver: the dispatch table over the per-family rule files, the per-node context,
// the merge of inferred shapes with those an ONNX file declared, and symbol binding.
#include "frontend/ir/infer.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "frontend/ir/infer_rules.h"
#include "frontend/ir/status.h"

namespace onnxpipe::ir {

namespace infer_internal {

StatusBuilder InferContext::Error() const {
  StatusBuilder b(absl::StatusCode::kInvalidArgument, __FILE__, __LINE__);
  b << "node '" << n_.name << "' (" << OpName(n_.op) << "): ";
  return b;
}

absl::StatusOr<int64_t> InferContext::Axis(int64_t axis, int64_t rank, std::string_view what, bool allow_rank) const {
  const int64_t hi = allow_rank ? rank : rank - 1;
  const int64_t lo = allow_rank ? -rank - 1 : -rank;
  if (axis < lo || axis > hi) {
    StatusBuilder b = Error();
    b << what << " " << axis << " is out of range [" << lo << ", " << hi << "] for rank " << rank;
    if (has_input(0)) b << " (" << Describe(0) << ")";
    return b;
  }
  return axis < 0 ? axis + (allow_rank ? rank + 1 : rank) : axis;
}

absl::StatusOr<std::vector<int64_t>> InferContext::Axes(const std::vector<int64_t>& axes, int64_t rank,
                                                        std::string_view what) const {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    ASSIGN_OR_RETURN(int64_t n, Axis(a, rank, what));
    if (std::find(out.begin(), out.end(), n) != out.end()) return Error() << what << " lists axis " << a << " twice";
    out.push_back(n);
  }
  return out;
}

std::string InferContext::Describe(int i) const {
  std::ostringstream os;
  os << "input " << i << " '" << input(i).name << "' (" << DTypeName(dtype(i)) << ShapeToString(shape(i)) << ")";
  return os.str();
}

absl::Status InferContext::ExpectFloat(int i) const {
  if (IsFloat(dtype(i))) return absl::OkStatus();
  return Error() << Describe(i) << " must be a float tensor";
}

absl::Status InferContext::ExpectInteger(int i) const {
  if (dtype(i) == DType::kI64 || dtype(i) == DType::kI32) return absl::OkStatus();
  return Error() << Describe(i) << " must be an i64 or i32 tensor";
}

absl::Status InferContext::ExpectBool(int i) const {
  if (dtype(i) == DType::kBool) return absl::OkStatus();
  return Error() << Describe(i) << " must be a bool tensor";
}

absl::Status InferContext::ExpectSameDType(int i, int j) const {
  if (dtype(i) == dtype(j)) return absl::OkStatus();
  return Error() << Describe(i) << " and " << Describe(j) << " must have the same element type";
}

absl::Status InferContext::ExpectRankAtLeast(int i, int64_t min_rank) const {
  if (rank(i) >= min_rank) return absl::OkStatus();
  return Error() << Describe(i) << " must have rank >= " << min_rank;
}

absl::StatusOr<Shape> SameShape(const InferContext& ctx, int i, int j) {
  bool ok = ctx.rank(i) == ctx.rank(j);
  Shape out = ctx.shape(i);
  for (size_t k = 0; ok && k < out.size(); ++k) {
    std::optional<Dim> d = UnifyDims(out[k], ctx.shape(j)[k]);
    if (!d)
      ok = false;
    else
      out[k] = *d;
  }
  if (!ok) return ctx.Error() << ctx.Describe(i) << " and " << ctx.Describe(j) << " must have the same shape";
  return out;
}

absl::StatusOr<Shape> BroadcastShapes(const InferContext& ctx, const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) rank = std::max(rank, s.size());
  Shape out(rank, Dim(1));
  for (const Shape& s : shapes) {
    const size_t off = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      std::optional<Dim> d = BroadcastDims(out[off + i], s[i]);
      if (!d) {
        StatusBuilder b = ctx.Error();
        b << "shapes";
        for (const Shape& t : shapes) b << " " << ShapeToString(t);
        b << " do not broadcast (dim " << out[off + i].ToString() << " vs " << s[i].ToString() << ")";
        return b;
      }
      out[off + i] = *d;
    }
  }
  return out;
}

}  // namespace infer_internal

namespace {

using infer_internal::InferContext;
using infer_internal::RuleTable;

const RuleTable& Rules() {
  static const RuleTable table = [] {
    RuleTable t{};
    infer_internal::RegisterElementwiseRules(t);
    infer_internal::RegisterShapeOpRules(t);
    infer_internal::RegisterIndexingRules(t);
    infer_internal::RegisterNnRules(t);
    infer_internal::RegisterGradRules(t);
    infer_internal::RegisterTrainRules(t);
    return t;
  }();
  return table;
}

// Merges an inferred dim into one the file declared: the more specific wins (concrete over named
// over unknown); between two named symbols the inferred one, which is consistent with the rest of
// the graph; between two unknowns the existing one, so that re-running inference is stable.
std::optional<Dim> MergeDim(const Dim& declared, const Dim& inferred) {
  if (declared.is_unknown() && inferred.is_unknown()) return declared;
  return infer_internal::UnifyDims(inferred, declared);
}

}  // namespace

bool HasShapeRule(OpKind op) { return Rules()[static_cast<size_t>(op)] != nullptr; }

absl::StatusOr<std::vector<TypeAndShape>> InferNode(const Graph& g, const Node& n) {
  const OpInfo& info = GetOpInfo(n.op);
  const int nin = static_cast<int>(n.inputs.size()), nout = static_cast<int>(n.outputs.size());
  if (nin < info.min_inputs || nin > info.max_inputs || nout < info.min_outputs || nout > info.max_outputs) {
    return INVALID_ARGUMENT() << NodeLabel(n) << ": has " << nin << " inputs and " << nout << " outputs; expected "
                              << info.min_inputs << ".." << info.max_inputs << " inputs and " << info.min_outputs
                              << ".." << info.max_outputs << " outputs";
  }
  for (int i = 0; i < nin; ++i) {
    const ValueId v = n.inputs[i];
    if (v == kNoValue) {
      if (i < info.min_inputs) return INVALID_ARGUMENT() << NodeLabel(n) << ": required input " << i << " is absent";
      continue;
    }
    if (v < 0 || v >= g.num_values())
      return INVALID_ARGUMENT() << NodeLabel(n) << ": input " << i << " is out of range";
    if (!g.value(v).shape_known) {
      return FAILED_PRECONDITION() << NodeLabel(n) << ": input " << i << " '" << g.value(v).name
                                   << "' has no known shape (no type information in the file, or "
                                      "its producer comes later)";
    }
  }
  const infer_internal::InferFn fn = Rules()[static_cast<size_t>(n.op)];
  if (fn == nullptr) {
    return UNIMPLEMENTED() << NodeLabel(n) << ": no shape inference rule for op " << info.name;
  }
  ASSIGN_OR_RETURN(std::vector<TypeAndShape> out, fn(InferContext(g, n)));
  RET_CHECK(static_cast<int>(out.size()) == nout)
      << NodeLabel(n) << ": rule returned " << out.size() << " outputs for " << nout;
  return out;
}

absl::Status InferShapes(Graph& g) {
  // Messages name the node and op; callers prefix the file (Annotate(status, path)).
  for (NodeId id : g.LiveNodes()) {
    const Node& n = g.node(id);
    absl::StatusOr<std::vector<TypeAndShape>> inferred = InferNode(g, n);
    if (!inferred.ok()) return inferred.status();
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const ValueId v = n.outputs[i];
      if (v == kNoValue) continue;
      Value& val = g.value(v);
      TypeAndShape& ts = (*inferred)[i];
      if (val.shape_known) {
        bool ok = val.dtype == ts.dtype && val.shape.size() == ts.shape.size();
        Shape merged = ts.shape;
        for (size_t k = 0; ok && k < merged.size(); ++k) {
          std::optional<Dim> d = MergeDim(val.shape[k], ts.shape[k]);
          if (!d)
            ok = false;
          else
            merged[k] = *d;
        }
        if (!ok) {
          // After binding, the declared shape is the symbolic one with the sizes substituted; a
          // contradiction then usually means a size the model cannot take (a sequence longer
          // than its position table or causal-mask buffer).
          std::string bound;
          for (const auto& [sym, size] : g.symbol_bindings)
            bound += (bound.empty() ? "" : ", ") + sym + "=" + std::to_string(size);
          return INVALID_ARGUMENT() << NodeLabel(n) << ": output " << i << " '" << val.name << "' is declared "
                                    << DTypeName(val.dtype) << ShapeToString(val.shape) << " but inferred "
                                    << DTypeName(ts.dtype) << ShapeToString(ts.shape)
                                    << (bound.empty()
                                            ? std::string()
                                            : " (with " + bound + " bound; does the model support these sizes?)");
        }
        val.shape = std::move(merged);
      } else {
        val.dtype = ts.dtype;
        val.shape = std::move(ts.shape);
        val.shape_known = true;
      }
    }
  }
  return absl::OkStatus();
}

std::set<std::string> CollectSymbols(const Graph& g) {
  std::set<std::string> out;
  for (ValueId v : g.inputs()) {
    for (const Dim& d : g.value(v).shape) {
      for (const std::string& s : d.symbols())
        if (!s.empty() && s[0] != '?') out.insert(s);
    }
  }
  return out;
}

absl::Status BindSymbols(Graph& g, const std::map<std::string, int64_t>& bindings) {
  std::set<std::string> used;
  for (ValueId v = 0; v < g.num_values(); ++v) {
    for (const Dim& d : g.value(v).shape) used.insert(d.symbols().begin(), d.symbols().end());
  }
  auto list = [](const std::set<std::string>& s) {
    std::string out;
    for (const std::string& x : s) {
      if (x.empty() || x[0] == '?') continue;
      out += (out.empty() ? "" : ", ") + x;
    }
    return out.empty() ? std::string("none") : out;
  };
  for (const auto& [sym, size] : bindings) {
    if (sym.empty() || sym[0] == '?') return INVALID_ARGUMENT() << "cannot bind '" << sym << "': not a named symbol";
    if (used.count(sym)) continue;
    auto prev = g.symbol_bindings.find(sym);
    if (prev != g.symbol_bindings.end()) {
      if (prev->second == size) continue;  // binding again to the same size is harmless
      return INVALID_ARGUMENT() << "symbol '" << sym << "' is already bound to " << prev->second
                                << "; cannot bind it to " << size;
    }
    return INVALID_ARGUMENT() << "symbol '" << sym
                              << "' is not used by the model; its symbolic dims are: " << list(CollectSymbols(g));
  }
  // Check every graph input before changing anything, so a failed bind leaves the graph intact.
  for (ValueId v : g.inputs()) {
    const Value& val = g.value(v);
    for (size_t k = 0; k < val.shape.size(); ++k) {
      const Dim& d = val.shape[k];
      // The bound size, with overflow checked (Dim::Bind does not).
      int64_t size = d.factor();
      bool changed = false, overflow = false;
      for (const std::string& s : d.symbols()) {
        auto it = bindings.find(s);
        if (it == bindings.end()) continue;
        changed = true;
        overflow |= __builtin_mul_overflow(size, it->second, &size);
      }
      if (!changed) continue;
      if (overflow) {
        return INVALID_ARGUMENT() << "graph input '" << val.name << "' dim " << k << " (" << d.ToString()
                                  << ") overflows int64 after binding";
      }
      if (size <= 0) {
        return INVALID_ARGUMENT() << "graph input '" << val.name << "' dim " << k << " (" << d.ToString()
                                  << ") would be " << size << " after binding; dims must be >= 1";
      }
    }
  }
  for (const auto& [sym, size] : bindings) {
    if (size <= 0) {
      return INVALID_ARGUMENT() << "symbol '" << sym << "' bound to " << size << "; dims must be >= 1";
    }
  }
  for (ValueId v = 0; v < g.num_values(); ++v) {
    for (Dim& d : g.value(v).shape) d = d.Bind(bindings);
  }
  for (const auto& [sym, size] : bindings) g.symbol_bindings[sym] = size;
  return absl::OkStatus();
}

}  // namespace onnxpipe::ir
