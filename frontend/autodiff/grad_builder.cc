// GradBuilder: node emission with computed types, and the rule registry.
#include "frontend/autodiff/grad_builder.h"

#include <algorithm>

#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {

using ir::DType;
using ir::Shape;
using ir::ValueId;

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    // Right-aligned: position i of the output takes dim (rank - r + i) of each operand.
    const ir::Dim* da = i + a.size() >= r ? &a[i + a.size() - r] : nullptr;
    const ir::Dim* db = i + b.size() >= r ? &b[i + b.size() - r] : nullptr;
    if (!da) {
      out[i] = *db;
    } else if (!db) {
      out[i] = *da;
    } else if (*da == *db || *db == ir::Dim(1)) {
      out[i] = *da;
    } else if (*da == ir::Dim(1)) {
      out[i] = *db;
    } else {
      return INVALID_ARGUMENT() << "shapes " << ir::ShapeToString(a) << " and " << ir::ShapeToString(b)
                                << " do not broadcast";
    }
  }
  return out;
}

absl::StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) {
    return INVALID_ARGUMENT() << "axis " << axis << " is out of range for rank " << rank;
  }
  return axis < 0 ? axis + rank : axis;
}

GradBuilder::GradBuilder(ir::Graph* g, ir::NodeId fwd, std::vector<ValueId> output_grads,
                         std::vector<bool> needs_input_grad)
    : g_(g),
      fwd_id_(fwd),
      node_(g->node(fwd)),
      go_(std::move(output_grads)),
      needs_(std::move(needs_input_grad)),
      gi_(node_.inputs.size(), ir::kNoValue) {}

ValueType GradBuilder::TypeOf(ValueId v) const {
  const ir::Value& val = g_->value(v);
  return ValueType{val.dtype, val.shape, val.shape_known};
}

void GradBuilder::SetGI(int i, ValueId grad) {
  if (i >= 0 && i < num_inputs() && NeedsGI(i)) gi_[i] = grad;
}

void GradBuilder::SetGIIncludedIn(int i, int j) {
  if (i < 0 || i >= num_inputs() || j < 0 || j >= num_inputs() || node_.inputs[i] != node_.inputs[j]) return;
  included_.resize(node_.inputs.size(), false);
  included_[i] = true;
}

absl::Status GradBuilder::Error(const std::string& what) const {
  return INVALID_ARGUMENT() << "gradient of node '" << node_.name << "' (" << ir::OpName(node_.op) << "): " << what;
}

std::string GradBuilder::NextNodeName(ir::OpKind op) {
  const std::string base = node_.name.empty() ? "node" : node_.name;
  return base + "_grad_" + std::string(ir::OpName(op)) + "_" + std::to_string(emitted_++);
}

std::vector<ValueId> GradBuilder::EmitMulti(ir::OpKind op, std::vector<ValueId> inputs,
                                            const std::vector<std::optional<ValueType>>& outs, ir::Attrs attrs) {
  // Trailing absent optional inputs are dropped so the arity matches the op list.
  while (!inputs.empty() && inputs.back() == ir::kNoValue) inputs.pop_back();
  const std::string name = NextNodeName(op);
  std::vector<ValueId> out_ids;
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k]) {
      out_ids.push_back(ir::kNoValue);
      continue;
    }
    const std::string vname = g_->UniqueName(name + (outs.size() > 1 ? ":" + std::to_string(k) : ""));
    out_ids.push_back(
        g_->AddValue(vname, outs[k]->dtype, outs[k]->shape_known ? outs[k]->shape : Shape{}, outs[k]->shape_known));
  }
  ir::NodeId id = g_->AddNode(op, name, std::move(inputs), out_ids, std::move(attrs));
  ir::Node& n = g_->node(id);
  n.phase = ir::Phase::kBackward;
  n.origin = node_.name;
  n.scope = node_.scope;
  return out_ids;
}

ValueId GradBuilder::Emit(ir::OpKind op, std::vector<ValueId> inputs, const ValueType& out, ir::Attrs attrs) {
  return EmitMulti(op, std::move(inputs), {out}, std::move(attrs))[0];
}

std::vector<std::optional<ValueType>> GradBuilder::InputGradTypes(int n) const {
  std::vector<std::optional<ValueType>> outs;
  for (int i = 0; i < n; ++i) outs.push_back(NeedsGI(i) ? std::optional<ValueType>(TypeOf(I(i))) : std::nullopt);
  while (outs.size() > 1 && !outs.back()) outs.pop_back();
  return outs;
}

void GradBuilder::SetInputGrads(const std::vector<ValueId>& grads) {
  for (int i = 0; i < static_cast<int>(grads.size()); ++i)
    if (NeedsGI(i)) SetGI(i, grads[i]);
}

ValueId GradBuilder::Scalar(double v, DType dtype) {
  const std::string base = (node_.name.empty() ? "node" : node_.name) + "_grad_const";
  return g_->AddConstant(g_->UniqueName(base), ir::Tensor::Scalar<double>(v).CastTo(dtype));
}

