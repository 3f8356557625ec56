#include "frontend/passes/repeat_kv_fold.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "frontend/ir/attention_views.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::Graph;
using ir::Node;
using ir::OpKind;
using ir::Shape;
using ir::ValueId;

struct Repeat {
  ValueId source = ir::kNoValue;  // X (..., kv, S, D)
  int64_t kv = 0, n_rep = 0;
};

const Shape& ShapeOf(const Graph& g, ValueId v) { return g.value(v).shape; }

// `with` is `without` with one more dim, `inserted`, at `axis`.
bool InsertsAt(const Shape& without, const Shape& with, size_t axis, const Dim& inserted) {
  if (with.size() != without.size() + 1 || axis >= with.size() || with[axis] != inserted) return false;
  for (size_t d = 0, e = 0; d < with.size(); ++d) {
    if (d == axis) continue;
    if (with[d] != without[e++]) return false;
  }
  return true;
}

// U = X with a 1 inserted at `axis`: Unsqueeze(X, [axis]) or a Reshape that does only that.
std::optional<ValueId> UnsqueezedFrom(const Graph& g, ValueId u, size_t axis) {
  const Node* n = ProducerOf(g, u);
  if (n == nullptr || n->inputs.empty()) return std::nullopt;
  const ValueId x = n->inputs[0];
  if (n->op == OpKind::kUnsqueeze) {
    const std::vector<int64_t> axes = n->attrs.Get<std::vector<int64_t>>("axes", {});
    const int64_t rank = static_cast<int64_t>(ShapeOf(g, u).size());
    if (axes.size() != 1 || NormalizeAxis(axes[0], rank) != static_cast<int64_t>(axis)) return std::nullopt;
  } else if (n->op != OpKind::kReshape) {
    return std::nullopt;
  }
  if (!InsertsAt(ShapeOf(g, x), ShapeOf(g, u), axis, Dim(1))) return std::nullopt;
  return x;
}

// R = repeat_kv(X): see the header. R (..., H, S, D) of rank r >= 3.
std::optional<Repeat> MatchRepeat(const Graph& g, ValueId r_value) {
  const Node* reshape = ProducerOf(g, r_value, OpKind::kReshape);
  if (reshape == nullptr) return std::nullopt;
  const Shape& r = ShapeOf(g, r_value);
  const ValueId e_value = reshape->inputs[0];
  const Shape& e = ShapeOf(g, e_value);
  if (r.size() < 3 || e.size() != r.size() + 1) return std::nullopt;
  const size_t heads = r.size() - 3, rep = heads + 1;  // E (..., kv, n_rep, S, D)
  const Dim &kv = e[heads], &n_rep = e[rep];
  if (!kv.is_concrete() || !n_rep.is_concrete() || !r[heads].is_concrete() ||
      r[heads].value() != kv.value() * n_rep.value()) {
    return std::nullopt;
  }
  for (size_t d = 0; d < r.size(); ++d) {
    if (d != heads && r[d] != e[d < heads ? d : d + 1]) return std::nullopt;
  }
  const Node* grow = ProducerOf(g, e_value);
  if (grow == nullptr || grow->op != OpKind::kExpand) return std::nullopt;
  const ValueId u_value = grow->inputs[0];
  Shape u = e;
  u[rep] = Dim(1);
  if (ShapeOf(g, u_value) != u) return std::nullopt;  // only the inserted axis grows
  const std::optional<ValueId> x = UnsqueezedFrom(g, u_value, rep);
  if (!x) return std::nullopt;
  return Repeat{*x, kv.value(), n_rep.value()};
}

bool FoldAt(Graph* g, ir::NodeId id) {
  Node& n = g->node(id);
  if (n.inputs.size() < 3) return false;
  const std::optional<Repeat> k = MatchRepeat(*g, n.inputs[1]);
  const std::optional<Repeat> v = MatchRepeat(*g, n.inputs[2]);
  if (!k || !v || k->kv != v->kv || k->n_rep != v->n_rep || k->n_rep < 2) return false;
  const Shape& q = ShapeOf(*g, n.inputs[0]);
  const Shape& kr = ShapeOf(*g, n.inputs[1]);
  if (q.size() != kr.size() || q.end()[-3] != kr.end()[-3]) return false;
  n.inputs[1] = k->source;
  n.inputs[2] = v->source;
  return true;
}

}  // namespace

absl::StatusOr<bool> RepeatKvFold::Run(Graph* g) {
  bool changed = false;
  for (ir::NodeId id : g->LiveNodes()) {
    if (g->node(id).op == OpKind::kAttention && !ir::HasAttentionViews(g->node(id))) changed |= FoldAt(g, id);
  }
  return changed;
}

}  // namespace onnxpipe::passes
