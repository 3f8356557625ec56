// The matcher anchors on the Add of the two products, takes the product whose operand is a rotation
// of some x, and requires the other product to read that same x; then checks the tables. The
// partial rewrite anchors on the Concat that puts a fused Rotary's slice back in front of the rest.
// All checks happen before the graph is touched.

#include "frontend/passes/rotary_fusion.h"

#include <optional>
#include <set>
#include <vector>

#include "frontend/ir/shape.h"
#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// A Slice of x along its last axis: elements start, start + step, ... (length of them).
struct LastAxisSlice {
  ValueId x = ir::kNoValue;
  int64_t start = 0, length = 0, step = 1;
};

// The constant integers of input i of n; empty when absent, nullopt when not constant.
std::optional<std::vector<int64_t>> ConstInts(const Graph& g, const Node& n, size_t i) {
  if (i >= n.inputs.size() || n.inputs[i] == ir::kNoValue) return std::vector<int64_t>{};
  const ir::Value& v = g.value(n.inputs[i]);
  if (!v.constant || !v.constant->has_data() || !ir::IsInteger(v.constant->dtype()) || v.constant->rank() > 1)
    return std::nullopt;
  return v.constant->ToInt64Vector();
}

// x's last dim when x's shape is known and that dim concrete.
std::optional<int64_t> Width(const Graph& g, ValueId x) {
  const ir::Value& v = g.value(x);
  if (!v.shape_known || v.shape.empty() || !v.shape.back().is_concrete()) return std::nullopt;
  return v.shape.back().value();
}

std::optional<LastAxisSlice> SliceOf(const Graph& g, const Node& n) {
  if (n.op != OpKind::kSlice) return std::nullopt;
  const auto starts = ConstInts(g, n, 1), ends = ConstInts(g, n, 2), axes = ConstInts(g, n, 3),
             steps = ConstInts(g, n, 4);
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 || axes->size() != 1 ||
      steps->size() > 1)
    return std::nullopt;
  const ValueId x = n.inputs[0];
  const std::optional<int64_t> width = Width(g, x);
  const int64_t rank = static_cast<int64_t>(g.value(x).shape.size());
  if (!width || NormalizeAxis((*axes)[0], rank) != rank - 1) return std::nullopt;
  LastAxisSlice s;
  s.x = x;
  s.step = steps->empty() ? 1 : (*steps)[0];
  if (s.step <= 0) return std::nullopt;
  const ir::SliceAxis c = ir::ClampSliceAxis(*width, (*starts)[0], (*ends)[0], s.step);
  s.start = c.start;
  s.length = c.length;
  return s;
}

class RotaryMatcher {
 public:
  explicit RotaryMatcher(Graph* g) : g_(g), uses_(*g) {}

  // Rewrite 1 at an Add.
  bool TryAdd(NodeId add) {
    const Node& n = g_->node(add);
    if (n.inputs.size() != 2 || n.inputs[0] == n.inputs[1]) return false;
    return TryProducts(add, n.inputs[0], n.inputs[1]) || TryProducts(add, n.inputs[1], n.inputs[0]);
  }

  // Rewrite 2 at a Concat.
  bool TryPartial(NodeId concat) {
    const Node& n = g_->node(concat);
    const ValueId y = n.outputs[0];
    if (n.inputs.size() != 2 || !ConcatsLastAxis(n)) return false;
    const NodeId rot_id = PatternProducer(*g_, uses_, n.inputs[0]);
    const NodeId pass_id = PatternProducer(*g_, uses_, n.inputs[1]);
    if (rot_id == ir::kNoNode || pass_id == ir::kNoNode || g_->node(rot_id).op != OpKind::kRotary) return false;
    const Node& rot = g_->node(rot_id);
    const std::optional<int64_t> rotated = Width(*g_, rot.inputs[0]);
    if (!rotated || rot.attrs.Get<int64_t>("rotary_dim", -1) != *rotated) return false;
    const NodeId head_id = PatternProducer(*g_, uses_, rot.inputs[0]);
    if (head_id == ir::kNoNode) return false;
    const std::optional<LastAxisSlice> head = SliceOf(*g_, g_->node(head_id));
    const std::optional<LastAxisSlice> rest = SliceOf(*g_, g_->node(pass_id));
    if (!head || !rest || head->x != rest->x || head->step != 1 || rest->step != 1) return false;
    const std::optional<int64_t> width = Width(*g_, head->x);
    if (head->start != 0 || head->length != *rotated || rest->start != *rotated ||
        rest->start + rest->length != *width || rest->length == 0 || !SameShapeAndDType(*g_, head->x, y))
      return false;
    ir::Attrs attrs = rot.attrs;
    const ValueId x = head->x, cos = rot.inputs[1], sin = rot.inputs[2];
    ReplaceWithFused(g_, concat, {rot_id, head_id, pass_id}, OpKind::kRotary, {x, cos, sin}, std::move(attrs));
    uses_.Refresh();
    return true;
  }

