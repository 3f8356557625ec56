#include "frontend/passes/attention_layout.h"

#include <map>
#include <optional>
#include <vector>

#include "frontend/ir/attention_views.h"
#include "frontend/ir/strided_view.h"
#include "frontend/passes/layout_ops.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::FactoredView;
using ir::NodeId;
using ir::OpKind;
using ir::StridedView;
using ir::ValueId;

// `out` (an output of node n) as a view of n's data input, given that input's view `in`.
std::optional<FactoredView> Forward(const ir::Graph& g, const ir::Node& n, ValueId out, const FactoredView& in) {
  const std::optional<std::vector<int64_t>> dims = ConcreteDims(g, out);
  if (!dims) return std::nullopt;
  if (ReshapesData(n.op)) return ir::ViewReshape(in, *dims);
  const int64_t rank = static_cast<int64_t>(in.dims.size());
  const std::vector<int64_t> in_dims = in.Dims();
  auto axis_of = [&](int64_t a) { return a < 0 ? a + rank : a; };
  if (n.op == OpKind::kTranspose) {
    const std::vector<int64_t> perm = TransposePerm(n, in.dims.size());
    if (static_cast<int64_t>(perm.size()) != rank) return std::nullopt;
    return ir::ViewTranspose(in, perm);
  }
  if (n.op == OpKind::kSplit) {
    const int64_t axis = axis_of(n.attrs.Get<int64_t>("axis", 0));
    if (axis < 0 || axis >= rank) return std::nullopt;
    int64_t start = 0;
    for (ValueId o : n.outputs) {
      const std::optional<std::vector<int64_t>> d = ConcreteDims(g, o);
      if (!d || static_cast<int64_t>(d->size()) != rank) return std::nullopt;
      if (o == out) return ir::ViewNarrow(in, static_cast<int>(axis), start, (*d)[axis]);
      start += (*d)[axis];
    }
    return std::nullopt;
  }
  if (n.op == OpKind::kGather && n.inputs.size() == 2) {
    const ir::Value& index = g.value(n.inputs[1]);
    const int64_t axis = axis_of(n.attrs.Get<int64_t>("axis", 0));
    if (!index.constant || !index.constant->has_data() || index.constant->rank() != 0 ||
        !ir::IsInteger(index.constant->dtype()) || axis < 0 || axis >= rank) {
      return std::nullopt;
    }
    int64_t i = index.constant->ToInt64Vector()[0];
    if (i < 0) i += in_dims[axis];
    if (i < 0 || i >= in_dims[axis]) return std::nullopt;
    return ir::ViewSelect(in, static_cast<int>(axis), i);
  }
  return std::nullopt;
}

// `v` as a view of the furthest value up a chain of layout ops; copies: whether the chain copies.
struct Traced {
  ValueId source = ir::kNoValue;
  FactoredView view;
  bool copies = false;
};

Traced TraceUp(const ir::Graph& g, ValueId v) {
  const std::optional<std::vector<int64_t>> dims = ConcreteDims(g, v);
  Traced here{v, FactoredView::Of(ir::ContiguousView(dims ? *dims : std::vector<int64_t>{})), false};
  const ir::Node* p = ProducerOf(g, v);
  if (!dims || p == nullptr || p->inputs.empty() || !ConcreteDims(g, p->inputs[0])) return here;
  const Traced up = TraceUp(g, p->inputs[0]);
  const std::optional<FactoredView> view = Forward(g, *p, v, up.view);
  if (!view) return here;
  const bool copies = p->op == OpKind::kTranspose || p->op == OpKind::kSplit || p->op == OpKind::kGather;
  return Traced{up.source, *view, up.copies || copies};
}

