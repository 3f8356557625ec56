// The autodiff driver. Three sweeps over the topologically ordered forward nodes:
//   1. forward: which float values depend on a trainable parameter through differentiable edges;
//   2. reverse: which of those the loss depends on (these need a gradient), giving the active nodes;
//   3. reverse: run each active node's rule, accumulating input-gradient contributions.
// A value's contributions are complete when the reverse sweep reaches its producer (all consumers
// come later in topological order), so accumulation (Sum) is emitted just before first use and the
// appended backward nodes are already in a valid topological order.
#include "frontend/autodiff/autodiff.h"

#include <regex>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::ValueId;

#define INTERNAL_ERROR_IN(n)                                                   \
  ::onnxpipe::StatusBuilder(::absl::StatusCode::kInternal, __FILE__, __LINE__) \
      << "gradient of " << ir::NodeLabel(n) << ": "

class Driver {
 public:
  Driver(ir::Graph* g, const GradRegistry& reg) : g_(g), reg_(reg) {}

  // Input i of node n carries a gradient edge: present, float, not a declared stop edge.
  bool Differentiable(const ir::Node& n, int i) const { return CarriesGradient(reg_, *g_, n, i); }

  absl::StatusOr<TrainingGraphInfo> Run(ValueId loss, const GradOptions& options);

 private:
  // The accumulated gradient of v (kNoValue when no contribution); emits Sum when several.
  ValueId Finalize(ValueId v);
  ir::DType DTypeOf(ValueId v) const { return g_->value(v).dtype; }

  ir::Graph* g_;
  const GradRegistry& reg_;
  std::vector<std::vector<ValueId>> contrib_;
  std::vector<ValueId> final_;
  std::vector<int> refs_;  // how many times a value was handed out as a gradient
};

ValueId Driver::Finalize(ValueId v) {
  if (final_[v] != ir::kNoValue) return final_[v];
  std::vector<ValueId>& c = contrib_[v];
  if (c.empty()) return ir::kNoValue;
  if (c.size() == 1) return final_[v] = c[0];
  // A copy: AddValue below may move the graph's values.
  const ir::Value val = g_->value(v);
  std::string origin = val.name;
  std::string scope;
  if (val.producer != ir::kNoNode) {
    origin = g_->node(val.producer).name;
    scope = g_->node(val.producer).scope;
  }
  ValueId out = g_->AddValue(g_->UniqueName("grad/" + val.name), val.dtype, val.shape, val.shape_known);
  ir::NodeId id = g_->AddNode(ir::OpKind::kSum, g_->UniqueName("AccumulateGrad_" + val.name), c, {out});
  ir::Node& n = g_->node(id);
  n.phase = ir::Phase::kBackward;
  n.origin = origin;
  n.scope = scope;
  refs_.resize(g_->num_values(), 0);
  refs_[out] = 1;
  return final_[v] = out;
}