 private:
  struct Rotation {
    ValueId x = ir::kNoValue;
    bool interleaved = false;
  };

  // y = Add(m_cos, m_sin), m_cos = Mul(x, cos), m_sin = Mul(rot(x), sin).
  bool TryProducts(NodeId add, ValueId m_cos, ValueId m_sin) {
    const NodeId mc = PatternProducer(*g_, uses_, m_cos), ms = PatternProducer(*g_, uses_, m_sin);
    if (mc == ir::kNoNode || ms == ir::kNoNode || g_->node(mc).op != OpKind::kMul || g_->node(ms).op != OpKind::kMul)
      return false;
    const std::vector<ValueId> mc_in = g_->node(mc).inputs, ms_in = g_->node(ms).inputs;
    for (int k = 0; k < 2; ++k) {
      nodes_ = {mc, ms};
      const ValueId r = ms_in[k], sin = ms_in[1 - k];
      const std::optional<Rotation> rot = MatchRotation(r);
      if (!rot) continue;
      const ValueId x = rot->x;
      ValueId cos = ir::kNoValue;
      if (mc_in[0] == x && mc_in[1] != x) cos = mc_in[1];
      if (mc_in[1] == x && mc_in[0] != x) cos = mc_in[0];
      const ValueId y = g_->node(add).outputs[0];
      if (cos == ir::kNoValue || sin == x || !TablesFit(x, cos, sin) || !SameShapeAndDType(*g_, x, y) ||
          !SameShapeAndDType(*g_, x, m_cos) || !SameShapeAndDType(*g_, x, m_sin))
        continue;
      ir::Attrs attrs;
      attrs.Set("rotary_dim", *Width(*g_, x));
      attrs.Set("interleaved", int64_t{rot->interleaved ? 1 : 0});
      ReplaceWithFused(g_, add, std::vector<NodeId>(nodes_.begin(), nodes_.end()), OpKind::kRotary, {x, cos, sin},
                       std::move(attrs));
      uses_.Refresh();
      return true;
    }
    return false;
  }

  // rot(x) in the rotate-half or interleaved form (the header's spelling); takes its nodes.
  std::optional<Rotation> MatchRotation(ValueId r) {
    const NodeId p = PatternProducer(*g_, uses_, r);
    if (p == ir::kNoNode) return std::nullopt;
    const Node& n = g_->node(p);
    if (n.op == OpKind::kConcat) {
      if (!ConcatsLastAxis(n) || n.inputs.size() != 2) return std::nullopt;
      const std::optional<ValueId> x = NegatedPair(n.inputs[0], n.inputs[1], /*interleaved=*/false);
      if (!x || !SameShapeAndDType(*g_, *x, r)) return std::nullopt;
      nodes_.insert(p);
      return Rotation{*x, false};
    }
    if (n.op != OpKind::kReshape) return std::nullopt;
    // Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1), axis=-1)) to x's
    // shape: a row-major reshape of (..., W/2, 2) to (..., W) is the flatten.
    const NodeId c = PatternProducer(*g_, uses_, n.inputs[0]);
    if (c == ir::kNoNode || g_->node(c).op != OpKind::kConcat || g_->node(c).inputs.size() != 2 ||
        !ConcatsLastAxis(g_->node(c)))
      return std::nullopt;
    const std::vector<ValueId> parts = g_->node(c).inputs;
    std::vector<ValueId> unsqueezed;
    std::vector<NodeId> taken = {p, c};
    for (ValueId u : parts) {
      const NodeId un = PatternProducer(*g_, uses_, u);
      if (un == ir::kNoNode || g_->node(un).op != OpKind::kUnsqueeze) return std::nullopt;
      const Node& unode = g_->node(un);
      const int64_t out_rank = static_cast<int64_t>(g_->value(u).shape.size());
      const std::vector<int64_t> axes = unode.attrs.Get<std::vector<int64_t>>("axes");
      if (!g_->value(u).shape_known || axes.size() != 1 || NormalizeAxis(axes[0], out_rank) != out_rank - 1)
        return std::nullopt;
      unsqueezed.push_back(unode.inputs[0]);
      taken.push_back(un);
    }
    const std::optional<ValueId> x = NegatedPair(unsqueezed[0], unsqueezed[1], /*interleaved=*/true);
    if (!x || !SameShapeAndDType(*g_, *x, r)) return std::nullopt;
    nodes_.insert(taken.begin(), taken.end());
    return Rotation{*x, true};
  }