// Rewires Q, K, V of `n` to the values they are views of, where that saves a copy.
bool AbsorbInputs(ir::Graph* g, NodeId id) {
  ir::Node& n = g->node(id);
  Traced t[3];
  StridedView views[3];
  bool take[3] = {false, false, false};
  const std::optional<std::vector<int64_t>> q = ConcreteDims(*g, n.inputs[0]);
  if (!q || q->size() < 2) return false;
  const std::vector<int64_t> batch(q->begin(), q->end() - 2);
  const std::optional<std::vector<int64_t>> k = ConcreteDims(*g, n.inputs[1]), v = ConcreteDims(*g, n.inputs[2]);
  // Grouped K and V (fewer heads than Q) are read as they are: their batch dims are Q's, ungrouped.
  const int64_t group = k && v ? ir::AttentionKvGroup(*q, *k, *v) : 1;
  for (int i = 0; i < 3; ++i) {
    t[i] = TraceUp(*g, n.inputs[i]);
    const std::optional<StridedView> view = t[i].view.ToView();
    if (!view) continue;
    views[i] = *view;
    take[i] = t[i].copies && view->dims.size() >= 2 && view->strides.back() == 1 &&
              ir::UngroupedBatch(std::vector<int64_t>(view->dims.begin(), view->dims.end() - 2),
                                 i == 0 ? 1 : group) == batch;
  }
  // The views into each traced value must cover it exactly (AttentionGrad writes its gradient).
  std::map<ValueId, std::vector<int>> by_source;
  for (int i = 0; i < 3; ++i)
    if (take[i]) by_source[t[i].source].push_back(i);
  bool changed = false;
  for (const auto& [source, operands] : by_source) {
    std::vector<StridedView> pieces;
    for (int i : operands) pieces.push_back(views[i]);
    const std::vector<int64_t> source_dims = *ConcreteDims(*g, source);
    int64_t numel = 1;
    for (int64_t d : source_dims) numel *= d;
    if (!ir::CoversExactly(numel, pieces)) continue;
    for (int i : operands) {
      n.inputs[i] = source;
      n.attrs.Set(ir::AttentionViewAttr(i), ir::ViewToInts(views[i]));
      changed = true;
    }
  }
  return changed;
}

// Makes `n` write its output's last value down a copying chain of single-use layout ops.
bool AbsorbOutput(ir::Graph* g, NodeId id, const UseInfo& uses) {
  std::vector<NodeId> chain;
  ValueId cur = g->node(id).outputs[0];
  while (uses.HasSingleUse(cur)) {
    const NodeId c = uses.Consumers(cur)[0];
    const ir::Node& cn = g->node(c);
    if ((!ReshapesData(cn.op) && cn.op != OpKind::kTranspose) || cn.inputs[0] != cur || cn.outputs.size() != 1 ||
        !ConcreteDims(*g, cn.outputs[0]) ||
        (cn.op == OpKind::kReshape && cn.inputs.size() > 1 && cn.inputs[1] == cur)) {
      break;
    }
    chain.push_back(c);
    cur = cn.outputs[0];
  }
  // The longest prefix of the chain that is a view of its last value and contains a Transpose.
  for (; !chain.empty(); chain.pop_back()) {
    const ValueId y = g->node(chain.back()).outputs[0];
    std::optional<FactoredView> view = FactoredView::Of(ir::ContiguousView(*ConcreteDims(*g, y)));
    bool transposes = false;
    for (size_t k = chain.size(); k-- > 0 && view;) {
      const ir::Node& c = g->node(chain[k]);
      const std::optional<std::vector<int64_t>> in = ConcreteDims(*g, c.inputs[0]);
      if (!in) {
        view.reset();
      } else if (c.op == OpKind::kTranspose) {
        const std::vector<int64_t> perm = TransposePerm(c, in->size());
        std::vector<int64_t> inverse(perm.size());
        for (size_t d = 0; d < perm.size(); ++d) inverse[perm[d]] = static_cast<int64_t>(d);
        view = ir::ViewTranspose(*view, inverse);
        transposes = true;
      } else {
        view = ir::ViewReshape(*view, *in);
      }
    }
    const std::optional<StridedView> o = view ? view->ToView() : std::nullopt;
    if (!o || !transposes || o->dims.size() < 2 || o->strides.back() != 1) continue;
    const std::vector<int64_t> y_dims = *ConcreteDims(*g, y);
    for (NodeId c : chain) g->RemoveNode(c);
    SetOutput(g, id, 0, y);  // O stays behind, unused
    g->node(id).attrs.Set("o_view", ir::ViewToInts(*o));
    g->node(id).attrs.Set("o_shape", y_dims);
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<bool> AttentionLayout::Run(ir::Graph* g) {
  bool changed = false;
  for (NodeId id : g->LiveNodes()) {
    if (g->node(id).op != OpKind::kAttention || ir::HasAttentionViews(g->node(id))) continue;
    changed |= AbsorbInputs(g, id);
    const UseInfo uses(*g);
    changed |= AbsorbOutput(g, id, uses);
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
