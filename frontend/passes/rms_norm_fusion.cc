// The matcher anchors on the normalising node (Mul(xf, r) or Div(xf, sqrt)), walks up the
// reciprocal square root to the mean of squares, checks that the square reads the same x, then
// walks down to the scaling Mul. All checks happen before the graph is touched.

#include "frontend/passes/rms_norm_fusion.h"

#include <optional>
#include <set>
#include <vector>

#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

class RMSNormMatcher {
 public:
  explicit RMSNormMatcher(Graph* g) : g_(g), uses_(*g) {}

  bool TryAt(NodeId anchor) {
    const Node& n = g_->node(anchor);
    if (n.op == OpKind::kDiv) return TryWith(anchor, n.inputs[0], n.inputs[1], /*divides=*/true);
    return TryWith(anchor, n.inputs[0], n.inputs[1], false) || TryWith(anchor, n.inputs[1], n.inputs[0], false);
  }

 private:
  // n = anchor(xf, r): r is 1/sqrt(s), or sqrt(s) when the anchor divides.
  bool TryWith(NodeId anchor, ValueId xf, ValueId r, bool divides) {
    nodes_.clear();
    nodes_.insert(anchor);
    const std::optional<ValueId> s = divides ? SqrtOperand(r) : InverseSqrtOperand(r);
    if (!s) return false;
    // s = Add(v, eps).
    const Node* add = ProducerOf(*g_, *s, OpKind::kAdd);
    if (add == nullptr || !Take(*s)) return false;
    auto split = SplitOperands(*add, [&](ValueId v) {
      return IsFrozenConstant(*g_, v) && ScalarConstant(*g_, v).has_value();
    });
    if (!split) return false;
    const double eps = *ScalarConstant(*g_, split->first);
    if (!(eps >= 0)) return false;
    // v = ReduceMean(p) over the trailing axes; p = Pow(xs, 2) | Mul(xs, xs).
    const ValueId v = SkipCasts(split->second);
    const Node* mean = ProducerOf(*g_, v, OpKind::kReduceMean);
    if (mean == nullptr || !Take(v)) return false;
    const ValueId p = SkipCasts(mean->inputs[0]);
    const Node* sq = ProducerOf(*g_, p);
    if (sq == nullptr || !Take(p)) return false;
    ValueId xs = ir::kNoValue;
    if (sq->op == OpKind::kPow && IsFrozenConstant(*g_, sq->inputs[1]) && IsScalarNear(*g_, sq->inputs[1], 2.0, 0.0)) {
      xs = sq->inputs[0];
    } else if (sq->op == OpKind::kMul && sq->inputs[0] == sq->inputs[1]) {
      xs = sq->inputs[0];
    } else {
      return false;
    }
    // The square and the normalisation read the same x, each directly or through float Casts.
    const ValueId x = Base(xf);
    if (Base(xs) != x) return false;
    const ir::Value& xv = g_->value(x);
    if (!xv.shape_known || xv.shape.empty() || !ir::IsFloat(xv.dtype)) return false;
    const std::optional<int64_t> axis = TrailingAxis(*mean, static_cast<int64_t>(xv.shape.size()));
    if (!axis) return false;
    if (!TakeCasts(xf, x) || !TakeCasts(xs, x)) return false;

    // Down: y = Mul(Cast?(n), w).
    ValueId n = g_->node(anchor).outputs[0];
    if (!uses_.HasSingleUse(n)) return false;
    NodeId next = uses_.Consumers(n)[0];
    if (IsFloatCast(*g_, g_->node(next))) {
      nodes_.insert(next);
      n = g_->node(next).outputs[0];
      if (!uses_.HasSingleUse(n)) return false;
      next = uses_.Consumers(n)[0];
    }
    const Node& mul = g_->node(next);
    if (mul.op != OpKind::kMul) return false;
    const ir::Shape normalised(xv.shape.begin() + *axis, xv.shape.end());
    const ValueId y = mul.outputs[0];
    auto scale = SplitOperands(mul, [&](ValueId w) { return w != n && IsScale(w, normalised, xv.dtype); });
    if (!scale || g_->value(y).dtype != xv.dtype) return false;

    ir::Attrs attrs;
    attrs.Set("axis", *axis - static_cast<int64_t>(xv.shape.size()));
    attrs.Set("epsilon", eps);
    ReplaceWithFused(g_, next, std::vector<NodeId>(nodes_.begin(), nodes_.end()), OpKind::kRMSNorm,
                     {x, scale->first}, std::move(attrs));
    uses_.Refresh();
    return true;
  }

