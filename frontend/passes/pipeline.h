// The standard forward pipeline: what runs between import (plus shape inference and symbol
// binding) and autodiff.
//
//   0. freeze-buffers (which float initializers are parameters: autodiff/trainable.h), upcast of
//      half precision, tying of transposed initializers
//   1. fixpoint { constant-folding, dce }   shape arithmetic, no-op Cast/Identity/Reshape/Expand
//   2. linear, layer-norm, rms-norm, gelu, attention fusion (attention after the others; it only looks at
//      the attention core, between the Q/K/V projections and the output projection)
//   3. gathers-to-split, attention-layout (Attention reads and writes through strided views where
//      exported layout ops would copy; concrete shapes only)
//   4. dce
// with ir::Verify after every pass. The caller (tools/model.cc) does:
//   load -> InferShapes -> [BindSymbols + InferShapes] -> RunForwardPipeline.
// Folding only removes shape arithmetic once dims are concrete, so the fused histogram of an
// unbound graph still shows Shape/Gather/Concat; fusion itself works on symbolic shapes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "frontend/passes/constant_folding.h"

namespace onnxpipe::passes {

struct PipelineOptions {
  bool fold = true;
  bool fuse = true;
  bool verify = true;  // ir::Verify after every pass
  ConstantFoldingOptions folding;
  // When set, receives the names of the passes that changed the graph, in order.
  std::vector<std::string>* changed_log = nullptr;
};

absl::Status RunForwardPipeline(ir::Graph* g, const ir::OpEvaluator& evaluator,
                                const PipelineOptions& options = {});

}  // namespace onnxpipe::passes
