// Reverse-mode automatic differentiation over the IR (ONNX Runtime's gradient graph builder is the
// model). BuildGradients turns a forward graph with a scalar loss into a training graph: the same
// ir::Graph with backward nodes appended (Phase::kBackward, Node::origin = the forward node they
// differentiate) and one gradient value "grad/<param name>" per trainable parameter.
//
// Trainable parameters are float initializers (Value::is_initializer, float dtype, not produced by
// a node) that the trainable-parameter rule did not freeze (Value::param_state, trainable.h: the
// forward pipeline's first pass), whose name does not match GradOptions::freeze_regex and from
// which the loss is reachable through differentiable edges. Gradients stop at integer/bool values and at the inputs an op's
// rule declares non-differentiable (Gather indices, Reshape shape, Slice starts..., Where
// condition, Attention mask, loss labels...); ops such as Shape and comparisons cut the graph.
// Several contributions to one gradient are summed with one Sum node (tied weights accumulate).
// An op on the path from a parameter to the loss without a gradient rule is an error naming the
// node and the op. Optimizer nodes (Phase::kOptimizer) are added later by another pass; nothing
// here assumes they are absent or present.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

struct GradOptions {
  // ECMAScript regular expression searched in initializer names (std::regex_search, so "pos_table"
  // matches "/encoder/pos_table"); matching initializers are frozen (constants). Empty: none.
  std::string freeze_regex;
  // Appends the loss (if not already one) and every parameter gradient to the graph outputs, so
  // that dead-code elimination keeps them. The optimizer pass may take them off again.
  bool grads_as_outputs = true;
};

struct ParamGrad {
  ir::ValueId param = ir::kNoValue;
  ir::ValueId grad = ir::kNoValue;  // named "grad/<param name>"
};

struct TrainingGraphInfo {
  ir::ValueId loss = ir::kNoValue;
  std::vector<ParamGrad> param_grads;          // in value-id order of the parameters
  std::vector<ir::ValueId> unreachable_params;  // float initializers the loss does not depend on
  std::vector<ir::ValueId> frozen_params;       // excluded by freeze_regex (not those the rule froze)
};

// Builds the backward pass of `g` from the scalar float value `loss` (seeded with dLoss = 1).
// Reorders the existing nodes topologically (stable) first. On error the graph may hold some
// backward nodes already; callers discard it.
absl::StatusOr<TrainingGraphInfo> BuildGradients(ir::Graph* g, ir::ValueId loss,
                                                 const GradOptions& options);

}  // namespace onnxpipe::autodiff
