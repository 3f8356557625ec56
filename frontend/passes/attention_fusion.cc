// The matcher anchors on the final MatMul(P, V) and walks backwards: dropout, the guard of SDPA
// decompositions against fully masked rows (Where(IsNaN(P), 0, P): the fused op already yields
// zeros for such rows), softmax, the chain of scalings and masks on the scores, the Q K^T MatMul, and the pre-scalings and transposes of
// Q and K. All checks happen before the graph is touched; the rewrite (new Transpose/Not nodes,
// the fused node) only runs on a complete match.
//
// Regrouped heads (BLOOM's baddbmm/bmm attention): Q K^T and P V run on (B*H, S, .) while the
// softmax and the padding mask see (B, H, S, S), a Reshape of the scores splitting the leading dim
// and one of P merging it back. With concrete dims the fused op runs in the split form: Q, K, V and
// the masks added in the flat form (ALiBi's (B*H, 1, S) bias) are reshaped to it, and O is
// reshaped back to the flat form the graph reads.

#include "frontend/passes/attention_fusion.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"
#include "frontend/passes/side_eval.h"

namespace onnxpipe::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::Tensor;
using ir::ValueId;

// Fill values at or below this count as "masked" (-inf, finfo.min, BERT's -10000).
constexpr double kVeryNegative = -1e4;
// Fill values at or below this absorb any finite score: fill + score == fill in f32 and f64 for
// |score| < 1e22 (finfo.min of float32 and -inf are; -10000 is not). Only such a fill lets a
// masked_fill join an additive mask (score + fill + mask instead of fill + mask).
constexpr double kAbsorbing = -1e30;

struct AttentionMatch {
  std::vector<NodeId> dead;
  double scale = 1.0;
  double dropout = 0.0;
  ValueId q = ir::kNoValue, v = ir::kNoValue;
  ValueId k_source = ir::kNoValue;  // K, or the value a new Transpose turns into K
  std::vector<int64_t> k_perm;       // empty: k_source is K
  std::vector<ValueId> additive;     // additive masks as found (T5 adds a bias and a padding mask)
  ValueId bool_cond = ir::kNoValue;  // Where condition as found
  bool bool_cond_means_masked = false;  // masked_fill: condition true = masked
  ValueId bool_fill = ir::kNoValue;     // the Where's fill value for masked scores
  // Regrouped heads (see the file comment): the leading dims of the flat form (Q, K, V, O) and of
  // the split form (the softmax's); both empty when the scores are not reshaped.
  std::vector<int64_t> lead_flat, lead_split;
  bool below_split = false;              // the walk has passed the scores' Reshape
  std::vector<ValueId> additive_flat;    // additive masks added in the flat form
  std::vector<int64_t> q_split, k_split, v_split, o_split, o_flat;  // their dims in the split form; O's
};

class AttentionMatcher {
 public:
  AttentionMatcher(Graph* g, SideEvaluator* side) : g_(g), uses_(*g), side_(side) {}

  absl::StatusOr<bool> TryAt(NodeId root) {
    AttentionMatch m;
    if (!Match(root, &m)) return false;
    return Rewrite(root, m);
  }

 private:
  bool Take(ValueId v, AttentionMatch* m) {
    const NodeId p = PatternProducer(*g_, uses_, v);
    if (p == ir::kNoNode) return false;
    m->dead.push_back(p);
    return true;
  }

  // Scalar constants that are not parameters (a learned temperature must stay a graph value).
  std::optional<double> FrozenScalar(ValueId v) const {
    if (!IsFrozenConstant(*g_, v)) return std::nullopt;
    return ScalarConstant(*g_, v);
  }

