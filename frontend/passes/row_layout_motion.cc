#include "frontend/passes/row_layout_motion.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "frontend/ir/shape.h"
#include "frontend/ir/tensor.h"
#include "frontend/passes/layout_ops.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// Chains are a handful of ops in the exports; the bound keeps a pathological graph linear.
constexpr int kMaxChain = 16;

// A node whose output rows are computed independently from the rows of its input 0: Linear, or a
// MatMul by a rank-2 matrix.
bool IsRowWise(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.size() != 1 || n.inputs.empty()) return false;
  const std::optional<std::vector<int64_t>> x = ConcreteDims(g, n.inputs[0]);
  if (!x || x->size() < 2 || !ConcreteDims(g, n.outputs[0])) return false;
  if (n.op == OpKind::kLinear) return n.inputs.size() < 2 || n.inputs[1] != n.inputs[0];
  if (n.op != OpKind::kMatMul || n.inputs.size() != 2 || n.inputs[1] == n.inputs[0]) return false;
  const std::optional<std::vector<int64_t>> w = ConcreteDims(g, n.inputs[1]);
  return w && w->size() == 2;
}

// A layout op that keeps each row of its input whole (the last dim in place): a Transpose whose
// permutation fixes the last axis, or a reshape-like op keeping the last dim.
bool MovesRowsOnly(const ir::Graph& g, const ir::Node& n) {
  if (n.outputs.size() != 1 || n.inputs.empty()) return false;
  if (n.op == OpKind::kReshape && n.inputs.size() > 1 && n.inputs[1] == n.inputs[0]) return false;
  const std::optional<std::vector<int64_t>> in = ConcreteDims(g, n.inputs[0]), out = ConcreteDims(g, n.outputs[0]);
  // Width 1 rows could be squeezed away: left alone.
  if (!in || !out || in->empty() || out->empty() || in->back() != out->back() || in->back() == 1) return false;
  if (n.op == OpKind::kTranspose) {
    const std::vector<int64_t> perm = TransposePerm(n, in->size());
    return perm.size() == in->size() && perm.back() == static_cast<int64_t>(in->size()) - 1;
  }
  return ReshapesData(n.op);
}

bool IsLayout(OpKind op) {
  return ReshapesData(op) || op == OpKind::kTranspose || op == OpKind::kSplit || op == OpKind::kGather;
}

// Whether every use of `v` is a Q, K or V operand of an Attention, directly or through layout ops.
bool OnlyFeedsAttention(const ir::Graph& g, const UseInfo& uses, ValueId v, int depth = 0) {
  if (depth > kMaxChain || g.IsGraphOutput(v) || uses.NumUses(v) == 0) return false;
  for (NodeId c : uses.Consumers(v)) {
    const ir::Node& n = g.node(c);
    if (n.op == OpKind::kAttention) {
      for (size_t i = 3; i < n.inputs.size(); ++i)
        if (n.inputs[i] == v) return false;
      continue;
    }
    if (!IsLayout(n.op) || n.inputs[0] != v) return false;
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (n.inputs[i] == v) return false;
    for (ValueId o : n.outputs)
      if (o != ir::kNoValue && uses.NumUses(o) > 0 && !OnlyFeedsAttention(g, uses, o, depth + 1)) return false;
  }
  return true;
}

// Whether `v` is an Attention's output through single-use layout ops.
bool FromAttention(const ir::Graph& g, const UseInfo& uses, ValueId v) {
  for (int depth = 0; depth <= kMaxChain; ++depth) {
    const ir::Node* p = ProducerOf(g, v);
    if (p == nullptr || !uses.HasSingleUse(v)) return false;
    if (p->op == OpKind::kAttention) return p->outputs[0] == v;
    if (!ReshapesData(p->op) && p->op != OpKind::kTranspose) return false;
    v = p->inputs[0];
  }
  return false;
}

// `dims` with the last one replaced by `width`.
std::vector<int64_t> WithWidth(std::vector<int64_t> dims, int64_t width) {
  dims.back() = width;
  return dims;
}

void SetDims(ir::Graph* g, ValueId v, const std::vector<int64_t>& dims) {
  g->value(v).shape = ir::FromInts(dims);
  g->value(v).shape_known = true;
}

