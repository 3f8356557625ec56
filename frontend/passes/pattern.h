// Small helpers shared by the passes: producer lookup, use counts, scalar constants compared with a
// tolerance, commutative operand matching, and the bookkeeping of replacing a matched subgraph by
// one fused node.
#pragma once

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {

// Use lists of the live nodes, recomputed on demand after a rewrite.
class UseInfo {
 public:
  explicit UseInfo(const ir::Graph& g) : g_(&g) { Refresh(); }
  void Refresh() { uses_ = g_->ComputeUses(); }

  // Number of operand uses of `v` by live nodes (a node using it twice counts twice), plus one if
  // it is a graph output.
  int NumUses(ir::ValueId v) const;
  // True when `v` is used by exactly one live node operand and is not a graph output: the value is
  // internal to a pattern and disappears with it.
  bool HasSingleUse(ir::ValueId v) const { return uses_[v].size() == 1 && !g_->IsGraphOutput(v); }
  // Distinct live consumer nodes of `v`.
  std::vector<ir::NodeId> Consumers(ir::ValueId v) const;

 private:
  const ir::Graph* g_;
  std::vector<std::vector<ir::NodeId>> uses_;
};

// The live node producing `v` if it has op kind `op`, else nullptr.
const ir::Node* ProducerOf(const ir::Graph& g, ir::ValueId v, ir::OpKind op);
// The live node producing `v` (any op), else nullptr.
const ir::Node* ProducerOf(const ir::Graph& g, ir::ValueId v);
ir::NodeId ProducerId(const ir::Graph& g, ir::ValueId v);
// The producer of `v` when `v` is internal to a pattern (UseInfo::HasSingleUse), else kNoNode:
// the node a matcher takes into its pattern.
ir::NodeId PatternProducer(const ir::Graph& g, const UseInfo& uses, ir::ValueId v);

// Makes `v` output `k` of node `id` (its producer); the value it replaces, if `id` still produced
// it, is left without a producer.
void SetOutput(ir::Graph* g, ir::NodeId id, int k, ir::ValueId v);

// Calls `rewrite` on each node live when it starts, with the use lists refreshed after every
// rewrite that changed the graph (it returns true then); whether any did.
bool RewriteEachNode(ir::Graph* g, const std::function<bool(ir::Graph*, const UseInfo&, ir::NodeId)>& rewrite);

// a and b have known shapes, equal dim for dim (a symbolic dim equals only the same symbol), and one
// dtype: an elementwise op of the two broadcasts nothing.
bool SameShapeAndDType(const ir::Graph& g, ir::ValueId a, ir::ValueId b);

// A Cast from a float dtype to a float dtype.
bool IsFloatCast(const ir::Graph& g, const ir::Node& n);
// Follows float Casts upwards from `v` while each one's output is internal to the pattern,
// adding each Cast to `nodes`; returns the value above the last one taken.
ir::ValueId SkipFloatCasts(const ir::Graph& g, const UseInfo& uses, ir::ValueId v, std::set<ir::NodeId>* nodes);

// The value of `v` when it holds constant data with exactly one element (any rank), as a double.
std::optional<double> ScalarConstant(const ir::Graph& g, ir::ValueId v);
// |a - b| <= rel_tol * max(|a|, |b|) (or both zero).
bool NearlyEqual(double a, double b, double rel_tol = 1e-4);
// True when `v` is a one-element constant within tolerance of `expected`.
bool IsScalarNear(const ir::Graph& g, ir::ValueId v, double expected, double rel_tol = 1e-4);

// For a binary node, if one operand satisfies `pred`, returns {that operand, the other operand}.
// Tries input 0 first, then input 1 (for commutative ops).
template <typename Pred>
std::optional<std::pair<ir::ValueId, ir::ValueId>> SplitOperands(const ir::Node& n, Pred pred) {
  if (n.inputs.size() != 2) return std::nullopt;
  if (pred(n.inputs[0])) return std::make_pair(n.inputs[0], n.inputs[1]);
  if (pred(n.inputs[1])) return std::make_pair(n.inputs[1], n.inputs[0]);
  return std::nullopt;
}

// Float initializers are the model's trainable parameters (DESIGN.md) unless the trainable-parameter
// rule (autodiff/trainable.h, the forward pipeline's first pass) or the user froze them
// (ir::ParamState::kFrozen: buffers and exporter constants). Everything else that holds constant
// data (Constant nodes, integer initializers, folded values, frozen initializers) is a compile-time
// constant for pattern matching.
bool IsParameter(const ir::Value& v);
// True when a gradient could flow from `v` to a parameter: v is one, or a float path of producers
// leads from one to v (integer and bool values carry no gradient and end the walk).
bool DependsOnParameter(const ir::Graph& g, ir::ValueId v);
// Constant data that is not a parameter (a fusion may read it into an attribute).
bool IsFrozenConstant(const ir::Graph& g, ir::ValueId v);
// Constant data that constant folding may compute with: not a float initializer at all. A frozen
// float initializer still is not folded into new float constants: the graph computes with it in the
// precision it is trained in (an fp64 run converts it first), as PyTorch computes with a buffer.
bool IsFoldableConstant(const ir::Graph& g, ir::ValueId v);

// Shape(x) (honouring the opset-15 start/end attrs) as an i64 tensor when x's dims are concrete.
std::optional<ir::Tensor> ConcreteShapeTensor(const ir::Graph& g, const ir::Node& shape_node);

// Normalises a possibly negative axis against `rank`; nullopt when out of range.
std::optional<int64_t> NormalizeAxis(int64_t axis, int64_t rank);

// Replaces the matched subgraph whose result is `root`'s output 0 by one new node: removes `root`
// and every node in `dead` (all must be live; the caller has checked that their outputs are used
// only inside the pattern), then adds `op` with `inputs` and `attrs` producing root's output
// value, named after root. Returns the new node's id. The graph is left unsorted: call
// ir::Graph::TopoSort() once the pass is done.
ir::NodeId ReplaceWithFused(ir::Graph* g, ir::NodeId root, const std::vector<ir::NodeId>& dead, ir::OpKind op,
                            std::vector<ir::ValueId> inputs, ir::Attrs attrs);

// The loop of a fusion pass: calls `try_at(id)` (true: fused there) at each live node whose op is
// among `anchors`, in the graph's order, then sorts the graph topologically when anything fused.
template <typename TryAt>
absl::StatusOr<bool> FuseAtAnchors(ir::Graph* g, std::initializer_list<ir::OpKind> anchors, TryAt try_at) {
  bool changed = false;
  for (ir::NodeId id : g->LiveNodes()) {
    const ir::Node& n = g->node(id);
    if (n.removed || std::find(anchors.begin(), anchors.end(), n.op) == anchors.end()) continue;
    changed |= try_at(id);
  }
  if (changed) RETURN_IF_ERROR(g->TopoSort());
  return changed;
}

// Adds a node computing a new value; `shape_known` false when `shape` is a guess.
ir::ValueId AddNodeWithOutput(ir::Graph* g, ir::OpKind op, const std::string& name, std::vector<ir::ValueId> inputs,
                              ir::Attrs attrs, ir::DType dtype, ir::Shape shape, bool shape_known);

}  // namespace onnxpipe::passes