  // If `v` is Mul(x, c) / Mul(c, x) / Div(x, c) with a frozen scalar c, returns {x, factor}.
  std::optional<std::pair<ValueId, double>> ScalarScaling(ValueId v) const {
    const Node* n = ProducerOf(*g_, v);
    if (n == nullptr) return std::nullopt;
    if (n->op == OpKind::kMul) {
      auto split = SplitOperands(*n, [&](ValueId w) { return FrozenScalar(w).has_value(); });
      if (split) return std::make_pair(split->second, *FrozenScalar(split->first));
    } else if (n->op == OpKind::kDiv) {
      std::optional<double> c = FrozenScalar(n->inputs[1]);
      if (c && *c != 0) return std::make_pair(n->inputs[0], 1.0 / *c);
    }
    return std::nullopt;
  }

  // Strips single-use scalar scalings from `v`, multiplying them into the scale.
  ValueId AbsorbScalings(ValueId v, AttentionMatch* m) {
    while (auto s = ScalarScaling(v)) {
      if (!Take(v, m)) break;
      m->scale *= s->second;
      v = s->first;
    }
    return v;
  }

  bool IsVeryNegative(ValueId v) const {
    std::optional<double> c = FrozenScalar(v);
    return c.has_value() && *c <= kVeryNegative;
  }

  // True when the backward chain from `v` through single-use scalings, Adds and Wheres reaches a
  // MatMul: that operand of an Add is the scores, the other the mask.
  bool LeadsToScores(ValueId v, int depth = 0) const {
    if (depth > 8) return false;
    const Node* n = ProducerOf(*g_, v);
    if (n == nullptr) return false;
    if (n->op == OpKind::kMatMul) return true;
    if (!uses_.HasSingleUse(v)) return false;
    switch (n->op) {
      case OpKind::kMul:
      case OpKind::kDiv:
        return ScalarScaling(v).has_value() && LeadsToScores(ScalarScaling(v)->first, depth + 1);
      case OpKind::kAdd:
        return LeadsToScores(n->inputs[0], depth + 1) || LeadsToScores(n->inputs[1], depth + 1);
      case OpKind::kWhere:
        return LeadsToScores(n->inputs[1], depth + 1) || LeadsToScores(n->inputs[2], depth + 1);
      case OpKind::kReshape:
        return LeadsToScores(n->inputs[0], depth + 1);
      default:
        return false;
    }
  }

  // Concrete dims of `v`, if known.
  std::optional<std::vector<int64_t>> ConcreteDims(ValueId v) const {
    const ir::Value& val = g_->value(v);
    if (!val.shape_known) return std::nullopt;
    for (const ir::Dim& d : val.shape)
      if (!d.is_concrete()) return std::nullopt;
    return ir::ToInts(val.shape);
  }

  // {leading dims of `from`, leading dims of `to`} when `to` = Reshape(`from`) only regroups the
  // dims before the last two (both concrete, rank >= 3 on the split side), else nullopt.
  std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> LeadRegroup(ValueId from, ValueId to) const {
    std::optional<std::vector<int64_t>> a = ConcreteDims(from), b = ConcreteDims(to);
    if (!a || !b || a->size() < 2 || b->size() < 2 || a->size() == b->size()) return std::nullopt;
    if (!std::equal(a->end() - 2, a->end(), b->end() - 2)) return std::nullopt;
    std::vector<int64_t> la(a->begin(), a->end() - 2), lb(b->begin(), b->end() - 2);
    if (ir::ElementCount(la) != ir::ElementCount(lb)) return std::nullopt;
    return std::make_pair(std::move(la), std::move(lb));
  }

  std::optional<int64_t> RankOf(ValueId v) const {
    const ir::Value& val = g_->value(v);
    if (!val.shape_known) return std::nullopt;
    return static_cast<int64_t>(val.shape.size());
  }

