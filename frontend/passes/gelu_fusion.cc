// Association and operand order are handled by flattening: a product of single-use Mul nodes is
// read as the multiset of its leaves, so every bracketing of x * 0.5 * A looks the same. Nodes
// are visited in topological order, so the innermost complete product is tried before any larger
// product that contains it.

#include "frontend/passes/gelu_fusion.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
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

constexpr double kSqrt2 = std::numbers::sqrt2;
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kTanhCubic = 0.044715;

class GeluMatcher {
 public:
  explicit GeluMatcher(Graph* g) : g_(g), uses_(*g) {}

  bool TryAt(NodeId root) {
    dead_.clear();
    std::vector<ValueId> leaves;
    if (!Flatten(root, /*max_leaves=*/3, &leaves) || leaves.size() != 3) return false;
    // Try each assignment of the leaves to {0.5, (1 + f(...)), x}: x itself may be an Add output.
    const size_t flattened = dead_.size();
    for (int half = 0; half < 3; ++half) {
      if (!IsScalarNear(*g_, leaves[half], 0.5)) continue;
      for (int one_plus = 0; one_plus < 3; ++one_plus) {
        if (one_plus == half) continue;
        dead_.resize(flattened);
        const ValueId x = leaves[3 - half - one_plus];
        std::optional<std::string> approximate = MatchOnePlus(leaves[one_plus], x);
        if (!approximate) continue;
        const ir::Value& xv = g_->value(x);
        if (!ir::IsFloat(xv.dtype) || xv.dtype != g_->value(g_->node(root).outputs[0]).dtype) continue;
        ir::Attrs attrs;
        attrs.Set("approximate", *approximate);
        ReplaceWithFused(g_, root, dead_, OpKind::kGelu, {x}, std::move(attrs));
        uses_.Refresh();
        return true;
      }
    }
    return false;
  }

 private:
  // (1 + Erf(x / sqrt 2)) -> "none"; (1 + Tanh(...)) -> "tanh".
  std::optional<std::string> MatchOnePlus(ValueId v, ValueId x) {
    const Node* add = ProducerOf(*g_, v, OpKind::kAdd);
    if (add == nullptr || !Take(v)) return std::nullopt;
    auto split = SplitOperands(*add, [&](ValueId w) { return IsScalarNear(*g_, w, 1.0); });
    if (!split) return std::nullopt;
    const ValueId f = split->second;
    if (const Node* erf = ProducerOf(*g_, f, OpKind::kErf)) {
      if (Take(f) && MatchErfArgument(erf->inputs[0], x)) return "none";
    } else if (const Node* tanh = ProducerOf(*g_, f, OpKind::kTanh)) {
      if (Take(f) && MatchTanhArgument(tanh->inputs[0], x)) return "tanh";
    }
    return std::nullopt;
  }

  bool Take(ValueId v) {
    const NodeId p = PatternProducer(*g_, uses_, v);
    if (p == ir::kNoNode) return false;
    dead_.push_back(p);
    return true;
  }

  // Leaves of the Mul tree rooted at node `id` (which must be a Mul). Inner Mul nodes used once
  // are expanded (and recorded as pattern nodes); Pow(y, k) with small integer k expands to k
  // copies of y when `expand_pow`. Fails past `max_leaves`.
  bool Flatten(NodeId id, size_t max_leaves, std::vector<ValueId>* leaves, bool expand_pow = false) {
    const Node& n = g_->node(id);
    if (n.op != OpKind::kMul) return false;
    for (ValueId in : n.inputs) {
      const Node* p = ProducerOf(*g_, in);
      if (p != nullptr && p->op == OpKind::kMul && uses_.HasSingleUse(in)) {
        dead_.push_back(ProducerId(*g_, in));
        if (!Flatten(ProducerId(*g_, in), max_leaves, leaves, expand_pow)) return false;
      } else if (expand_pow && p != nullptr && p->op == OpKind::kPow && uses_.HasSingleUse(in)) {
        std::optional<double> k = ScalarConstant(*g_, p->inputs[1]);
        if (!k || *k != std::round(*k) || *k < 1 || *k > 4) return false;
        dead_.push_back(ProducerId(*g_, in));
        for (int i = 0; i < static_cast<int>(*k); ++i) leaves->push_back(p->inputs[0]);
      } else {
        leaves->push_back(in);
      }
      if (leaves->size() > max_leaves) return false;
    }
    return true;
  }

  // Erf's argument: x / sqrt(2) or x * (1 / sqrt(2)).
  bool MatchErfArgument(ValueId arg, ValueId x) {
    const Node* n = ProducerOf(*g_, arg);
    if (n == nullptr || !Take(arg)) return false;
    if (n->op == OpKind::kDiv) return n->inputs[0] == x && IsScalarNear(*g_, n->inputs[1], kSqrt2);
    if (n->op == OpKind::kMul) {
      auto split = SplitOperands(*n, [&](ValueId v) { return IsScalarNear(*g_, v, 1.0 / kSqrt2); });
      return split && split->second == x;
    }
    return false;
  }

  // Tanh's argument: sqrt(2/pi) * (x + 0.044715 * x^3), products in any order.
  bool MatchTanhArgument(ValueId arg, ValueId x) {
    const Node* mul = ProducerOf(*g_, arg, OpKind::kMul);
    if (mul == nullptr || !Take(arg)) return false;
    auto split = SplitOperands(*mul, [&](ValueId v) { return IsScalarNear(*g_, v, kSqrt2OverPi); });
    if (!split) return false;
    const ValueId inner = split->second;
    const Node* add = ProducerOf(*g_, inner, OpKind::kAdd);
    if (add == nullptr || !Take(inner)) return false;
    auto cubic_split = SplitOperands(*add, [&](ValueId v) { return v == x; });
    if (!cubic_split) return false;
    const ValueId cubic = cubic_split->second;
    const Node* cubic_node = ProducerOf(*g_, cubic, OpKind::kMul);
    if (cubic_node == nullptr || !Take(cubic)) return false;
    std::vector<ValueId> leaves;
    if (!Flatten(ProducerId(*g_, cubic), /*max_leaves=*/4, &leaves, /*expand_pow=*/true)) return false;
    int coefficient = 0, xs = 0;
    for (ValueId v : leaves) {
      if (v == x) {
        ++xs;
      } else if (IsScalarNear(*g_, v, kTanhCubic)) {
        ++coefficient;
      }
    }
    return leaves.size() == 4 && coefficient == 1 && xs == 3;
  }

  Graph* g_;
  UseInfo uses_;
  std::vector<NodeId> dead_;
};

}  // namespace

absl::StatusOr<bool> GeluFusion::Run(ir::Graph* g) {
  GeluMatcher matcher(g);
  return FuseAtAnchors(g, {OpKind::kMul}, [&](NodeId id) { return matcher.TryAt(id); });
}

}  // namespace onnxpipe::passes
