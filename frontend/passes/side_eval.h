// SideEvaluator: computes the data of a value from constants and parameters, for analysis only.
// Nothing is written to the graph. ConstantFolding uses it for gradient-stopping (non-float) nodes
// over parameters, AttentionFusion to read a mask built from a buffer initializer (a causal
// triangle) and prove it causal.
//
// A value is computable when it holds constant data (any constant, parameters included) or its
// producer is a live node other than Dropout whose operands are all computable and whose output
// has a concrete shape of at most `max_elements` elements; Shape of a value with a concrete shape
// is computable without its operand. Graph inputs never are. Results (and failures) are cached,
// so walking up a large graph is linear; the cache assumes values keep their meaning, which
// folding and fusion guarantee.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::passes {

class SideEvaluator {
 public:
  SideEvaluator(const ir::Graph& g, const ir::OpEvaluator& evaluator, int64_t max_elements);

  // The value's data, or nullopt when it is not computable. Evaluator errors other than
  // kUnimplemented are returned, naming the node.
  absl::StatusOr<std::optional<ir::Tensor>> Compute(ir::ValueId v) { return Compute(v, 0); }

 private:
  absl::StatusOr<std::optional<ir::Tensor>> Compute(ir::ValueId v, int depth);
  std::optional<ir::Tensor> Fail(ir::ValueId v) {
    not_computable_.insert(v);
    return std::nullopt;
  }

  const ir::Graph& g_;
  const ir::OpEvaluator& ev_;
  int64_t max_elements_;
  std::unordered_set<ir::ValueId> graph_inputs_;
  std::unordered_map<ir::ValueId, ir::Tensor> computed_;
  std::unordered_set<ir::ValueId> not_computable_;
};

}  // namespace onnxpipe::passes