  // If `p` is Where(IsNaN(x), 0, x) with x used only there, takes both nodes and returns x.
  std::optional<ValueId> StripNanGuard(ValueId p, AttentionMatch* m) {
    const Node* where = ProducerOf(*g_, p, OpKind::kWhere);
    if (where == nullptr || !uses_.HasSingleUse(p)) return std::nullopt;
    const ValueId x = where->inputs[2];
    const Node* isnan = ProducerOf(*g_, where->inputs[0], OpKind::kIsNaN);
    if (isnan == nullptr || isnan->inputs[0] != x || !uses_.HasSingleUse(where->inputs[0])) return std::nullopt;
    if (uses_.NumUses(x) != 2 || g_->IsGraphOutput(x)) return std::nullopt;
    std::optional<double> zero = FrozenScalar(where->inputs[1]);
    if (!zero || *zero != 0.0) return std::nullopt;
    m->dead.push_back(ProducerId(*g_, p));
    m->dead.push_back(ProducerId(*g_, where->inputs[0]));
    return x;
  }

  // K when `kt` is K with its last two dims swapped through a flattening, as torch's dynamo exporter
  // writes K^T for SDPA: Reshape(Transpose(Reshape(K, (N, Sk, Dh)), perm [0, 2, 1]), (..., Dh, Sk)),
  // N the product of K's leading dims. The three nodes join the pattern (each output used once).
  std::optional<ValueId> SwappedThroughReshapes(ValueId kt, AttentionMatch* m) {
    const Node* split = ProducerOf(*g_, kt, OpKind::kReshape);
    if (split == nullptr) return std::nullopt;
    const ValueId tv = split->inputs[0];
    const Node* t = ProducerOf(*g_, tv, OpKind::kTranspose);
    if (t == nullptr || t->attrs.Get<std::vector<int64_t>>("perm") != std::vector<int64_t>{0, 2, 1}) return std::nullopt;
    const ValueId flat = t->inputs[0];
    const Node* merge = ProducerOf(*g_, flat, OpKind::kReshape);
    if (merge == nullptr) return std::nullopt;
    const ValueId k = merge->inputs[0];
    const ir::Value &kv = g_->value(k), &fv = g_->value(flat), &ktv = g_->value(kt);
    if (!kv.shape_known || !fv.shape_known || !ktv.shape_known || kv.shape.size() < 3 || fv.shape.size() != 3)
      return std::nullopt;
    const size_t r = kv.shape.size();
    const ir::Shape lead(kv.shape.begin(), kv.shape.end() - 2);
    if (fv.shape[0] != ir::NumElements(lead) || fv.shape[1] != kv.shape[r - 2] || fv.shape[2] != kv.shape[r - 1])
      return std::nullopt;
    ir::Shape swapped = lead;
    swapped.push_back(kv.shape[r - 1]);
    swapped.push_back(kv.shape[r - 2]);
    if (ktv.shape != swapped) return std::nullopt;
    if (!uses_.HasSingleUse(kt) || !uses_.HasSingleUse(tv) || !uses_.HasSingleUse(flat)) return std::nullopt;
    for (ValueId v : {kt, tv, flat}) m->dead.push_back(ProducerId(*g_, v));
    return k;
  }

