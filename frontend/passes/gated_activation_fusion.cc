// The matcher anchors on the outer Mul and tries each operand as the activation's output; the
// SiLU's own Mul(gate, Sigmoid(gate)) comes earlier in the graph's order, finds no activation in
// its operands and is left for its consumer to take. All checks happen before the graph is touched.

#include "frontend/passes/gated_activation_fusion.h"

#include <optional>
#include <vector>

#include "frontend/ir/gated_activation.h"
#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::Graph;
using ir::Node;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

struct Activation {
  ir::GatedAct act;
  ValueId gate = ir::kNoValue;
  std::vector<NodeId> nodes;  // the activation's nodes, all internal to the pattern
};

class GatedActivationMatcher {
 public:
  explicit GatedActivationMatcher(Graph* g) : g_(g), uses_(*g) {}

  bool TryMul(NodeId mul) {
    const Node& n = g_->node(mul);
    if (n.inputs.size() != 2) return false;
    const ValueId a = n.inputs[0], b = n.inputs[1];
    return TryOperands(mul, a, b) || TryOperands(mul, b, a);
  }

 private:
  // Y = Mul(activated, up), activated = act(gate).
  bool TryOperands(NodeId mul, ValueId activated, ValueId up) {
    const NodeId p = PatternProducer(*g_, uses_, activated);
    if (p == ir::kNoNode) return false;
    const std::optional<Activation> m = MatchActivation(p);
    const ValueId y = g_->node(mul).outputs[0];
    if (!m || !ir::IsFloat(g_->value(m->gate).dtype) || !SameShapeAndDType(*g_, m->gate, up) ||
        !SameShapeAndDType(*g_, m->gate, activated) || !SameShapeAndDType(*g_, m->gate, y))
      return false;
    ReplaceWithFused(g_, mul, m->nodes, OpKind::kGatedActivation, {m->gate, up}, ir::GatedActAttrs(m->act));
    uses_.Refresh();
    return true;
  }

  // The activation computed by node p: a Gelu, or SiLU as Mul(gate, Sigmoid(gate)).
  std::optional<Activation> MatchActivation(NodeId p) const {
    const Node& n = g_->node(p);
    if (n.op == OpKind::kGelu) {
      if (n.attrs.Get<double>("dropout", 0.0) != 0.0) return std::nullopt;  // the dropout-fusion pass's
      const std::string approximate = n.attrs.Get<std::string>("approximate", "none");
      if (approximate != "none" && approximate != "tanh") return std::nullopt;
      return Activation{approximate == "tanh" ? ir::GatedAct::kGeluTanh : ir::GatedAct::kGeluErf, n.inputs[0], {p}};
    }
    if (n.op != OpKind::kMul || n.inputs.size() != 2) return std::nullopt;
    for (int k = 0; k < 2; ++k) {
      const ValueId gate = n.inputs[k], s = n.inputs[1 - k];
      const NodeId sig = PatternProducer(*g_, uses_, s);
      if (gate != s && sig != ir::kNoNode && g_->node(sig).op == OpKind::kSigmoid && g_->node(sig).inputs[0] == gate &&
          SameShapeAndDType(*g_, gate, s))
        return Activation{ir::GatedAct::kSilu, gate, {p, sig}};
    }
    return std::nullopt;
  }

  Graph* g_;
  UseInfo uses_;
};

}  // namespace

absl::StatusOr<bool> GatedActivationFusion::Run(ir::Graph* g) {
  GatedActivationMatcher matcher(g);
  return FuseAtAnchors(g, {OpKind::kMul}, [&](NodeId id) { return matcher.TryMul(id); });
}

}  // namespace onnxpipe::passes
