// Builds the optimizer step as graph ops (see optimizer.h). Keeping the update in the graph, rather
// than in a host loop over parameters, lets the partitioner place each update with its parameter
// and the memory planner account for optimizer state like any other buffer.
#include "frontend/autodiff/optimizer.h"

#include <algorithm>
#include <set>

#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

absl::Status ValidateOptions(const OptimizerOptions& o) {
  auto finite_nonneg = [](double x) { return x >= 0 && x < 1e300; };
  if (!finite_nonneg(o.weight_decay))
    return INVALID_ARGUMENT() << "weight decay must be >= 0, got " << o.weight_decay;
  if (!finite_nonneg(o.clip_norm))
    return INVALID_ARGUMENT() << "clip norm must be >= 0 (0 disables clipping), got " << o.clip_norm;
  if (o.kind == OptimizerKind::kSGD) {
    if (!finite_nonneg(o.momentum))
      return INVALID_ARGUMENT() << "SGD momentum must be >= 0, got " << o.momentum;
    if (o.nesterov && o.momentum == 0)
      return INVALID_ARGUMENT() << "SGD nesterov needs a non-zero momentum";
  } else {
    if (!(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1))
      return INVALID_ARGUMENT() << "AdamW betas must lie in [0, 1), got (" << o.beta1 << ", "
                                << o.beta2 << ")";
    if (!(o.eps > 0)) return INVALID_ARGUMENT() << "AdamW eps must be > 0, got " << o.eps;
  }
  return absl::OkStatus();
}

ir::ValueId AddScalarInput(ir::Graph* g, const std::string& name, ir::DType dtype) {
  const ir::ValueId v = g->AddValue(g->UniqueName(name), dtype, ir::Shape{});
  g->inputs().push_back(v);
  return v;
}

ir::NodeId AddOptimizerNode(ir::Graph* g, ir::OpKind op, const std::string& name,
                            std::vector<ir::ValueId> inputs, std::vector<ir::ValueId> outputs,
                            ir::Attrs attrs, const std::string& origin, const std::string& scope) {
  const ir::NodeId id = g->AddNode(op, name, std::move(inputs), std::move(outputs), std::move(attrs));
  ir::Node& n = g->node(id);
  n.phase = ir::Phase::kOptimizer;
  n.origin = origin;
  n.scope = scope;
  return id;
}

// A zero constant shaped like the parameter: a fresh optimizer-state buffer.
ir::ValueId AddStateBuffer(ir::Graph* g, const ir::Value& param, const std::string& suffix) {
  const ir::Tensor& p = *param.constant;
  return g->AddConstant(g->UniqueName(param.name + "/" + suffix), ir::Tensor(p.dtype(), p.dims()));
}

// A new value typed like the parameter, for the updated parameter or state.
ir::ValueId AddLike(ir::Graph* g, const ir::Value& param, const std::string& name) {
  return g->AddValue(g->UniqueName(name), param.dtype, param.shape);
}

// The Casts to a half dtype among `uses` (a parameter's readers), when they all cast to the same one; none
// otherwise.
std::vector<ir::NodeId> HalfCasts(const ir::Graph& g, const std::vector<ir::NodeId>& uses) {
  std::vector<ir::NodeId> casts;
  for (ir::NodeId id : uses) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::OpKind::kCast || n.outputs.empty() || n.outputs[0] == ir::kNoValue) continue;
    const ir::DType to = g.value(n.outputs[0]).dtype;
    if (!ir::IsHalf(to)) continue;
    if (!casts.empty() && g.value(g.node(casts[0]).outputs[0]).dtype != to) return {};
    if (std::find(casts.begin(), casts.end(), id) == casts.end()) casts.push_back(id);
  }
  return casts;
}

}  // namespace

std::string ComputeCopyName(const std::string& param, ir::DType half) {
  return param + "/compute_" + std::string(ir::DTypeName(half));
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSGD;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return INVALID_ARGUMENT() << "unknown optimizer '" << name << "'; expected sgd or adamw";
}