// Makes layout node `id` produce `dims` (its rows as before, `dims`' width): a Reshape gets a shape
// constant of its own.
void Rewiden(ir::Graph* g, NodeId id, const std::vector<int64_t>& dims) {
  ir::Node& n = g->node(id);
  if (n.op == OpKind::kReshape && n.inputs.size() > 1) {
    const int64_t rank = static_cast<int64_t>(dims.size());
    n.inputs[1] = g->AddConstant(g->UniqueName(n.name + "_shape"), ir::Tensor::FromVector<int64_t>({rank}, dims));
  }
}

// x -> T -> P -> y  becomes  x -> P -> y' -> T -> y.
bool MoveUp(ir::Graph* g, const UseInfo& uses, NodeId t_id) {
  const ir::Node& t = g->node(t_id);
  if (t.op != OpKind::kTranspose || !MovesRowsOnly(*g, t) || !uses.HasSingleUse(t.outputs[0])) return false;
  const NodeId p_id = uses.Consumers(t.outputs[0])[0];
  const ir::Node& p = g->node(p_id);
  if (!IsRowWise(*g, p) || p.inputs[0] != t.outputs[0] || ConcreteDims(*g, p.outputs[0])->back() == 1 ||
      !OnlyFeedsAttention(*g, uses, p.outputs[0])) {
    return false;
  }
  const ValueId x = t.inputs[0], y = p.outputs[0];
  const ir::Value& yv = g->value(y);
  const ValueId wide = g->AddValue(g->UniqueName(yv.name + "_rows"), yv.dtype, {});
  SetDims(g, wide, WithWidth(*ConcreteDims(*g, x), ConcreteDims(*g, y)->back()));
  g->node(p_id).inputs[0] = x;
  SetOutput(g, p_id, 0, wide);
  g->node(t_id).inputs[0] = wide;
  SetOutput(g, t_id, 0, y);
  return true;
}

// a -> P -> z -> R1..Rk -> w  becomes  a -> R1'..Rk' -> P -> w, for the longest run of single-use row
// layout ops after P that ends with a Transpose.
bool MoveDown(ir::Graph* g, const UseInfo& uses, NodeId p_id) {
  const ir::Node& p = g->node(p_id);
  if (!IsRowWise(*g, p) || !FromAttention(*g, uses, p.inputs[0])) return false;
  std::vector<NodeId> run;
  size_t keep = 0;
  for (ValueId cur = p.outputs[0]; uses.HasSingleUse(cur) && run.size() < kMaxChain;) {
    const NodeId c = uses.Consumers(cur)[0];
    const ir::Node& cn = g->node(c);
    if (!MovesRowsOnly(*g, cn) || cn.inputs[0] != cur) break;
    run.push_back(c);
    if (cn.op == OpKind::kTranspose) keep = run.size();
    cur = cn.outputs[0];
  }
  run.resize(keep);
  const int64_t width = ConcreteDims(*g, p.inputs[0])->back();
  if (run.empty() || width == 1) return false;
  const ValueId a = p.inputs[0], w = g->node(run.back()).outputs[0];
  const ir::Value& wv = g->value(w);
  const ValueId narrow = g->AddValue(g->UniqueName(wv.name + "_rows"), wv.dtype, {});
  ValueId prev = a;
  for (NodeId c : run) {
    ir::Node& cn = g->node(c);
    const std::vector<int64_t> dims = WithWidth(*ConcreteDims(*g, cn.outputs[0]), width);
    cn.inputs[0] = prev;
    if (c == run.back()) SetOutput(g, c, 0, narrow);
    SetDims(g, cn.outputs[0], dims);
    Rewiden(g, c, dims);
    prev = cn.outputs[0];
  }
  g->node(p_id).inputs[0] = narrow;
  SetOutput(g, p_id, 0, w);
  return true;
}

