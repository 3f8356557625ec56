// Constant and shape folding. The folder walks the nodes once in topological order, so a chain of
// foldable nodes collapses in a single run: each folded output is a constant by the time its
// consumers are visited.

#include "frontend/passes/constant_folding.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
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

class Folder {
 public:
  Folder(Graph* g, const ir::OpEvaluator& ev, const ConstantFoldingOptions& options)
      : g_(g), ev_(ev), options_(options), side_(*g, ev, options.max_elements) {
    graph_inputs_.insert(g->inputs().begin(), g->inputs().end());
  }

  absl::StatusOr<bool> Run() {
    bool changed = false;
    for (NodeId id : g_->LiveNodes()) {
      ASSIGN_OR_RETURN(bool folded, Visit(id));
      changed |= folded;
    }
    if (changed) RETURN_IF_ERROR(g_->TopoSort());
    return changed;
  }

 private:
  bool Frozen(ValueId v) const { return v == ir::kNoValue || (!graph_inputs_.count(v) && IsFoldableConstant(*g_, v)); }

  bool ProducesGraphOutput(const Node& n) const {
    return std::any_of(n.outputs.begin(), n.outputs.end(),
                       [&](ValueId v) { return v != ir::kNoValue && g_->IsGraphOutput(v); });
  }

  absl::StatusOr<bool> Visit(NodeId id) {
    const Node& n = g_->node(id);
    if (n.removed || n.op == OpKind::kDropout || ProducesGraphOutput(n)) return false;
    if (n.op == OpKind::kShape) {
      std::optional<Tensor> t = ConcreteShapeTensor(*g_, n);
      if (!t) return false;
      RETURN_IF_ERROR(Commit(id, {*t}));
      return true;
    }
    if (std::optional<ValueId> in = PassThrough(n)) {
      const ValueId out = n.outputs[0];
      g_->RemoveNode(id);
      g_->ReplaceAllUses(out, *in);
      return true;
    }
    if (std::all_of(n.inputs.begin(), n.inputs.end(), [&](ValueId v) { return Frozen(v); })) {
      if (!OutputsFitCap(n)) return false;
      std::vector<Tensor> inputs;
      for (ValueId v : n.inputs) inputs.push_back(v == ir::kNoValue ? Tensor() : *g_->value(v).constant);
      return EvaluateAndCommit(id, inputs);
    }
    if (AllOutputsNonFloat(n)) {
      // Rule 4 of the header: a gradient-stopping node over parameters.
      std::vector<Tensor> inputs;
      for (ValueId v : n.inputs) {
        if (v == ir::kNoValue) {
          inputs.emplace_back();
          continue;
        }
        ASSIGN_OR_RETURN(std::optional<Tensor> t, side_.Compute(v));
        if (!t) return false;
        inputs.push_back(*t);
      }
      if (!OutputsFitCap(n)) return false;
      return EvaluateAndCommit(id, inputs);
    }
    return false;
  }

  bool AllOutputsNonFloat(const Node& n) const {
    bool any = false;
    for (ValueId v : n.outputs) {
      if (v == ir::kNoValue) continue;
      if (ir::IsFloat(g_->value(v).dtype)) return false;
      any = true;
    }
    return any;
  }

  bool SameKnownShape(ValueId a, ValueId b) const {
    const ir::Value& va = g_->value(a);
    const ir::Value& vb = g_->value(b);
    if (!va.shape_known || !vb.shape_known || va.shape != vb.shape) return false;
    // Two fresh unknown dims never compare equal, but the same unknown symbol might have been
    // propagated without proof; only trust concrete and named symbolic dims.
    return std::none_of(va.shape.begin(), va.shape.end(), [](const ir::Dim& d) { return d.is_unknown(); });
  }

