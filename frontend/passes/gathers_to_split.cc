#include "frontend/passes/gathers_to_split.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "frontend/ir/shape.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::ValueId;

// One use of the packed value: the slab [start, start + length) of `axis`; `squeeze` for a Gather
// (which drops the axis).
struct Piece {
  NodeId node = ir::kNoNode;
  int64_t axis = 0, start = 0, length = 0;
  bool squeeze = false;
};

// The constant integer vector of input i of n (nullopt when absent and `required`, or not constant).
std::optional<std::vector<int64_t>> ConstInts(const ir::Graph& g, const ir::Node& n, size_t i, bool required) {
  if (i >= n.inputs.size() || n.inputs[i] == ir::kNoValue) {
    return required ? std::nullopt : std::optional<std::vector<int64_t>>(std::vector<int64_t>{});
  }
  const ir::Value& v = g.value(n.inputs[i]);
  if (!v.constant || !v.constant->has_data() || !ir::IsInteger(v.constant->dtype()) || v.constant->rank() > 1) {
    return std::nullopt;
  }
  return v.constant->ToInt64Vector();
}

std::optional<Piece> PieceOf(const ir::Graph& g, ValueId x, NodeId id) {
  const ir::Node& n = g.node(id);
  const ir::Shape& shape = g.value(x).shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (n.inputs.empty() || n.inputs[0] != x || n.outputs.size() != 1) return std::nullopt;
  auto extent = [&](int64_t axis) -> std::optional<int64_t> {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank || !shape[axis].is_concrete()) return std::nullopt;
    return shape[axis].value();
  };
  Piece p;
  p.node = id;
  if (n.op == ir::OpKind::kGather) {
    const std::optional<std::vector<int64_t>> index = ConstInts(g, n, 1, /*required=*/true);
    const int64_t a = n.attrs.Get<int64_t>("axis", 0);
    const std::optional<int64_t> dim = extent(a);
    if (n.inputs.size() != 2 || !index || g.value(n.inputs[1]).constant->rank() != 0 || !dim) return std::nullopt;
    p.axis = a < 0 ? a + rank : a;
    p.start = (*index)[0] < 0 ? (*index)[0] + *dim : (*index)[0];
    p.length = 1;
    p.squeeze = true;
    return p.start >= 0 && p.start < *dim ? std::optional<Piece>(p) : std::nullopt;
  }
  if (n.op != ir::OpKind::kSlice) return std::nullopt;
  const auto starts = ConstInts(g, n, 1, true), ends = ConstInts(g, n, 2, true);
  const auto axes = ConstInts(g, n, 3, false), steps = ConstInts(g, n, 4, false);
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || axes->size() > 1 ||
      (!steps->empty() && *steps != std::vector<int64_t>{1})) {
    return std::nullopt;
  }
  const int64_t a = axes->empty() ? 0 : (*axes)[0];
  const std::optional<int64_t> dim = extent(a);
  if (!dim) return std::nullopt;
  const ir::SliceAxis s = ir::ClampSliceAxis(*dim, (*starts)[0], (*ends)[0], 1);
  p.axis = a < 0 ? a + rank : a;
  p.start = s.length > 0 ? s.start : 0;
  p.length = s.length;
  return p;
}

// The pieces that tile an axis of `x`, in axis order, or empty when the uses of x are not such a set.
std::vector<Piece> Tiling(const ir::Graph& g, ValueId x, const std::vector<NodeId>& uses) {
  const ir::Value& xv = g.value(x);
  if (!xv.shape_known || uses.size() < 2 || g.IsGraphOutput(x)) return {};
  std::vector<Piece> pieces;
  for (NodeId id : uses) {
    std::optional<Piece> p = PieceOf(g, x, id);
    if (!p || p->length == 0 || (!pieces.empty() && p->axis != pieces[0].axis)) return {};
    pieces.push_back(*p);
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.start < b.start; });
  int64_t next = 0;
  for (const Piece& p : pieces) {
    if (p.start != next) return {};
    next += p.length;
  }
  return next == xv.shape[pieces[0].axis].value() ? pieces : std::vector<Piece>{};
}

}  // namespace

absl::StatusOr<bool> GathersToSplit::Run(ir::Graph* g) {
  const std::vector<std::vector<NodeId>> uses = g->ComputeUses();
  bool changed = false;
  for (ValueId x = 0; x < static_cast<ValueId>(uses.size()); ++x) {
    const std::vector<Piece> pieces = Tiling(*g, x, uses[x]);
    if (pieces.empty()) continue;
    const ir::Value xv = g->value(x);
    const int64_t axis = pieces[0].axis;
    std::vector<ValueId> outs;
    std::vector<int64_t> sizes;
    for (const Piece& p : pieces) {
      const ir::Node& n = g->node(p.node);
      sizes.push_back(p.length);
      if (!p.squeeze) {
        outs.push_back(n.outputs[0]);
        continue;
      }
      ir::Shape shape = xv.shape;
      shape[axis] = 1;
      outs.push_back(g->AddValue(g->UniqueName(g->value(n.outputs[0]).name + "/unsqueezed"), xv.dtype, shape));
    }
    const ir::Node first = g->node(pieces[0].node);
    std::vector<ir::Node> replaced;
    for (const Piece& p : pieces) {
      replaced.push_back(g->node(p.node));
      g->RemoveNode(p.node);
    }
    ir::Attrs split;
    split.Set("axis", axis);
    split.Set("split", sizes);
    g->AddNode(ir::OpKind::kSplit, first.name + "_split", {x}, outs, std::move(split));
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (!pieces[i].squeeze) continue;
      ir::Attrs squeeze;
      squeeze.Set("axes", std::vector<int64_t>{axis});
      g->AddNode(ir::OpKind::kSqueeze, replaced[i].name + "_squeeze", {outs[i]}, replaced[i].outputs,
                 std::move(squeeze));
    }
    changed = true;
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
