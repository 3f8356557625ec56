#include "frontend/passes/pattern.h"

#include <algorithm>
#include <cmath>

namespace onnxpipe::passes {

int UseInfo::NumUses(ir::ValueId v) const {
  int n = static_cast<int>(uses_[v].size());
  for (ir::ValueId o : g_->outputs())
    if (o == v) ++n;
  return n;
}

std::vector<ir::NodeId> UseInfo::Consumers(ir::ValueId v) const {
  std::vector<ir::NodeId> out = uses_[v];
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

ir::NodeId ProducerId(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoValue) return ir::kNoNode;
  ir::NodeId p = g.value(v).producer;
  if (p == ir::kNoNode || g.node(p).removed) return ir::kNoNode;
  return p;
}

ir::NodeId PatternProducer(const ir::Graph& g, const UseInfo& uses, ir::ValueId v) {
  if (!uses.HasSingleUse(v)) return ir::kNoNode;
  return ProducerId(g, v);
}

void SetOutput(ir::Graph* g, ir::NodeId id, int k, ir::ValueId v) {
  const ir::ValueId old = g->node(id).outputs[k];
  if (old != ir::kNoValue && g->value(old).producer == id) g->value(old).producer = ir::kNoNode;
  g->node(id).outputs[k] = v;
  g->value(v).producer = id;
  g->value(v).producer_output = k;
}

bool RewriteEachNode(ir::Graph* g, const std::function<bool(ir::Graph*, const UseInfo&, ir::NodeId)>& rewrite) {
  bool changed = false;
  UseInfo uses(*g);
  for (ir::NodeId id : g->LiveNodes()) {
    if (!rewrite(g, uses, id)) continue;
    changed = true;
    uses.Refresh();
  }
  return changed;
}

bool SameShapeAndDType(const ir::Graph& g, ir::ValueId a, ir::ValueId b) {
  const ir::Value &va = g.value(a), &vb = g.value(b);
  return va.shape_known && vb.shape_known && va.shape == vb.shape && va.dtype == vb.dtype;
}

bool IsFloatCast(const ir::Graph& g, const ir::Node& n) {
  return n.op == ir::OpKind::kCast && ir::IsFloat(g.value(n.inputs[0]).dtype) &&
         ir::IsFloat(g.value(n.outputs[0]).dtype);
}

ir::ValueId SkipFloatCasts(const ir::Graph& g, const UseInfo& uses, ir::ValueId v, std::set<ir::NodeId>* nodes) {
  while (const ir::Node* c = ProducerOf(g, v, ir::OpKind::kCast)) {
    if (!IsFloatCast(g, *c) || !uses.HasSingleUse(v)) break;
    nodes->insert(ProducerId(g, v));
    v = c->inputs[0];
  }
  return v;
}

const ir::Node* ProducerOf(const ir::Graph& g, ir::ValueId v) {
  ir::NodeId p = ProducerId(g, v);
  return p == ir::kNoNode ? nullptr : &g.node(p);
}

const ir::Node* ProducerOf(const ir::Graph& g, ir::ValueId v, ir::OpKind op) {
  const ir::Node* n = ProducerOf(g, v);
  return n != nullptr && n->op == op ? n : nullptr;
}

std::optional<double> ScalarConstant(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoValue) return std::nullopt;
  const ir::Value& val = g.value(v);
  if (!val.constant || val.constant->num_elements() != 1) return std::nullopt;
  return val.constant->GetAsDouble(0);
}

bool NearlyEqual(double a, double b, double rel_tol) {
  if (a == b) return true;
  if (std::isnan(a) || std::isnan(b)) return false;
  return std::fabs(a - b) <= rel_tol * std::max(std::fabs(a), std::fabs(b));
}

bool IsScalarNear(const ir::Graph& g, ir::ValueId v, double expected, double rel_tol) {
  std::optional<double> c = ScalarConstant(g, v);
  return c.has_value() && NearlyEqual(*c, expected, rel_tol);
}

bool IsParameter(const ir::Value& v) {
  return v.is_initializer && ir::IsFloat(v.dtype) && v.param_state != ir::ParamState::kFrozen;
}

bool DependsOnParameter(const ir::Graph& g, ir::ValueId v) {
  std::vector<ir::ValueId> stack = {v};
  std::vector<bool> seen(g.num_values(), false);
  while (!stack.empty()) {
    const ir::ValueId u = stack.back();
    stack.pop_back();
    if (u == ir::kNoValue || seen[u]) continue;
    seen[u] = true;
    const ir::Value& val = g.value(u);
    if (!ir::IsFloat(val.dtype)) continue;
    if (IsParameter(val)) return true;
    if (val.producer == ir::kNoNode || g.node(val.producer).removed) continue;
    for (ir::ValueId in : g.node(val.producer).inputs) stack.push_back(in);
  }
  return false;
}

bool IsFrozenConstant(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  return val.constant.has_value() && !IsParameter(val);
}

bool IsFoldableConstant(const ir::Graph& g, ir::ValueId v) {
  const ir::Value& val = g.value(v);
  return val.constant.has_value() && !(val.is_initializer && ir::IsFloat(val.dtype));
}

std::optional<ir::Tensor> ConcreteShapeTensor(const ir::Graph& g, const ir::Node& n) {
  const ir::Value& x = g.value(n.inputs[0]);
  if (!x.shape_known || !ir::IsConcrete(x.shape)) return std::nullopt;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  auto clamp = [rank](int64_t a) { return std::clamp(a < 0 ? a + rank : a, int64_t{0}, rank); };
  const int64_t start = clamp(n.attrs.Get<int64_t>("start", 0));
  const int64_t end = clamp(n.attrs.Get<int64_t>("end", rank));
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i) dims.push_back(x.shape[i].value());
  return ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(dims.size())}, dims);
}

std::optional<int64_t> NormalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) return std::nullopt;
  return axis < 0 ? axis + rank : axis;
}

ir::NodeId ReplaceWithFused(ir::Graph* g, ir::NodeId root, const std::vector<ir::NodeId>& dead, ir::OpKind op,
                            std::vector<ir::ValueId> inputs, ir::Attrs attrs) {
  const std::string name = g->node(root).name;
  const ir::ValueId out = g->node(root).outputs[0];
  for (ir::NodeId d : dead)
    if (d != root && !g->node(d).removed) g->RemoveNode(d);
  g->RemoveNode(root);
  return g->AddNode(op, name, std::move(inputs), {out}, std::move(attrs));
}

ir::ValueId AddNodeWithOutput(ir::Graph* g, ir::OpKind op, const std::string& name, std::vector<ir::ValueId> inputs,
                              ir::Attrs attrs, ir::DType dtype, ir::Shape shape, bool shape_known) {
  ir::ValueId out = g->AddValue(g->UniqueName(name + "_output_0"), dtype, std::move(shape), shape_known);
  g->AddNode(op, name, std::move(inputs), {out}, std::move(attrs));
  return out;
}

}  // namespace onnxpipe::passes