  // Adds the producer of `v` to the pattern when `v` has no use outside it.
  bool Take(ValueId v) {
    const NodeId p = PatternProducer(*g_, uses_, v);
    if (p == ir::kNoNode) return false;
    nodes_.insert(p);
    return true;
  }

  // Follows single-use float Casts upwards, taking each into the pattern.
  ValueId SkipCasts(ValueId v) { return SkipFloatCasts(*g_, uses_, v, &nodes_); }

  // The value above any float Casts.
  ValueId Base(ValueId v) const {
    while (const Node* c = ProducerOf(*g_, v, OpKind::kCast)) {
      if (!IsFloatCast(*g_, *c)) break;
      v = c->inputs[0];
    }
    return v;
  }

  // Takes the Casts from `v` up to `x` when nothing outside the pattern reads them (one Cast may
  // feed both the square and the normalisation).
  bool TakeCasts(ValueId v, ValueId x) {
    while (v != x) {
      if (g_->IsGraphOutput(v)) return false;
      for (NodeId c : uses_.Consumers(v))
        if (!nodes_.count(c)) return false;
      const NodeId p = ProducerId(*g_, v);
      nodes_.insert(p);
      v = g_->node(p).inputs[0];
    }
    return true;
  }

  // s when `r` is Sqrt(s) (Casts allowed around it).
  std::optional<ValueId> SqrtOperand(ValueId r) {
    r = SkipCasts(r);
    const Node* sqrt = ProducerOf(*g_, r, OpKind::kSqrt);
    if (sqrt == nullptr || !Take(r)) return std::nullopt;
    return SkipCasts(sqrt->inputs[0]);
  }

  // s when `r` is Reciprocal(Sqrt(s)), Div(1, Sqrt(s)) or Pow(s, -0.5).
  std::optional<ValueId> InverseSqrtOperand(ValueId r) {
    r = SkipCasts(r);
    const Node* n = ProducerOf(*g_, r);
    if (n == nullptr) return std::nullopt;
    auto frozen_near = [&](ValueId c, double want) {
      return IsFrozenConstant(*g_, c) && IsScalarNear(*g_, c, want, 0.0);
    };
    if (n->op == OpKind::kReciprocal && Take(r)) return SqrtOperand(n->inputs[0]);
    if (n->op == OpKind::kDiv && frozen_near(n->inputs[0], 1.0) && Take(r)) return SqrtOperand(n->inputs[1]);
    if (n->op == OpKind::kPow && frozen_near(n->inputs[1], -0.5) && Take(r)) return SkipCasts(n->inputs[0]);
    return std::nullopt;
  }

  // The first reduced axis when `mean` reduces exactly the trailing axes [a, rank) with keepdims.
  static std::optional<int64_t> TrailingAxis(const Node& mean, int64_t rank) {
    if (mean.attrs.Get<int64_t>("keepdims", 1) != 1) return std::nullopt;
    std::vector<int64_t> axes = mean.attrs.Get<std::vector<int64_t>>("axes");
    if (axes.empty()) return std::nullopt;
    std::set<int64_t> normalised;
    for (int64_t a : axes) {
      std::optional<int64_t> n = NormalizeAxis(a, rank);
      if (!n) return std::nullopt;
      normalised.insert(*n);
    }
    const int64_t first = *normalised.begin();
    if (static_cast<int64_t>(normalised.size()) != rank - first) return std::nullopt;
    return first;
  }

  // A value of x's dtype whose shape broadcasts to the normalised dims (a weight, or 1 + weight).
  bool IsScale(ValueId w, const ir::Shape& normalised, ir::DType dtype) const {
    const ir::Value& v = g_->value(w);
    if (!v.shape_known || v.dtype != dtype || v.shape.size() > normalised.size()) return false;
    for (size_t k = 1; k <= v.shape.size(); ++k) {
      const ir::Dim& d = v.shape[v.shape.size() - k];
      const ir::Dim& n = normalised[normalised.size() - k];
      const bool ok = (d.is_concrete() && d.value() == 1) || d == n || !d.is_concrete() || !n.is_concrete();
      if (!ok) return false;
    }
    return true;
  }

  Graph* g_;
  UseInfo uses_;
  std::set<NodeId> nodes_;
};

}  // namespace

absl::StatusOr<bool> RMSNormFusion::Run(ir::Graph* g) {
  RMSNormMatcher matcher(g);
  return FuseAtAnchors(g, {OpKind::kDiv, OpKind::kMul}, [&](NodeId id) { return matcher.TryAt(id); });
}

}  // namespace onnxpipe::passes