  bool Match(NodeId root, AttentionMatch* m) {
    const Node& pv = g_->node(root);
    ValueId p = pv.inputs[0];
    m->v = pv.inputs[1];
    // P merged from the split form: Reshape((B, H, Sq, Sk) -> (B*H, Sq, Sk)).
    if (const Node* merge = ProducerOf(*g_, p, OpKind::kReshape); merge != nullptr && uses_.HasSingleUse(p)) {
      auto lead = LeadRegroup(merge->inputs[0], p);
      if (!lead || lead->first.size() <= lead->second.size()) return false;
      m->lead_split = lead->first;
      m->lead_flat = lead->second;
      if (!Take(p, m)) return false;
      p = merge->inputs[0];
    }
    // Optional dropout on the probabilities; its mask output must be unused.
    if (const Node* drop = ProducerOf(*g_, p, OpKind::kDropout)) {
      if (drop->outputs.size() > 1 && drop->outputs[1] != ir::kNoValue && uses_.NumUses(drop->outputs[1]) > 0)
        return false;
      m->dropout = drop->attrs.Get<double>("ratio", 0.5);
      if (!Take(p, m)) return false;
      p = drop->inputs[0];
    }
    std::optional<ValueId> unguarded = StripNanGuard(p, m);
    if (unguarded) p = *unguarded;
    const Node* softmax = ProducerOf(*g_, p, OpKind::kSoftmax);
    if (softmax == nullptr) return false;
    if (unguarded) {
      m->dead.push_back(ProducerId(*g_, p));  // its two uses are the guard's, taken above
    } else if (!Take(p, m)) {
      return false;
    }
    ValueId s = softmax->inputs[0];
    const int64_t axis = softmax->attrs.Get<int64_t>("axis", -1);
    if (axis != -1) {
      std::optional<int64_t> rank = RankOf(s);
      if (!rank || NormalizeAxis(axis, *rank) != *rank - 1) return false;
    }
    // Scores chain, walked from the softmax towards Q K^T (i.e. against the data flow).
    bool scaled = false;
    while (true) {
      const Node* n = ProducerOf(*g_, s);
      if (n == nullptr) return false;
      if (n->op == OpKind::kMatMul) break;
      if (!uses_.HasSingleUse(s)) return false;
      if (auto sc = ScalarScaling(s)) {
        Take(s, m);
        if (sc->second != 1.0) {
          m->scale *= sc->second;
          scaled = true;
        }
        s = sc->first;
      } else if (n->op == OpKind::kAdd) {
        // A mask added before a scaling would be scaled with the scores.
        if (scaled) return false;
        const bool lhs = LeadsToScores(n->inputs[0]), rhs = LeadsToScores(n->inputs[1]);
        if (lhs == rhs) return false;
        Take(s, m);
        ValueId mask = lhs ? n->inputs[1] : n->inputs[0];
        s = lhs ? n->inputs[0] : n->inputs[1];
        // baddbmm's beta: Mul(mask, 1).
        if (auto sc = ScalarScaling(mask); sc && sc->second == 1.0 && uses_.HasSingleUse(mask)) {
          Take(mask, m);
          mask = sc->first;
        }
        (m->below_split ? m->additive_flat : m->additive).push_back(mask);
      } else if (n->op == OpKind::kReshape) {
        // The scores split from the flat form, the inverse of P's merge.
        if (m->lead_split.empty() || m->below_split) return false;
        auto lead = LeadRegroup(n->inputs[0], s);
        if (!lead || lead->first != m->lead_flat || lead->second != m->lead_split) return false;
        Take(s, m);
        m->below_split = true;
        s = n->inputs[0];
      } else if (n->op == OpKind::kWhere) {
        if (scaled || m->bool_cond != ir::kNoValue || m->below_split) return false;
        if (g_->value(n->inputs[0]).dtype != ir::DType::kBool) return false;
        Take(s, m);
        m->bool_cond = n->inputs[0];
        if (IsVeryNegative(n->inputs[1])) {
          m->bool_cond_means_masked = true;
          m->bool_fill = n->inputs[1];
          s = n->inputs[2];
        } else if (IsVeryNegative(n->inputs[2])) {
          m->bool_cond_means_masked = false;
          m->bool_fill = n->inputs[2];
          s = n->inputs[1];
        } else {
          return false;
        }
      } else {
        return false;
      }
    }
    if (!Take(s, m)) return false;
    const Node& qk = g_->node(ProducerId(*g_, s));
    m->q = AbsorbScalings(qk.inputs[0], m);
    ValueId kt = AbsorbScalings(qk.inputs[1], m);
    if (std::optional<ValueId> k = SwappedThroughReshapes(kt, m)) {
      m->k_source = AbsorbScalings(*k, m);  // K itself: no transpose needed
    } else if (const Node* t = ProducerOf(*g_, kt, OpKind::kTranspose)) {
      const ValueId src = t->inputs[0];
      std::optional<int64_t> rank = RankOf(src);
      std::vector<int64_t> perm = t->attrs.Get<std::vector<int64_t>>("perm");
      if (perm.empty()) {
        if (!rank) return false;
        perm.resize(*rank);
        std::iota(perm.rbegin(), perm.rend(), 0);
      }
      if (perm.size() < 2) return false;
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      // K's own pre-scaling can go only if the transpose goes with it.
      if (uses_.HasSingleUse(kt)) {
        m->dead.push_back(ProducerId(*g_, kt));
        m->k_source = AbsorbScalings(src, m);
      } else {
        m->k_source = src;
      }
      bool identity = true;
      for (size_t i = 0; i < perm.size(); ++i) identity &= perm[i] == static_cast<int64_t>(i);
      if (!identity) m->k_perm = perm;
    } else {
      std::optional<int64_t> rank = RankOf(kt);
      if (!rank || *rank < 2) return false;
      m->k_perm.resize(*rank);
      std::iota(m->k_perm.begin(), m->k_perm.end(), 0);
      std::swap(m->k_perm[*rank - 1], m->k_perm[*rank - 2]);
      m->k_source = kt;
    }
    // Q, K^T and V must agree in rank (the fused op does not broadcast batch dims between them).
    std::optional<int64_t> rq = RankOf(m->q), rk = RankOf(qk.inputs[1]), rv = RankOf(m->v);
    if (rq && rk && *rq != *rk) return false;
    if (rq && rv && *rq != *rv) return false;
    if (!m->lead_split.empty()) {
      // A merge of P without the matching split of the scores is not the regrouped form.
      if (!m->below_split) return false;
      std::optional<std::vector<int64_t>> q = ConcreteDims(m->q), kt = ConcreteDims(qk.inputs[1]),
                                          v = ConcreteDims(m->v), o = ConcreteDims(pv.outputs[0]);
      for (const auto& d : {q, kt, v, o}) {
        if (!d || d->size() != m->lead_flat.size() + 2 || !std::equal(m->lead_flat.begin(), m->lead_flat.end(), d->begin()))
          return false;
      }
      auto split = [&](const std::vector<int64_t>& d, bool swap_last) {
        std::vector<int64_t> out = m->lead_split;
        out.push_back(d[d.size() - (swap_last ? 1 : 2)]);
        out.push_back(d[d.size() - (swap_last ? 2 : 1)]);
        return out;
      };
      m->q_split = split(*q, /*swap_last=*/false);
      m->k_split = split(*kt, /*swap_last=*/true);  // K is K^T with its last two dims swapped
      m->v_split = split(*v, /*swap_last=*/false);
      m->o_split = split(*o, /*swap_last=*/false);
      m->o_flat = *o;
      for (ValueId a : m->additive_flat)
        if (!SplitDims(*m, a)) return false;
    }
    const ir::DType dtype = g_->value(pv.outputs[0]).dtype;
    if (g_->value(m->q).dtype != dtype || g_->value(m->v).dtype != dtype ||
        g_->value(m->k_source).dtype != dtype) {
      return false;
    }
    return true;
  }