  // The x of (Neg(Slice(x, second half | odd)), Slice(x, first half | even)); takes those nodes.
  std::optional<ValueId> NegatedPair(ValueId negated, ValueId plain, bool interleaved) {
    const NodeId neg = PatternProducer(*g_, uses_, negated);
    if (neg == ir::kNoNode || g_->node(neg).op != OpKind::kNeg) return std::nullopt;
    const NodeId s_hi = PatternProducer(*g_, uses_, g_->node(neg).inputs[0]);
    const NodeId s_lo = PatternProducer(*g_, uses_, plain);
    if (s_hi == ir::kNoNode || s_lo == ir::kNoNode) return std::nullopt;
    const std::optional<LastAxisSlice> hi = SliceOf(*g_, g_->node(s_hi)), lo = SliceOf(*g_, g_->node(s_lo));
    if (!hi || !lo || hi->x != lo->x) return std::nullopt;
    const std::optional<int64_t> width = Width(*g_, hi->x);
    if (!width || *width % 2 != 0 || *width == 0) return std::nullopt;
    const int64_t half = *width / 2;
    const bool ok = interleaved ? (hi->step == 2 && lo->step == 2 && hi->start == 1 && lo->start == 0 &&
                                   hi->length == half && lo->length == half)
                                : (hi->step == 1 && lo->step == 1 && hi->start == half && lo->start == 0 &&
                                   hi->length == half && lo->length == half);
    if (!ok) return std::nullopt;
    nodes_.insert({neg, s_hi, s_lo});
    return hi->x;
  }

  // cos and sin: one shape (..., W) broadcasting to x's, x's dtype, no trainable parameter behind.
  bool TablesFit(ValueId x, ValueId cos, ValueId sin) const {
    const ir::Value &xv = g_->value(x), &cv = g_->value(cos);
    const std::optional<int64_t> width = Width(*g_, x);
    if (!width || !SameShapeAndDType(*g_, cos, sin) || cv.dtype != xv.dtype || !ir::IsFloat(xv.dtype) ||
        cv.shape.empty() || cv.shape.size() > xv.shape.size() || !cv.shape.back().is_concrete() ||
        cv.shape.back().value() != *width)
      return false;
    for (size_t k = 2; k <= cv.shape.size(); ++k) {
      const ir::Dim &t = cv.shape[cv.shape.size() - k], &d = xv.shape[xv.shape.size() - k];
      if (!(t.is_concrete() && t.value() == 1) && t != d) return false;
    }
    return !DependsOnParameter(*g_, cos) && !DependsOnParameter(*g_, sin);
  }

  bool ConcatsLastAxis(const Node& n) const {
    const int64_t rank = static_cast<int64_t>(g_->value(n.outputs[0]).shape.size());
    return g_->value(n.outputs[0]).shape_known && NormalizeAxis(n.attrs.Get<int64_t>("axis", 0), rank) == rank - 1;
  }

  Graph* g_;
  UseInfo uses_;
  std::set<NodeId> nodes_;
};

}  // namespace

absl::StatusOr<bool> RotaryFusion::Run(ir::Graph* g) {
  RotaryMatcher matcher(g);
  ASSIGN_OR_RETURN(const bool full, FuseAtAnchors(g, {OpKind::kAdd}, [&](NodeId id) { return matcher.TryAdd(id); }));
  RotaryMatcher partial(g);
  ASSIGN_OR_RETURN(const bool part,
                   FuseAtAnchors(g, {OpKind::kConcat}, [&](NodeId id) { return partial.TryPartial(id); }));
  return full || part;
}

}  // namespace onnxpipe::passes