  // The input a no-op node's output equals (rule 2 of the header): Identity, Cast to the input's
  // dtype, Reshape and Expand to the input's shape, and x + 0, x - 0 where the output has x's shape
  // and dtype (GPT-NeoX-Japanese's baddbmm adds beta times a zero tensor to the attention scores).
  // x * 1 stays: a norm's frozen all-ones scale (an untrained Gemma's 1 + weight) is part of the
  // pattern its fusion matches.
  std::optional<ValueId> PassThrough(const Node& n) const {
    if (n.outputs.empty() || n.outputs[0] == ir::kNoValue || n.inputs.empty() || n.inputs[0] == ir::kNoValue) {
      return std::nullopt;
    }
    const ValueId in = n.inputs[0], out = n.outputs[0];
    auto unchanged = [&](ValueId x) -> std::optional<ValueId> {
      if (g_->value(x).dtype != g_->value(out).dtype || !SameKnownShape(x, out)) return std::nullopt;
      return x;
    };
    auto operand_if_other_is_zero = [&](bool either_side) -> std::optional<ValueId> {
      if (n.inputs.size() != 2 || n.inputs[1] == ir::kNoValue) return std::nullopt;
      if (UniformValue(n.inputs[1]) == 0.0) return unchanged(n.inputs[0]);
      if (either_side && UniformValue(n.inputs[0]) == 0.0) return unchanged(n.inputs[1]);
      return std::nullopt;
    };
    switch (n.op) {
      case OpKind::kIdentity:
        if (g_->value(in).dtype != g_->value(out).dtype) return std::nullopt;
        return in;
      case OpKind::kCast: {
        std::optional<ir::DType> to = ir::ParseDType(n.attrs.Get<std::string>("to"));
        if (!to.has_value() || *to != g_->value(in).dtype) return std::nullopt;
        return in;
      }
      case OpKind::kReshape:
      case OpKind::kExpand:
        return unchanged(in);
      case OpKind::kAdd:
        return operand_if_other_is_zero(true);
      case OpKind::kSub:
        return operand_if_other_is_zero(false);
      default:
        return std::nullopt;
    }
  }

  // The value every element of float `v` holds when that is known before the graph runs: a constant
  // that is not a parameter with all elements equal, a ConstantOfShape's fill, or the product of two
  // such values (beta * zeros).
  std::optional<double> UniformValue(ValueId v) const {
    const ir::Value& val = g_->value(v);
    if (!ir::IsFloat(val.dtype)) return std::nullopt;
    if (IsFrozenConstant(*g_, v) && val.constant->num_elements() > 0) {
      const Tensor& t = *val.constant;
      const double first = t.GetAsDouble(0);
      for (int64_t i = 1; i < t.num_elements(); ++i) {
        if (t.GetAsDouble(i) != first) return std::nullopt;
      }
      return first;
    }
    if (val.producer == ir::kNoNode) return std::nullopt;
    const Node& p = g_->node(val.producer);
    if (p.removed) return std::nullopt;
    if (p.op == OpKind::kMul && p.inputs.size() == 2 && p.inputs[1] != ir::kNoValue) {
      const std::optional<double> a = UniformValue(p.inputs[0]), b = UniformValue(p.inputs[1]);
      if (!a || !b || !std::isfinite(*a * *b)) return std::nullopt;
      return *a * *b;
    }
    if (p.op != OpKind::kConstantOfShape) return std::nullopt;
    const Tensor fill = p.attrs.Get<Tensor>("value");
    return fill.defined() && fill.num_elements() == 1 ? fill.GetAsDouble(0) : 0.0;
  }

  // Element count of each output known before evaluating, where it can be; false when one is
  // over the cap. Unknown counts are checked after evaluation.
  bool OutputsFitCap(const Node& n) const {
    for (ValueId v : n.outputs) {
      if (v == ir::kNoValue) continue;
      const ir::Value& val = g_->value(v);
      if (val.shape_known && ir::IsConcrete(val.shape) && ir::NumElements(val.shape).value() > options_.max_elements) {
        return false;
      }
    }
    std::optional<double> estimate = EstimateElements(n);
    return !estimate || *estimate <= static_cast<double>(options_.max_elements);
  }