  // The split-form dims of `v`, a flat-form operand (leading dims lead_flat, or all 1 for a mask
  // that broadcasts over them), else nullopt.
  std::optional<std::vector<int64_t>> SplitDims(const AttentionMatch& m, ValueId v) const {
    std::optional<std::vector<int64_t>> d = ConcreteDims(v);
    if (!d || d->size() < 2) return std::nullopt;
    const size_t lead = d->size() - 2;
    std::vector<int64_t> out;
    if (lead == m.lead_flat.size() && std::equal(d->begin(), d->end() - 2, m.lead_flat.begin())) {
      out = m.lead_split;
    } else if (std::all_of(d->begin(), d->end() - 2, [](int64_t x) { return x == 1; })) {
      out.assign(m.lead_split.size(), 1);
    } else {
      return std::nullopt;
    }
    out.insert(out.end(), d->end() - 2, d->end());
    return out;
  }

  // Reshape(v, dims) with a constant shape.
  ValueId ReshapeTo(const std::string& name, ValueId v, const std::vector<int64_t>& dims) {
    const ValueId shape = g_->AddConstant(g_->UniqueName(name + "_shape"),
                                          Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims));
    return AddNodeWithOutput(g_, OpKind::kReshape, name, {v, shape}, {}, g_->value(v).dtype, ir::FromInts(dims), true);
  }

  // Dims (Sq, Sk) of the scores, where known.
  std::pair<std::optional<int64_t>, std::optional<int64_t>> ScoreDims(NodeId root) const {
    const ir::Value& q = g_->value(g_->node(root).inputs[0]);  // P: (..., Sq, Sk)
    std::optional<int64_t> sq, sk;
    if (q.shape_known && q.shape.size() >= 2) {
      if (q.shape[q.shape.size() - 2].is_concrete()) sq = q.shape[q.shape.size() - 2].value();
      if (q.shape.back().is_concrete()) sk = q.shape.back().value();
    }
    return {sq, sk};
  }

  // True when the constant mask `t` (additive, or boolean with true = attend) is exactly the
  // causal pattern for scores of `dims` in every slice over its leading dims (any extents: the
  // (B, 1, S, S) mask a Hugging Face export materialises has one copy per batch row).
  static bool IsCausal(const Tensor& t, bool additive,
                       std::pair<std::optional<int64_t>, std::optional<int64_t>> dims) {
    if (t.rank() < 2) return false;
    const int64_t n = t.dims()[t.rank() - 2];
    if (t.dims().back() != n) return false;
    // A size-1 mask broadcasts to any length; only a full square proves the pattern.
    if (dims.first ? *dims.first != n : n < 2) return false;
    if (dims.second ? *dims.second != n : n < 2) return false;
    const int64_t slices = n > 0 ? t.num_elements() / (n * n) : 0;
    for (int64_t s = 0; s < slices; ++s) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double x = t.GetAsDouble((s * n + i) * n + j);
          if (additive) {
            if (j <= i ? x != 0.0 : !(x <= kVeryNegative)) return false;
          } else if ((x != 0.0) != (j <= i)) {
            return false;
          }
        }
      }
    }
    return true;
  }

  static Tensor Negate(const Tensor& t) {
    Tensor out(ir::DType::kBool, t.dims());
    for (int64_t i = 0; i < t.num_elements(); ++i) out.mutable_data<bool>()[i] = t.GetAsDouble(i) == 0.0;
    return out;
  }

  // The mask's data: constant, or computed on the side from initializers when an evaluator is
  // available (never committed to the graph).
  absl::StatusOr<std::optional<Tensor>> MaskData(ValueId v) {
    const ir::Value& val = g_->value(v);
    if (val.constant) return std::optional<Tensor>(*val.constant);
    if (side_ == nullptr) return std::optional<Tensor>();
    return side_->Compute(v);
  }

  // a + b for two additive masks (numpy broadcasting; the shape is left to shape inference when
  // the operands' dims do not settle it).
  ValueId AddMasks(const std::string& name, ValueId a, ValueId b) {
    const ir::Value &av = g_->value(a), &bv = g_->value(b);
    ir::Shape shape;
    bool known = av.shape_known && bv.shape_known;
    if (known) {
      const size_t rank = std::max(av.shape.size(), bv.shape.size());
      for (size_t i = 0; i < rank && known; ++i) {
        const ir::Dim one(1);
        const ir::Dim& x = i + av.shape.size() >= rank ? av.shape[i + av.shape.size() - rank] : one;
        const ir::Dim& y = i + bv.shape.size() >= rank ? bv.shape[i + bv.shape.size() - rank] : one;
        if (x == y || y == one) {
          shape.push_back(x);
        } else if (x == one) {
          shape.push_back(y);
        } else {
          known = false;
        }
      }
    }
    return AddNodeWithOutput(g_, OpKind::kAdd, name, {a, b}, {}, av.dtype, known ? shape : ir::Shape{}, known);
  }

  // The boolean condition of `m` as an additive mask in its fill's dtype: 0 where it keeps, the fill
  // where it masks. A constant when the keep mask is (`keep`), else Where(condition, ...).
  ValueId BoolAsAdditive(const std::string& name, const AttentionMatch& m, const std::optional<Tensor>& keep) {
    const ir::Value& fill = g_->value(m.bool_fill);
    const double f = *FrozenScalar(m.bool_fill);
    if (keep) {
      Tensor t(ir::DType::kF64, keep->dims());
      for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<double>()[i] = keep->GetAsDouble(i) != 0 ? 0.0 : f;
      return g_->AddConstant(g_->UniqueName(name + "_window_mask"), t.CastTo(fill.dtype));
    }
    const ValueId zero = g_->AddConstant(g_->UniqueName(name + "_zero"), Tensor::Scalar<double>(0.0).CastTo(fill.dtype));
    const ir::Value& c = g_->value(m.bool_cond);
    std::vector<ValueId> in = m.bool_cond_means_masked ? std::vector<ValueId>{m.bool_cond, m.bool_fill, zero}
                                                       : std::vector<ValueId>{m.bool_cond, zero, m.bool_fill};
    return AddNodeWithOutput(g_, OpKind::kWhere, name + "_condition_mask", std::move(in), {}, fill.dtype, c.shape,
                             c.shape_known);
  }

  absl::StatusOr<bool> Rewrite(NodeId root, const AttentionMatch& m) {
    const std::string name = g_->node(root).name;
    const auto dims = ScoreDims(root);
    bool causal = false;
    ValueId mask = ir::kNoValue;
    std::string mask_kind;
    // Additive masks: a provably causal one sets causal, the others are summed into the mask input.
    std::vector<ValueId> additive;
    for (ValueId a : m.additive) {
      // A mask computed from parameters is never read as a constant: it is trained.
      std::optional<Tensor> data;
      if (!DependsOnParameter(*g_, a)) {
        ASSIGN_OR_RETURN(data, MaskData(a));
      }
      if (!causal && data && IsCausal(*data, /*additive=*/true, dims)) {
        causal = true;
      } else {
        additive.push_back(a);  // possibly a learned bias (T5's relative positions): dMask trains it
      }
    }
    // Masks added on merged heads (regrouped form) are additive too; reshaped below.
    const bool any_additive = !additive.empty() || !m.additive_flat.empty();
    // Boolean mask, normalised to true = attend.
    std::optional<Tensor> keep_const;
    bool bool_as_additive = false;  // a non-causal condition beside additive masks (below)
    if (m.bool_cond != ir::kNoValue) {
      ASSIGN_OR_RETURN(std::optional<Tensor> c, MaskData(m.bool_cond));
      bool consumed = false;
      if (c) {
        if (IsCausal(m.bool_cond_means_masked ? Negate(*c) : *c, /*additive=*/false, dims)) {
          causal = true;
          consumed = true;
        } else if (g_->value(m.bool_cond).constant) {
          keep_const = m.bool_cond_means_masked ? Negate(*c) : *c;
        }
      }
      if (!consumed && any_additive) {
        // GPT-Neo's local layers: a banded (windowed causal) condition and the padding mask. The
        // condition becomes one more additive mask, 0 where it keeps and its fill where it masks;
        // exact only when the fill absorbs the score it is now added to.
        std::optional<double> fill = FrozenScalar(m.bool_fill);
        if (!fill || !(*fill <= kAbsorbing)) return false;
        bool_as_additive = true;
      } else if (!consumed) {
        mask_kind = "bool";
        mask = m.bool_cond;  // replaced below by a constant or a Not when it needs negating
      }
    }

    // The match is complete; mutate the graph. The additive masks are summed into the mask input.
    for (ValueId a : m.additive_flat) additive.push_back(ReshapeTo(name + "_split_mask", a, *SplitDims(m, a)));
    if (bool_as_additive) additive.push_back(BoolAsAdditive(name, m, keep_const));
    if (!additive.empty()) {
      mask = additive[0];
      mask_kind = "additive";
    }
    for (size_t i = 1; i < additive.size(); ++i) mask = AddMasks(name + "_mask_sum", mask, additive[i]);
    if (mask_kind == "bool" && m.bool_cond_means_masked) {
      if (keep_const) {
        mask = g_->AddConstant(g_->UniqueName(name + "_keep_mask"), *keep_const);
      } else {
        const ir::Value& c = g_->value(m.bool_cond);
        mask = AddNodeWithOutput(g_, OpKind::kNot, name + "_keep_mask", {m.bool_cond}, {},
                                 ir::DType::kBool, c.shape, c.shape_known);
      }
    }
    ValueId k = m.k_source;
    if (!m.k_perm.empty()) {
      const ir::Value& src = g_->value(m.k_source);
      ir::Shape shape;
      if (src.shape_known && src.shape.size() == m.k_perm.size())
        for (int64_t a : m.k_perm) shape.push_back(src.shape[a]);
      ir::Attrs attrs;
      attrs.Set("perm", m.k_perm);
      k = AddNodeWithOutput(g_, OpKind::kTranspose, name + "_k_transpose", {m.k_source}, std::move(attrs),
                            src.dtype, shape, src.shape_known && shape.size() == m.k_perm.size());
    }
    std::vector<ValueId> inputs = {m.q, k, m.v};
    const bool regrouped = !m.lead_split.empty();
    if (regrouped) {
      inputs[0] = ReshapeTo(name + "_split_q", m.q, m.q_split);
      inputs[1] = ReshapeTo(name + "_split_k", k, m.k_split);
      inputs[2] = ReshapeTo(name + "_split_v", m.v, m.v_split);
    }
    ir::Attrs attrs;
    attrs.Set("scale", m.scale);
    attrs.Set("causal", int64_t{causal ? 1 : 0});
    attrs.Set("dropout", m.dropout);
    if (mask != ir::kNoValue) {
      inputs.push_back(mask);
      attrs.Set("mask_kind", mask_kind);
    }
    if (!regrouped) {
      ReplaceWithFused(g_, root, m.dead, OpKind::kAttention, std::move(inputs), std::move(attrs));
    } else {
      // O in the split form, merged back into the flat value the graph reads.
      const ValueId out = g_->node(root).outputs[0];
      const ValueId o_split =
          g_->AddValue(g_->UniqueName(name + "_split_output"), g_->value(out).dtype, ir::FromInts(m.o_split), true);
      for (NodeId d : m.dead)
        if (d != root && !g_->node(d).removed) g_->RemoveNode(d);
      g_->RemoveNode(root);
      g_->AddNode(OpKind::kAttention, name, std::move(inputs), {o_split}, std::move(attrs));
      const ValueId shape = g_->AddConstant(
          g_->UniqueName(name + "_merge_shape"),
          Tensor::FromVector<int64_t>({static_cast<int64_t>(m.o_flat.size())}, m.o_flat));
      g_->AddNode(OpKind::kReshape, g_->UniqueName(name + "_merge_heads"), {o_split, shape}, {out});
    }
    uses_.Refresh();
    return true;
  }

  Graph* g_;
  UseInfo uses_;
  SideEvaluator* side_;
};

}  // namespace

absl::StatusOr<bool> AttentionFusion::Run(ir::Graph* g) {
  std::optional<SideEvaluator> side;
  if (evaluator_ != nullptr) side.emplace(*g, *evaluator_, max_mask_elements_);
  AttentionMatcher matcher(g, side ? &*side : nullptr);
  bool changed = false;
  for (NodeId id : g->LiveNodes()) {
    if (g->node(id).removed || g->node(id).op != OpKind::kMatMul) continue;
    ASSIGN_OR_RETURN(bool fused, matcher.TryAt(id));
    changed |= fused;
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
