// The matcher anchors on the normalising Div (or Mul by Reciprocal) and walks up to x through
// the variance branch, then down to the affine Mul/Add. Anchoring in the middle keeps both walks
// short and makes the Sub (whose output has exactly two pattern consumers) the only fan-out
// point to check.

#include "frontend/passes/layer_norm_fusion.h"

#include <algorithm>
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

class LayerNormMatcher {
 public:
  explicit LayerNormMatcher(Graph* g) : g_(g), uses_(*g) {}

  bool TryAt(NodeId anchor_id) {
    nodes_.clear();
    const Node& anchor = g_->node(anchor_id);
    // n = Div(d, s) or Mul(d, Reciprocal(s)) / Mul(Reciprocal(s), d).
    ValueId d = ir::kNoValue, s = ir::kNoValue;
    if (anchor.op == OpKind::kDiv) {
      d = anchor.inputs[0];
      s = anchor.inputs[1];
    } else if (anchor.op == OpKind::kMul) {
      auto split = SplitOperands(anchor, [&](ValueId v) { return ProducerOf(*g_, v, OpKind::kReciprocal) != nullptr; });
      if (!split || !Take(split->first)) return false;
      s = ProducerOf(*g_, split->first)->inputs[0];
      d = split->second;
    } else {
      return false;
    }
    nodes_.insert(anchor_id);
    // d = Sub(x, m), m = ReduceMean(x).
    const Node* sub = ProducerOf(*g_, d, OpKind::kSub);
    if (sub == nullptr) return false;
    const ValueId x = sub->inputs[0];
    const Node* mean = ProducerOf(*g_, sub->inputs[1], OpKind::kReduceMean);
    if (mean == nullptr || mean->inputs[0] != x || !Take(sub->inputs[1])) return false;
    const ir::Value& xv = g_->value(x);
    if (!xv.shape_known || xv.shape.empty() || !ir::IsFloat(xv.dtype)) return false;
    const int64_t rank = static_cast<int64_t>(xv.shape.size());
    if (!ReducesLastAxis(*mean, rank)) return false;
    nodes_.insert(ProducerId(*g_, d));
    // s = Sqrt(Add(v, eps)), possibly behind a Cast.
    ValueId sv = SkipCasts(s);
    const Node* sqrt = ProducerOf(*g_, sv, OpKind::kSqrt);
    if (sqrt == nullptr || !Take(sv)) return false;
    const Node* add_eps = ProducerOf(*g_, sqrt->inputs[0], OpKind::kAdd);
    if (add_eps == nullptr || !Take(sqrt->inputs[0])) return false;
    auto eps_split = SplitOperands(*add_eps, [&](ValueId v) { return ScalarConstant(*g_, v).has_value(); });
    if (!eps_split) return false;
    const double eps = *ScalarConstant(*g_, eps_split->first);
    if (!(eps >= 0)) return false;
    // v = ReduceMean(p), p = Pow(d, 2) | Mul(d, d), with optional Casts.
    ValueId v = SkipCasts(eps_split->second);
    const Node* var = ProducerOf(*g_, v, OpKind::kReduceMean);
    if (var == nullptr || !Take(v) || !ReducesLastAxis(*var, rank)) return false;
    ValueId p = SkipCasts(var->inputs[0]);
    const Node* sq = ProducerOf(*g_, p);
    if (sq == nullptr || !Take(p)) return false;
    ValueId d_in_square;
    if (sq->op == OpKind::kPow) {
      if (!IsScalarNear(*g_, sq->inputs[1], 2.0, 0.0)) return false;
      d_in_square = SkipCasts(sq->inputs[0]);
    } else if (sq->op == OpKind::kMul && sq->inputs[0] == sq->inputs[1]) {
      d_in_square = SkipCasts(sq->inputs[0]);
    } else {
      return false;
    }
    if (d_in_square != d) return false;
    // d feeds only the pattern (the anchor and the square, directly or through a Cast).
    for (NodeId c : uses_.Consumers(d))
      if (!nodes_.count(c)) return false;
    if (g_->IsGraphOutput(d)) return false;

    // Affine tail: Mul(n, scale) then optionally Add(., bias).
    const ValueId n = anchor.outputs[0];
    if (!uses_.HasSingleUse(n)) return false;
    const NodeId mul_id = uses_.Consumers(n)[0];
    const Node& mul = g_->node(mul_id);
    if (mul.op != OpKind::kMul) return false;
    const Dim last = xv.shape.back();
    auto scale_split = SplitOperands(mul, [&](ValueId w) { return w != n && IsAffineParam(w, last, xv.dtype); });
    if (!scale_split) return false;
    const ValueId scale = scale_split->first;
    NodeId root = mul_id;
    ValueId bias = ir::kNoValue;
    const ValueId y = mul.outputs[0];
    if (uses_.HasSingleUse(y)) {
      const NodeId add_id = uses_.Consumers(y)[0];
      const Node& add = g_->node(add_id);
      if (add.op == OpKind::kAdd) {
        auto bias_split = SplitOperands(add, [&](ValueId w) { return w != y && IsAffineParam(w, last, xv.dtype); });
        if (bias_split) {
          bias = bias_split->first;
          nodes_.insert(mul_id);
          root = add_id;
        }
      }
    }
    if (g_->value(g_->node(root).outputs[0]).dtype != xv.dtype) return false;

    std::vector<ValueId> inputs = {x, scale};
    if (bias != ir::kNoValue) inputs.push_back(bias);
    ir::Attrs attrs;
    attrs.Set("axis", int64_t{-1});
    attrs.Set("epsilon", eps);
    ReplaceWithFused(g_, root, std::vector<NodeId>(nodes_.begin(), nodes_.end()), OpKind::kLayerNorm,
                     std::move(inputs), std::move(attrs));
    uses_.Refresh();
    return true;
  }

 private:
  using Dim = ir::Dim;

  // Adds the producer of `v` to the pattern when `v` has no use outside it.
  bool Take(ValueId v) {
    const NodeId p = PatternProducer(*g_, uses_, v);
    if (p == ir::kNoNode) return false;
    nodes_.insert(p);
    return true;
  }

  // Follows float-to-float Casts upwards, taking each into the pattern. Stops (returning the Cast's
  // output) at a Cast that has other uses.
  ValueId SkipCasts(ValueId v) { return SkipFloatCasts(*g_, uses_, v, &nodes_); }

  bool ReducesLastAxis(const Node& reduce, int64_t rank) const {
    if (reduce.attrs.Get<int64_t>("keepdims", 1) != 1) return false;
    std::vector<int64_t> axes = reduce.attrs.Get<std::vector<int64_t>>("axes");
    if (axes.size() != 1) return false;
    std::optional<int64_t> a = NormalizeAxis(axes[0], rank);
    return a.has_value() && *a == rank - 1;
  }

  // A 1-D value of the normalized size (when both sizes are known) and x's dtype.
  bool IsAffineParam(ValueId w, const Dim& last, ir::DType dtype) const {
    const ir::Value& v = g_->value(w);
    if (!v.shape_known || v.shape.size() != 1 || v.dtype != dtype) return false;
    return v.shape[0] == last || !v.shape[0].is_concrete() || !last.is_concrete();
  }

  Graph* g_;
  UseInfo uses_;
  std::set<NodeId> nodes_;
};

}  // namespace

absl::StatusOr<bool> LayerNormFusion::Run(ir::Graph* g) {
  LayerNormMatcher matcher(g);
  return FuseAtAnchors(g, {OpKind::kDiv, OpKind::kMul}, [&](NodeId id) { return matcher.TryAt(id); });
}

}  // namespace onnxpipe::passes