ValueId GradBuilder::EnsureForwardOutput(int i, const ValueType& t) {
  ir::Node& n = g_->node(fwd_id_);
  if (static_cast<int>(n.outputs.size()) <= i) n.outputs.resize(i + 1, ir::kNoValue);
  if (n.outputs[i] == ir::kNoValue) {
    const std::string base = (node_.name.empty() ? "node" : node_.name) + "_saved_" + std::to_string(i);
    ValueId v = g_->AddValue(g_->UniqueName(base), t.dtype, t.shape_known ? t.shape : Shape{}, t.shape_known);
    g_->node(fwd_id_).outputs[i] = v;
    g_->value(v).producer = fwd_id_;
    g_->value(v).producer_output = i;
  }
  node_.outputs = g_->node(fwd_id_).outputs;
  return node_.outputs[i];
}

absl::StatusOr<ValueId> GradBuilder::Binary(ir::OpKind op, ValueId a, ValueId b) {
  ValueType ta = TypeOf(a), tb = TypeOf(b);
  if (ta.dtype != tb.dtype) {
    return Error("internal: " + std::string(ir::OpName(op)) + " of " + std::string(ir::DTypeName(ta.dtype)) + " and " +
                 std::string(ir::DTypeName(tb.dtype)));
  }
  ValueType out{ta.dtype, {}, ta.shape_known && tb.shape_known};
  if (out.shape_known) {
    auto s = BroadcastShapes(ta.shape, tb.shape);
    if (!s.ok()) return Error(std::string(s.status().message()));
    out.shape = *s;
  }
  return Emit(op, {a, b}, out);
}

absl::StatusOr<ValueId> GradBuilder::Add(ValueId a, ValueId b) { return Binary(ir::OpKind::kAdd, a, b); }
absl::StatusOr<ValueId> GradBuilder::Sub(ValueId a, ValueId b) { return Binary(ir::OpKind::kSub, a, b); }
absl::StatusOr<ValueId> GradBuilder::Mul(ValueId a, ValueId b) { return Binary(ir::OpKind::kMul, a, b); }
absl::StatusOr<ValueId> GradBuilder::Div(ValueId a, ValueId b) { return Binary(ir::OpKind::kDiv, a, b); }
absl::StatusOr<ValueId> GradBuilder::Pow(ValueId a, ValueId b) { return Binary(ir::OpKind::kPow, a, b); }

ValueId GradBuilder::Unary(ir::OpKind op, ValueId x) { return Emit(op, {x}, TypeOf(x)); }

ValueId GradBuilder::Cast(ValueId x, DType to) {
  ValueType t = TypeOf(x);
  if (t.dtype == to) return x;
  t.dtype = to;
  ir::Attrs a;
  a.Set("to", std::string(ir::DTypeName(to)));
  return Emit(ir::OpKind::kCast, {x}, t, std::move(a));
}

ValueId GradBuilder::ReduceToShapeOf(ValueId grad, ValueId like) {
  ValueType tg = TypeOf(grad), tl = TypeOf(like);
  if (tg.shape_known && tl.shape_known && tg.shape == tl.shape) return grad;
  return Emit(ir::OpKind::kReduceToShapeOf, {grad, like}, ValueType{tg.dtype, tl.shape, tl.shape_known});
}

ValueId GradBuilder::ReshapeLike(ValueId x, ValueId like) {
  ValueType tx = TypeOf(x), tl = TypeOf(like);
  if (tx.shape_known && tl.shape_known && tx.shape == tl.shape) return x;
  return Emit(ir::OpKind::kReshapeLike, {x, like}, ValueType{tx.dtype, tl.shape, tl.shape_known});
}

ValueId GradBuilder::ZerosLike(ValueId like) { return Emit(ir::OpKind::kZerosLike, {like}, TypeOf(like)); }

ValueId GradBuilder::ExpandLike(ValueId x, ValueId like, const std::vector<int64_t>& axes, bool mean) {
  ValueType tx = TypeOf(x), tl = TypeOf(like);
  ir::Attrs a;
  if (!axes.empty()) a.Set("axes", axes);
  if (mean) a.Set("mean", int64_t{1});
  return Emit(ir::OpKind::kExpandLike, {x, like}, ValueType{tx.dtype, tl.shape, tl.shape_known}, std::move(a));
}

ValueId GradBuilder::Unsqueeze(ValueId x, const std::vector<int64_t>& axes) {
  ValueType t = TypeOf(x);
  if (t.shape_known) {
    Shape s = t.shape;
    std::vector<int64_t> sorted = axes;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t ax : sorted) s.insert(s.begin() + ax, ir::Dim(1));
    t.shape = s;
  }
  ir::Attrs a;
  a.Set("axes", axes);
  return Emit(ir::OpKind::kUnsqueeze, {x}, t, std::move(a));
}

