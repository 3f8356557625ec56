// ConstantFolding: evaluates nodes whose operands are all compile-time constants, folds Shape of
// values with concrete shapes, and bypasses no-op nodes.
//
// What it does, per live node in topological order:
//  1. Shape(x) where x's shape is concrete (after ir::BindSymbols + ir::InferShapes) becomes an
//     i64 constant. This is what makes the exporter's Shape->Gather->Unsqueeze->Concat->Reshape
//     chains fold away once the batch and sequence sizes are bound.
//  2. No-op nodes are bypassed (their uses rewired to their input): Identity, Cast to the input's
//     own dtype, Reshape and Expand whose output shape equals the input shape, and x + 0, x - 0
//     where the 0 is a uniform non-parameter constant, a ConstantOfShape or a product of such, and
//     the output has x's shape and dtype.
//  3. A node whose operands are all frozen constants (see below) is evaluated with the injected
//     ir::OpEvaluator and its outputs become constant values; the node is removed.
//  4. A node whose outputs are all non-float (bool, integer) and whose operands are computable
//     from constants and parameters (e.g. `Equal(Slice(causal_mask_buffer), 0)`) is evaluated as
//     well: no gradient flows through a non-float value, so folding it cannot change training.
//     The float intermediates it needs are computed on the side and never committed.
//
// Frozen constants are values with constant data that are not float initializers: Constant-node
// values, integer/bool initializers and previously folded values. Float initializers are never
// folded into new constants: a parameter would be detached from its gradient, and a frozen buffer
// (ir::ParamState::kFrozen, e.g. a rotary inv_freq) is computed with in the graph's training
// precision rather than rounded to the export's (pattern.h: IsFoldableConstant). Graph inputs are
// never constants.
//
// Never folded: Dropout (random while training), nodes producing a graph output (outputs keep
// their names and producers), and nodes whose output has more than `max_elements` elements (the
// folded tensor would bloat the graph; Expand/ConstantOfShape/Range outputs are sized before they
// are evaluated). An evaluator that answers kUnimplemented for an op leaves the node unfolded;
// any other evaluator error is returned, naming the node.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/pass.h"

namespace onnxpipe::passes {

struct ConstantFoldingOptions {
  int64_t max_elements = int64_t{1} << 20;
};

class ConstantFolding : public Pass {
 public:
  explicit ConstantFolding(const ir::OpEvaluator& evaluator, ConstantFoldingOptions options = {})
      : evaluator_(evaluator), options_(options) {}
  std::string_view name() const override { return "constant-folding"; }
  absl::StatusOr<bool> Run(ir::Graph* g) override;

 private:
  const ir::OpEvaluator& evaluator_;
  ConstantFoldingOptions options_;
};

}  // namespace onnxpipe::passes