  // Sizes of the ops whose output can be far larger than their inputs, from constant operands.
  std::optional<double> EstimateElements(const Node& n) const {
    auto const_of = [&](int i) -> const Tensor* {
      if (i >= static_cast<int>(n.inputs.size()) || n.inputs[i] == ir::kNoValue) return nullptr;
      const ir::Value& v = g_->value(n.inputs[i]);
      return v.constant ? &*v.constant : nullptr;
    };
    switch (n.op) {
      case OpKind::kConstantOfShape:
      case OpKind::kExpand: {
        const Tensor* shape = const_of(n.op == OpKind::kExpand ? 1 : 0);
        if (shape == nullptr) return std::nullopt;
        double count = 1;
        for (int64_t d : shape->ToInt64Vector()) count *= std::max<int64_t>(d, 1);
        if (n.op == OpKind::kExpand) {
          const Tensor* data = const_of(0);
          if (data != nullptr) count = std::max(count, static_cast<double>(data->num_elements()));
        }
        return count;
      }
      case OpKind::kRange: {
        const Tensor *start = const_of(0), *limit = const_of(1), *delta = const_of(2);
        if (!start || !limit || !delta || delta->GetAsDouble(0) == 0) return std::nullopt;
        return std::ceil((limit->GetAsDouble(0) - start->GetAsDouble(0)) / delta->GetAsDouble(0));
      }
      default:
        return std::nullopt;
    }
  }

  absl::StatusOr<bool> EvaluateAndCommit(NodeId id, const std::vector<Tensor>& inputs) {
    const Node& n = g_->node(id);
    absl::StatusOr<std::vector<Tensor>> result = ev_.Evaluate(n, inputs);
    if (!result.ok()) {
      if (absl::IsUnimplemented(result.status())) return false;
      return Annotate(result.status(), "folding " + ir::NodeLabel(n));
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i] == ir::kNoValue) continue;
      if (i >= result->size() || !(*result)[i].defined()) {
        return FAILED_PRECONDITION() << "folding " << ir::NodeLabel(n) << ": the evaluator computed no output " << i;
      }
      if ((*result)[i].num_elements() > options_.max_elements) return false;
    }
    RETURN_IF_ERROR(Commit(id, *result));
    return true;
  }

  // Turns the node's outputs into constants holding `results` and removes the node.
  absl::Status Commit(NodeId id, const std::vector<Tensor>& results) {
    const Node& n = g_->node(id);
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      ValueId v = n.outputs[i];
      if (v == ir::kNoValue) continue;
      ir::Value& val = g_->value(v);
      const Tensor& t = results[i];
      const ir::Shape dims = ir::FromInts(t.dims());
      if (t.dtype() != val.dtype) {
        return FAILED_PRECONDITION() << "folding " << ir::NodeLabel(n) << ": output '" << val.name << "' is declared "
                                     << ir::DTypeName(val.dtype) << " but evaluates to " << ir::DTypeName(t.dtype());
      }
      if (val.shape_known && ir::IsConcrete(val.shape) && val.shape != dims) {
        return FAILED_PRECONDITION() << "folding " << ir::NodeLabel(n) << ": output '" << val.name << "' is declared "
                                     << ir::ShapeToString(val.shape) << " but evaluates to " << ir::ShapeToString(dims);
      }
    }
    // Copy first: RemoveNode tombstones the node but keeps its outputs list.
    const std::vector<ValueId> outputs = n.outputs;
    g_->RemoveNode(id);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i] == ir::kNoValue) continue;
      ir::Value& val = g_->value(outputs[i]);
      val.constant = results[i];
      val.shape = ir::FromInts(results[i].dims());
      val.shape_known = true;
      val.is_initializer = false;
    }
    return absl::OkStatus();
  }

  Graph* g_;
  const ir::OpEvaluator& ev_;
  const ConstantFoldingOptions& options_;
  std::unordered_set<ValueId> graph_inputs_;
  SideEvaluator side_;  // parameter-derived values, never committed
};

}  // namespace

absl::StatusOr<bool> ConstantFolding::Run(ir::Graph* g) { return Folder(g, evaluator_, options_).Run(); }

}  // namespace onnxpipe::passes