// A table of Rotary (cos or sin, dims right-aligned against X's `rank`) as it must be for X read
// before the Transpose `perm`: padded to the rank with leading 1s, then permuted by the inverse of
// `perm`. A Reshape where that only moves dims of extent 1 (Llama's (B, 1, S, R) tables), else a
// Reshape to the full rank then a Transpose.
ValueId TableBeforeTranspose(ir::Graph* g, ValueId table, size_t rank, const std::vector<int64_t>& perm) {
  std::vector<int64_t> padded = *ConcreteDims(*g, table);
  padded.insert(padded.begin(), rank - padded.size(), 1);
  std::vector<int64_t> inverse(rank), permuted(rank);
  for (size_t d = 0; d < rank; ++d) inverse[perm[d]] = static_cast<int64_t>(d);
  for (size_t d = 0; d < rank; ++d) permuted[d] = padded[inverse[d]];
  std::vector<int64_t> order;  // the source axes of extent > 1, in the order the result holds them
  for (int64_t a : inverse)
    if (padded[a] != 1) order.push_back(a);
  const std::string name = g->value(table).name + "_rows";
  const ir::DType dtype = g->value(table).dtype;
  auto add = [&](OpKind op, ValueId in, const std::vector<int64_t>& dims, ir::Attrs attrs) {
    std::vector<ValueId> inputs = {in};
    if (op == OpKind::kReshape) {
      inputs.push_back(g->AddConstant(g->UniqueName(name + "_shape"),
                                      ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(rank)}, dims)));
    }
    const ValueId out = g->AddValue(g->UniqueName(name), dtype, {});
    SetDims(g, out, dims);
    g->AddNode(op, g->UniqueName(name), inputs, {out}, std::move(attrs));
    return out;
  };
  if (std::is_sorted(order.begin(), order.end())) return add(OpKind::kReshape, table, permuted, {});
  ir::Attrs attrs;
  attrs.Set("perm", inverse);
  return add(OpKind::kTranspose, add(OpKind::kReshape, table, padded, {}), permuted, std::move(attrs));
}

// x -> T -> Rotary(., cos, sin) -> y  becomes  x -> Rotary(., cos', sin') -> y' -> T -> y: Rotary rotates
// each row on its own, by its position's entry of the tables, so it commutes with a row Transpose whose
// tables follow the rows (cos' and sin', TableBeforeTranspose). Where y only reaches Attention through
// layout ops, the Transpose then joins the chain AttentionLayout absorbs (Llama's Q and K: projection,
// Reshape to (B, S, H, D), Transpose to (B, H, S, D), Rotary).
bool MoveBelowRotary(ir::Graph* g, const UseInfo& uses, NodeId t_id) {
  const ir::Node& t = g->node(t_id);
  if (t.op != OpKind::kTranspose || !MovesRowsOnly(*g, t) || !uses.HasSingleUse(t.outputs[0])) return false;
  const NodeId r_id = uses.Consumers(t.outputs[0])[0];
  const ir::Node& r = g->node(r_id);
  if (r.op != OpKind::kRotary || r.inputs.size() != 3 || r.inputs[0] != t.outputs[0] || r.inputs[1] == r.inputs[0] ||
      r.inputs[2] == r.inputs[0] || !OnlyFeedsAttention(*g, uses, r.outputs[0])) {
    return false;
  }
  const std::optional<std::vector<int64_t>> x = ConcreteDims(*g, t.inputs[0]), cos = ConcreteDims(*g, r.inputs[1]),
                                            sin = ConcreteDims(*g, r.inputs[2]);
  if (!x || !cos || !sin || cos->size() > x->size() || sin->size() > x->size()) return false;
  const std::vector<int64_t> perm = TransposePerm(t, x->size());
  const ValueId in = t.inputs[0], y = r.outputs[0], cos_v = r.inputs[1], sin_v = r.inputs[2];
  const ValueId rows = g->AddValue(g->UniqueName(g->value(y).name + "_rows"), g->value(y).dtype, {});
  SetDims(g, rows, *x);
  const ValueId cos_rows = TableBeforeTranspose(g, cos_v, x->size(), perm);
  const ValueId sin_rows = sin_v == cos_v ? cos_rows : TableBeforeTranspose(g, sin_v, x->size(), perm);
  g->node(r_id).inputs = {in, cos_rows, sin_rows};
  SetOutput(g, r_id, 0, rows);
  g->node(t_id).inputs[0] = rows;
  SetOutput(g, t_id, 0, y);
  return true;
}

}  // namespace

absl::StatusOr<bool> RowLayoutMotion::Run(ir::Graph* g) {
  const bool changed = RewriteEachNode(
      g, [](ir::Graph* g, const UseInfo& uses, NodeId id) {
        return MoveUp(g, uses, id) || MoveDown(g, uses, id) || MoveBelowRotary(g, uses, id);
      });
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

}  // namespace onnxpipe::passes