absl::StatusOr<TrainingGraphInfo> Driver::Run(ValueId loss, const GradOptions& options) {
  if (loss < 0 || loss >= g_->num_values()) return INVALID_ARGUMENT() << "loss value id out of range";
  const ir::Value& lv = g_->value(loss);
  if (!ir::IsFloat(lv.dtype)) {
    return INVALID_ARGUMENT() << "loss '" << lv.name << "' has dtype " << ir::DTypeName(lv.dtype)
                              << "; expected a float scalar";
  }
  if (!lv.shape_known || !ir::IsConcrete(lv.shape) || ir::NumElements(lv.shape) != ir::Dim(1)) {
    return INVALID_ARGUMENT() << "loss '" << lv.name << "' has shape "
                              << (lv.shape_known ? ir::ShapeToString(lv.shape) : "unknown")
                              << "; expected a scalar (one element)";
  }
  RETURN_IF_ERROR(g_->TopoSort());
  const std::vector<ir::NodeId> order = g_->LiveNodes();

  TrainingGraphInfo info;
  info.loss = loss;
  const int32_t nv = g_->num_values();

  // Parameters.
  std::optional<std::regex> freeze;
  if (!options.freeze_regex.empty()) {
    try {
      freeze.emplace(options.freeze_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return INVALID_ARGUMENT() << "--freeze regex '" << options.freeze_regex << "' is invalid: " << e.what();
    }
  }
  std::vector<ValueId> params;
  std::vector<bool> requires_grad(nv, false);
  for (ValueId v = 0; v < nv; ++v) {
    const ir::Value& val = g_->value(v);
    if (!val.is_initializer || !val.constant || !ir::IsFloat(val.dtype) || val.producer != ir::kNoNode ||
        val.param_state == ir::ParamState::kFrozen)
      continue;
    if (freeze && std::regex_search(val.name, *freeze)) {
      info.frozen_params.push_back(v);
      continue;
    }
    params.push_back(v);
    requires_grad[v] = true;
  }

  // Sweep 1: forward dependence on parameters.
  for (ir::NodeId id : order) {
    const ir::Node& n = g_->node(id);
    bool any = false;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i)
      any = any || (Differentiable(n, i) && requires_grad[n.inputs[i]]);
    if (!any) continue;
    for (ValueId o : n.outputs)
      if (o != ir::kNoValue && ir::IsFloat(DTypeOf(o))) requires_grad[o] = true;
  }

  // Sweep 2: what the loss depends on.
  std::vector<bool> flows(nv, false);
  flows[loss] = requires_grad[loss];
  std::vector<ir::NodeId> active;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const ir::Node& n = g_->node(*it);
    bool out_flows = false;
    for (ValueId o : n.outputs) out_flows = out_flows || (o != ir::kNoValue && flows[o]);
    if (!out_flows) continue;
    bool any = false;
    for (int i = 0; i < static_cast<int>(n.inputs.size()); ++i) {
      if (Differentiable(n, i) && requires_grad[n.inputs[i]]) {
        flows[n.inputs[i]] = true;
        any = true;
      }
    }
    if (any) active.push_back(*it);  // reverse topological order
  }
  for (ValueId p : params) {
    if (!flows[p]) info.unreachable_params.push_back(p);
  }
  if (!flows[loss]) return info;  // no parameter reaches the loss: nothing to build

  // Sweep 3: gradient rules.
  for (ir::NodeId id : active) {
    const ir::Node& n = g_->node(id);
    const GradRuleInfo* rule = reg_.Find(n.op);
    if (!rule || !rule->rule) {
      return UNIMPLEMENTED() << "no gradient rule for op " << ir::OpName(n.op) << " at " << ir::NodeLabel(n)
                             << ", which lies on the path from a trainable parameter to the loss '"
                             << g_->value(loss).name << "' (freeze the parameters behind it with "
                             << "--freeze, or add a rule in frontend/autodiff)";
    }
  }
  contrib_.assign(nv, {});
  final_.assign(nv, ir::kNoValue);
  refs_.assign(nv, 0);
  {
    std::vector<int64_t> dims = ir::ToInts(lv.shape);
    ir::Tensor one = ir::Tensor::Scalar<double>(1.0).CastTo(lv.dtype).Reshaped(dims);
    ValueId seed = g_->AddConstant(g_->UniqueName("grad/" + lv.name), one);
    contrib_[loss].push_back(seed);
    refs_.resize(g_->num_values(), 0);
    refs_[seed] = 2;  // never renamed: it is a constant
  }
  for (ir::NodeId id : active) {
    const ir::Node fwd = g_->node(id);  // copy: emission grows the node storage
    std::vector<ValueId> go(fwd.outputs.size(), ir::kNoValue);
    for (size_t k = 0; k < fwd.outputs.size(); ++k) {
      ValueId o = fwd.outputs[k];
      if (o != ir::kNoValue && flows[o]) go[k] = Finalize(o);
    }
    std::vector<bool> needs(fwd.inputs.size(), false);
    for (int i = 0; i < static_cast<int>(fwd.inputs.size()); ++i)
      needs[i] = Differentiable(fwd, i) && flows[fwd.inputs[i]];
    GradBuilder b(g_, id, go, needs);
    absl::Status st = reg_.Find(fwd.op)->rule(b);
    if (!st.ok()) return Annotate(st, "building the gradient of " + ir::NodeLabel(fwd));
    refs_.resize(g_->num_values(), 0);
    for (int i = 0; i < static_cast<int>(fwd.inputs.size()); ++i) {
      if (!needs[i] || b.GIIncluded(i)) continue;
      ValueId gi = b.input_grads()[i];
      const ir::Value& in = g_->value(fwd.inputs[i]);
      if (gi == ir::kNoValue) {
        return INTERNAL_ERROR_IN(fwd) << "rule gave no gradient for input " << i << " ('" << in.name << "')";
      }
      const ir::Value& gv = g_->value(gi);
      if (gv.dtype != in.dtype || (gv.shape_known && in.shape_known && gv.shape != in.shape)) {
        return INTERNAL_ERROR_IN(fwd) << "gradient of input " << i << " ('" << in.name << "') is "
                                      << ir::DTypeName(gv.dtype) << ir::ShapeToString(gv.shape) << ", expected "
                                      << ir::DTypeName(in.dtype) << ir::ShapeToString(in.shape);
      }
      contrib_[fwd.inputs[i]].push_back(gi);
      ++refs_[gi];
    }
  }

  // Parameter gradients, named grad/<param>.
  for (ValueId p : params) {
    if (!flows[p]) continue;
    const std::string pname = g_->value(p).name;
    const std::string want = "grad/" + pname;
    ValueId gv = Finalize(p);
    RET_CHECK(gv != ir::kNoValue) << "parameter '" << pname << "' reaches the loss but got no gradient";
    if (g_->value(gv).name != want) {
      const ir::Value& val = g_->value(gv);
      const bool private_value = !val.constant && val.producer != ir::kNoNode &&
                                 g_->node(val.producer).phase == ir::Phase::kBackward && refs_[gv] == 1 &&
                                 !g_->IsGraphOutput(gv);
      if (g_->FindValue(want) != ir::kNoValue) {
        return INVALID_ARGUMENT() << "cannot name the gradient of '" << pname << "': a value named '" << want
                                  << "' already exists";
      }
      if (private_value) {
        g_->RenameValue(gv, want);
      } else {
        // Shared with another gradient (e.g. an Add passes dY to both operands): copy.
        ValueId out = g_->AddValue(want, val.dtype, val.shape, val.shape_known);
        ir::NodeId id = g_->AddNode(ir::OpKind::kIdentity, "AccumulateGrad_" + pname, {gv}, {out});
        g_->node(id).phase = ir::Phase::kBackward;
        g_->node(id).origin = pname;
        gv = out;
      }
    }
    info.param_grads.push_back({p, gv});
  }
  if (options.grads_as_outputs) {
    if (!g_->IsGraphOutput(loss)) g_->outputs().push_back(loss);
    for (const ParamGrad& pg : info.param_grads) g_->outputs().push_back(pg.grad);
  }
  return info;
}

}  // namespace

absl::StatusOr<TrainingGraphInfo> BuildGradients(ir::Graph* g, ir::ValueId loss, const GradOptions& options) {
  RET_CHECK(g != nullptr);
  Driver d(g, GradRegistry::Get());
  return d.Run(loss, options);
}

}  // namespace onnxpipe::autodiff