ValueId GradBuilder::Flatten(ValueId x, int64_t axis) {
  ValueType t = TypeOf(x);
  if (t.shape_known) {
    ir::Dim outer(1), inner(1);
    for (int64_t i = 0; i < static_cast<int64_t>(t.shape.size()); ++i) {
      if (i < axis) {
        outer = outer * t.shape[i];
      } else {
        inner = inner * t.shape[i];
      }
    }
    if (t.shape.size() == 2 && axis == 1) return x;
    t.shape = {outer, inner};
  }
  ir::Attrs a;
  a.Set("axis", axis);
  return Emit(ir::OpKind::kFlatten, {x}, t, std::move(a));
}

absl::StatusOr<std::vector<ValueId>> GradBuilder::EmitFusedMatMul(ValueId a, ValueId b, bool trans_a, bool trans_b,
                                                                  double alpha, char k_sum) {
  ValueType ta = TypeOf(a), tb = TypeOf(b);
  ValueType out{ta.dtype, {}, ta.shape_known && tb.shape_known};
  if (out.shape_known) {
    if (ta.shape.size() < 2 || tb.shape.size() < 2) return Error("internal: FusedMatMul of rank < 2");
    Shape ba(ta.shape.begin(), ta.shape.end() - 2), bb(tb.shape.begin(), tb.shape.end() - 2);
    auto batch = BroadcastShapes(ba, bb);
    if (!batch.ok()) return Error(std::string(batch.status().message()));
    out.shape = *batch;
    const size_t ra = ta.shape.size(), rb = tb.shape.size();
    out.shape.push_back(trans_a ? ta.shape[ra - 1] : ta.shape[ra - 2]);
    out.shape.push_back(trans_b ? tb.shape[rb - 2] : tb.shape[rb - 1]);
  }
  ir::Attrs attrs;
  if (trans_a) attrs.Set("trans_a", int64_t{1});
  if (trans_b) attrs.Set("trans_b", int64_t{1});
  if (alpha != 1.0) attrs.Set("alpha", alpha);
  std::vector<std::optional<ValueType>> outs = {out};
  if (k_sum != 0) {
    if (out.shape_known && (ta.shape.size() != 2 || tb.shape.size() != 2)) {
      return Error("internal: FusedMatMul's KSum of operands of rank != 2");
    }
    attrs.Set("k_sum", std::string(1, k_sum));
    ValueType sums{ta.dtype, {}, out.shape_known};
    if (out.shape_known) sums.shape = {out.shape[k_sum == 'a' ? 0 : 1]};
    outs.push_back(sums);
  }
  return EmitMulti(ir::OpKind::kFusedMatMul, {a, b}, outs, std::move(attrs));
}

absl::StatusOr<ValueId> GradBuilder::FusedMatMul(ValueId a, ValueId b, bool trans_a, bool trans_b, double alpha) {
  ASSIGN_OR_RETURN(std::vector<ValueId> out, EmitFusedMatMul(a, b, trans_a, trans_b, alpha, 0));
  return out[0];
}

absl::StatusOr<std::pair<ValueId, ValueId>> GradBuilder::FusedMatMulWithKSum(ValueId a, ValueId b, bool trans_a,
                                                                             bool trans_b, char k_sum) {
  ASSIGN_OR_RETURN(std::vector<ValueId> out, EmitFusedMatMul(a, b, trans_a, trans_b, 1.0, k_sum));
  return std::pair{out[0], out[1]};
}

// --- registry ---

GradRegistry::GradRegistry() : rules_(static_cast<size_t>(ir::OpKind::kNumOps)) {
  RegisterElementwiseGradients(*this);
  RegisterMatMulGradients(*this);
  RegisterShapeGradients(*this);
  RegisterReduceGradients(*this);
  RegisterNormActivationGradients(*this);
  RegisterAttentionGradients(*this);
  RegisterGatherDropoutLossGradients(*this);
  RegisterMathGradients(*this);
  RegisterRotaryGradients(*this);
  RegisterGatedActivationGradients(*this);
}

const GradRegistry& GradRegistry::Get() {
  static const GradRegistry* r = new GradRegistry();
  return *r;
}

const GradRuleInfo* GradRegistry::Find(ir::OpKind op) const {
  const auto& e = rules_[static_cast<size_t>(op)];
  return e ? &*e : nullptr;
}

void GradRegistry::Register(ir::OpKind op, GradRule rule, std::vector<int> stop_inputs) {
  rules_[static_cast<size_t>(op)] = GradRuleInfo{std::move(rule), std::move(stop_inputs), false};
}

void GradRegistry::RegisterNoGradient(ir::OpKind op) {
  rules_[static_cast<size_t>(op)] = GradRuleInfo{nullptr, {}, true};
}

bool CarriesGradient(const GradRegistry& reg, const ir::Graph& g, const ir::Node& n, int i) {
  const ir::ValueId v = n.inputs[i];
  if (v == ir::kNoValue || !ir::IsFloat(g.value(v).dtype)) return false;
  const GradRuleInfo* info = reg.Find(n.op);
  if (info == nullptr) return true;
  if (info->no_gradient) return false;
  for (int s : info->stop_inputs)
    if (s == i) return false;
  return true;
}

}  // namespace onnxpipe::autodiff