absl::StatusOr<OptimizerGraphInfo> AddOptimizer(ir::Graph* g,
                                                const std::vector<ParamGrad>& param_grads,
                                                const OptimizerOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  if (param_grads.empty()) {
    return INVALID_ARGUMENT() << "the model has no trainable parameter reaching the loss (all "
                                 "frozen or unreachable); nothing to optimize";
  }
  for (const ParamGrad& pg : param_grads) {
    RET_CHECK(pg.param >= 0 && pg.param < g->num_values() && pg.grad >= 0 &&
              pg.grad < g->num_values());
    const ir::Value& p = g->value(pg.param);
    const ir::Value& gr = g->value(pg.grad);
    if (!p.constant || !ir::IsFloat(p.dtype)) {
      return INVALID_ARGUMENT() << "parameter '" << p.name
                                << "' is not a float initializer; the optimizer updates only those";
    }
    if (gr.dtype != p.dtype || ir::FromInts(p.constant->dims()) != gr.shape) {
      return INVALID_ARGUMENT() << "gradient '" << gr.name << "' is " << ir::DTypeName(gr.dtype)
                                << ir::ShapeToString(gr.shape) << " but parameter '" << p.name
                                << "' is " << ir::DTypeName(p.dtype)
                                << ir::ShapeToString(ir::FromInts(p.constant->dims()));
    }
  }

  // Scope of a parameter's update: that of the first forward node that reads it, so per-layer
  // reports put the update in the parameter's layer.
  const std::vector<std::vector<ir::NodeId>> uses = g->ComputeUses();
  auto scope_of = [&](ir::ValueId param) -> std::string {
    for (ir::NodeId id : uses[param]) {
      if (g->node(id).phase == ir::Phase::kForward) return g->node(id).scope;
    }
    return "";
  };

  OptimizerGraphInfo info;
  const ir::DType dt = g->value(param_grads[0].grad).dtype;

  // Phase 1: each gradient's sum of squares (in double), a value of its parameter's so that it is formed on the
  // gradient's stage. With clipping the updates wait for the global norm: SumSquares nodes, their SumScalars (in
  // parameter order), the norm and the clipping factor come first. Without, each update forms its gradient's sum as
  // it reads the gradient (op.h: UpdateSumSquaresOutput) and the norm comes after them (phase 4).
  std::vector<ir::ValueId> grads, sums;
  for (const ParamGrad& pg : param_grads) {
    grads.push_back(pg.grad);
    const std::string param = g->value(pg.param).name;
    sums.push_back(g->AddValue(g->UniqueName("optimizer/" + param + "/grad_sum_squares"), ir::DType::kF64,
                               ir::Shape{}));
    if (options.clip_norm == 0) continue;
    ir::Attrs a;
    a.Set("to", std::string(ir::DTypeName(ir::DType::kF64)));
    AddOptimizerNode(g, ir::OpKind::kSumSquares, "optimizer/" + param + "/SumSquares", {pg.grad}, {sums.back()},
                     std::move(a), param, scope_of(pg.param));
  }
  auto add_norm = [&]() {
    const ir::ValueId sum_sq = g->AddValue(g->UniqueName("optimizer/grad_sum_squares"), dt, ir::Shape{});
    ir::Attrs to;
    to.Set("to", std::string(ir::DTypeName(dt)));
    AddOptimizerNode(g, ir::OpKind::kSumScalars, "optimizer/SumSquares", sums, {sum_sq}, std::move(to),
                     /*origin=*/"", /*scope=*/"");
    info.grad_norm = g->AddValue(g->UniqueName(kGradNormName), dt, ir::Shape{});
    AddOptimizerNode(g, ir::OpKind::kSqrt, "optimizer/GradNorm", {sum_sq}, {info.grad_norm}, {},
                     /*origin=*/"", /*scope=*/"");
  };
  if (options.clip_norm > 0) {
    add_norm();
    info.clip_scale = g->AddValue(g->UniqueName("optimizer/clip_scale"), dt, ir::Shape{});
    ir::Attrs a;
    a.Set("max_norm", options.clip_norm);
    a.Set("eps", 1e-6);
    AddOptimizerNode(g, ir::OpKind::kClipScale, "optimizer/ClipScale", {info.grad_norm},
                     {info.clip_scale}, std::move(a), /*origin=*/"", /*scope=*/"");
  }

  // Phase 2: the per-step scalar inputs.
  info.lr = AddScalarInput(g, kLrName, ir::DType::kF64);
  if (options.kind == OptimizerKind::kAdamW) info.step = AddScalarInput(g, kStepName, ir::DType::kI64);

  // Phase 3: one update node per parameter.
  std::vector<ir::ValueId> copies;
  for (size_t i = 0; i < param_grads.size(); ++i) {
    const ParamGrad& pg = param_grads[i];
    const ir::Value param = g->value(pg.param);  // copy: adding values may move the storage
    // The compute copy: when the forward reads the parameter through Casts to a half dtype, a state constant of
    // that dtype made from the parameter's value replaces them, and the update writes its next value.
    const std::vector<ir::NodeId> casts =
        options.compute_copies ? HalfCasts(*g, uses[pg.param]) : std::vector<ir::NodeId>{};
    ir::ValueId copy = ir::kNoValue, copy_new = ir::kNoValue;
    if (!casts.empty()) {
      const ir::DType half = g->value(g->node(casts[0]).outputs[0]).dtype;
      const std::string suffix(ir::DTypeName(half));
      copy = g->AddConstant(g->UniqueName(ComputeCopyName(param.name, half)), param.constant->CastTo(half));
      copy_new =
          g->AddValue(g->UniqueName("optimizer/" + param.name + "/" + suffix + "_updated"), half, param.shape);
    }
    // The update's optional outputs at their slots (op.h), absent ones before a present one.
    auto with_extras = [&](std::vector<ir::ValueId> outs, ir::OpKind op) {
      auto put = [&](int k, ir::ValueId v) {
        if (v == ir::kNoValue) return;
        outs.resize(k, ir::kNoValue);
        outs.push_back(v);
      };
      put(ir::UpdateSumSquaresOutput(op), options.clip_norm > 0 ? ir::kNoValue : sums[i]);
      put(ir::UpdateComputeCopyOutput(op), copy_new);
      return outs;
    };
    // After the update node: the copy replaces the Casts, and is state.
    auto use_copy = [&](ir::Attrs& attrs) {
      if (copy == ir::kNoValue) return;
      attrs.Set("copy_to", std::string(ir::DTypeName(g->value(copy).dtype)));
    };
    auto adopt_copy = [&]() {
      if (copy == ir::kNoValue) return;
      for (ir::NodeId c : casts) {
        g->ReplaceAllUses(g->node(c).outputs[0], copy);
        g->RemoveNode(c);
      }
      g->state_updates().push_back({copy, copy_new});
      copies.push_back(copy);
    };
    const std::string scope = scope_of(pg.param);
    const ir::ValueId p_new = AddLike(g, param, "optimizer/" + param.name + "/updated");
    ir::Attrs a;
    a.Set("weight_decay", options.weight_decay);
    if (options.kind == OptimizerKind::kSGD) {
      a.Set("momentum", options.momentum);
      a.Set("nesterov", int64_t{options.nesterov ? 1 : 0});
      ir::ValueId buf = ir::kNoValue, buf_new = ir::kNoValue;
      if (options.momentum != 0) {
        buf = AddStateBuffer(g, param, "momentum");
        buf_new = AddLike(g, param, "optimizer/" + param.name + "/momentum_updated");
        info.state.push_back(buf);
      }
      std::vector<ir::ValueId> outs{p_new};
      if (buf_new != ir::kNoValue) outs.push_back(buf_new);
      std::vector<ir::ValueId> ins{pg.param, pg.grad, info.lr};
      if (buf != ir::kNoValue || info.clip_scale != ir::kNoValue) ins.push_back(buf);
      if (info.clip_scale != ir::kNoValue) ins.push_back(info.clip_scale);
      use_copy(a);
      AddOptimizerNode(g, ir::OpKind::kSGDUpdate, "optimizer/" + param.name + "/SGDUpdate", ins,
                       with_extras(std::move(outs), ir::OpKind::kSGDUpdate), std::move(a), param.name, scope);
      g->state_updates().push_back({pg.param, p_new});
      if (buf != ir::kNoValue) g->state_updates().push_back({buf, buf_new});
    } else {
      a.Set("beta1", options.beta1);
      a.Set("beta2", options.beta2);
      a.Set("eps", options.eps);
      const ir::ValueId m = AddStateBuffer(g, param, "adam_m");
      const ir::ValueId v = AddStateBuffer(g, param, "adam_v");
      info.state.push_back(m);
      info.state.push_back(v);
      const ir::ValueId m_new = AddLike(g, param, "optimizer/" + param.name + "/adam_m_updated");
      const ir::ValueId v_new = AddLike(g, param, "optimizer/" + param.name + "/adam_v_updated");
      std::vector<ir::ValueId> ins{pg.param, pg.grad, m, v, info.lr, info.step};
      if (info.clip_scale != ir::kNoValue) ins.push_back(info.clip_scale);
      use_copy(a);
      AddOptimizerNode(g, ir::OpKind::kAdamWUpdate, "optimizer/" + param.name + "/AdamWUpdate",
                       ins, with_extras({p_new, m_new, v_new}, ir::OpKind::kAdamWUpdate), std::move(a), param.name,
                       scope);
      g->state_updates().push_back({pg.param, p_new});
      g->state_updates().push_back({m, m_new});
      g->state_updates().push_back({v, v_new});
    }
    adopt_copy();
  }
  info.state.insert(info.state.end(), copies.begin(), copies.end());
  for (ir::ValueId s : info.state) info.state_bytes += g->value(s).constant->num_bytes();

  if (options.clip_norm == 0) add_norm();

  // Phase 4: outputs. The norm is one; the gradients stop being ones unless asked to stay.
  if (!options.keep_grad_outputs) {
    const std::set<ir::ValueId> grad_set(grads.begin(), grads.end());
    std::vector<ir::ValueId>& outs = g->outputs();
    outs.erase(std::remove_if(outs.begin(), outs.end(),
                              [&](ir::ValueId v) { return grad_set.count(v) > 0; }),
               outs.end());
  }
  g->outputs().push_back(info.grad_norm);
  return info;
}

}  // namespace onnxpipe::autodiff
