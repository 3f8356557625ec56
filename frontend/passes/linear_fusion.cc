#include "frontend/passes/linear_fusion.h"

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

bool IsConstant2D(const Graph& g, ValueId v) {
  const ir::Value& val = g.value(v);
  return val.constant.has_value() && val.constant->rank() == 2 && ir::IsFloat(val.dtype);
}

// Output features of W given trans_b.
int64_t OutFeatures(const Graph& g, ValueId w, bool trans_b) {
  const std::vector<int64_t>& dims = g.value(w).constant->dims();
  return trans_b ? dims[0] : dims[1];
}

bool IsBiasFor(const Graph& g, ValueId b, ir::DType dtype, int64_t n) {
  const ir::Value& val = g.value(b);
  return val.constant.has_value() && val.dtype == dtype && val.constant->rank() == 1 &&
         val.constant->dims()[0] == n;
}

class LinearMatcher {
 public:
  explicit LinearMatcher(Graph* g) : g_(g), uses_(*g) {}

  bool TryMatMul(NodeId id) {
    const Node& mm = g_->node(id);
    const ValueId x = mm.inputs[0], b = mm.inputs[1];
    ValueId w = ir::kNoValue;
    bool trans_b = false;
    std::vector<NodeId> dead;
    if (IsConstant2D(*g_, b)) {
      w = b;
    } else if (const Node* t = ProducerOf(*g_, b, OpKind::kTranspose);
               t != nullptr && IsConstant2D(*g_, t->inputs[0])) {
      std::vector<int64_t> perm = t->attrs.Get<std::vector<int64_t>>("perm", {1, 0});
      if (perm != std::vector<int64_t>{1, 0}) return false;
      w = t->inputs[0];
      trans_b = true;
      if (uses_.HasSingleUse(b)) dead.push_back(ProducerId(*g_, b));
    } else {
      return false;
    }
    const ValueId y = mm.outputs[0];
    const ir::DType dtype = g_->value(y).dtype;
    if (g_->value(x).dtype != dtype || g_->value(w).dtype != dtype) return false;

    // Absorb a following bias Add when the MatMul result feeds only it.
    NodeId root = id;
    ValueId bias = ir::kNoValue;
    if (uses_.HasSingleUse(y)) {
      const NodeId consumer = uses_.Consumers(y)[0];
      const Node& add = g_->node(consumer);
      if (add.op == OpKind::kAdd) {
        const int64_t n = OutFeatures(*g_, w, trans_b);
        auto split = SplitOperands(add, [&](ValueId v) { return v != y && IsBiasFor(*g_, v, dtype, n); });
        if (split) {
          bias = split->first;
          dead.push_back(id);
          root = consumer;
        }
      }
    }
    std::vector<ValueId> inputs = {x, w};
    if (bias != ir::kNoValue) inputs.push_back(bias);
    ir::Attrs attrs;
    attrs.Set("trans_b", int64_t{trans_b ? 1 : 0});
    ReplaceWithFused(g_, root, dead, OpKind::kLinear, std::move(inputs), std::move(attrs));
    uses_.Refresh();
    return true;
  }

  bool TryGemm(NodeId id) {
    const Node& gemm = g_->node(id);
    const ir::Attrs& a = gemm.attrs;
    if (a.Get<double>("alpha", 1.0) != 1.0 || a.Get<int64_t>("transA", 0) != 0) return false;
    const int64_t trans_b = a.Get<int64_t>("transB", 0);
    if (trans_b != 0 && trans_b != 1) return false;
    const ValueId x = gemm.inputs[0], w = gemm.inputs[1];
    const ValueId c = gemm.inputs.size() > 2 ? gemm.inputs[2] : ir::kNoValue;
    if (!IsConstant2D(*g_, w)) return false;
    const ir::Value& xv = g_->value(x);
    if (xv.shape_known && xv.shape.size() != 2) return false;
    const ir::DType dtype = g_->value(gemm.outputs[0]).dtype;
    if (xv.dtype != dtype || g_->value(w).dtype != dtype) return false;
    std::vector<ValueId> inputs = {x, w};
    if (c != ir::kNoValue) {
      if (a.Get<double>("beta", 1.0) != 1.0) return false;
      if (!IsBiasFor(*g_, c, dtype, OutFeatures(*g_, w, trans_b == 1))) return false;
      inputs.push_back(c);
    }
    ir::Attrs attrs;
    attrs.Set("trans_b", trans_b);
    ReplaceWithFused(g_, id, {}, OpKind::kLinear, std::move(inputs), std::move(attrs));
    uses_.Refresh();
    return true;
  }

 private:
  Graph* g_;
  UseInfo uses_;
};

}  // namespace

absl::StatusOr<bool> LinearFusion::Run(ir::Graph* g) {
  LinearMatcher matcher(g);
  return FuseAtAnchors(g, {OpKind::kMatMul, OpKind::kGemm}, [&](NodeId id) {
    return g->node(id).op == OpKind::kMatMul ? matcher.TryMatMul(id) : matcher.TryGemm(id);
  });
}

}  // namespace onnxpipe::passes
