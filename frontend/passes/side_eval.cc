#include "frontend/passes/side_eval.h"

#include <string>
#include <vector>

#include "frontend/ir/status.h"
#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {

SideEvaluator::SideEvaluator(const ir::Graph& g, const ir::OpEvaluator& evaluator,
                             int64_t max_elements)
    : g_(g), ev_(evaluator), max_elements_(max_elements) {
  graph_inputs_.insert(g.inputs().begin(), g.inputs().end());
}

absl::StatusOr<std::optional<ir::Tensor>> SideEvaluator::Compute(ir::ValueId v, int depth) {
  using Result = std::optional<ir::Tensor>;
  const ir::Value& val = g_.value(v);
  if (graph_inputs_.count(v)) return Result();
  if (val.constant) return Result(*val.constant);
  if (auto it = computed_.find(v); it != computed_.end()) return Result(it->second);
  // Deep chains are shape arithmetic gone wrong, not masks; give up rather than recurse.
  if (not_computable_.count(v) || depth > 64) return Result();
  const ir::Node* n = ProducerOf(g_, v);
  if (n == nullptr || n->op == ir::OpKind::kDropout || !val.shape_known ||
      !ir::IsConcrete(val.shape) || ir::NumElements(val.shape).value() > max_elements_) {
    return Fail(v);
  }
  if (n->op == ir::OpKind::kShape) {
    std::optional<ir::Tensor> t = ConcreteShapeTensor(g_, *n);
    if (!t) return Fail(v);
    computed_[v] = *t;
    return t;
  }
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId in : n->inputs) {
    if (in == ir::kNoValue) {
      inputs.emplace_back();
      continue;
    }
    ASSIGN_OR_RETURN(Result t, Compute(in, depth + 1));
    if (!t) return Fail(v);
    inputs.push_back(std::move(*t));
  }
  absl::StatusOr<std::vector<ir::Tensor>> result = ev_.Evaluate(*n, inputs);
  if (!result.ok()) {
    if (absl::IsUnimplemented(result.status())) return Fail(v);
    return Annotate(result.status(), "evaluating node '" + n->name + "' (" +
                                         std::string(ir::OpName(n->op)) + ")");
  }
  for (size_t i = 0; i < n->outputs.size() && i < result->size(); ++i) {
    if (n->outputs[i] != ir::kNoValue && (*result)[i].defined()) computed_[n->outputs[i]] = (*result)[i];
  }
  auto it = computed_.find(v);
  if (it == computed_.end()) return Fail(v);
  return Result(it->second);
}

}  // namespace onnxpipe::passes
