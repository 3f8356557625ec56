// Evaluates one node on host tensors. The CPU backend implements it; constant folding in
// frontend/passes is handed one, so the frontend never depends on a backend.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

// An executor's storage for node outputs (pipeline/stage_arena implements it over a stage's
// plan). Called by kernels on the evaluating thread only.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // Zero-filled storage for output `index` of `node` with `dtype` and `dims`; an error naming the
  // node and output when they disagree with the plan. Exception: an optimizer update's new state
  // may be handed the state's own storage (updated in place, so not zeroed); the update kernels
  // are elementwise and read each element before writing it.
  virtual absl::StatusOr<Tensor> Allocate(const Node& node, int index, DType dtype,
                                          const std::vector<int64_t>& dims) = 0;
  // As Allocate but the contents are undefined (no zero fill: one pass over the output less), for
  // kernels that write every element of the output.
  virtual absl::StatusOr<Tensor> AllocateUninitialized(const Node& node, int index, DType dtype,
                                                       const std::vector<int64_t>& dims) {
    return Allocate(node, index, dtype, dims);
  }
  // True when output `index` of `node` is planned to share its input 0's bytes (a Reshape-like
  // view), so the kernel returns a view instead of writing a copy.
  virtual bool SharesInputBuffer(const Node& node, int index) const = 0;
  // `bytes` of scratch for `node`, valid until the next call: the plan's workspace. An error when
  // the plan reserved less.
  virtual absl::StatusOr<void*> Workspace(const Node& node, int64_t bytes) = 0;
};

class OpEvaluator {
 public:
  virtual ~OpEvaluator() = default;
  // inputs[i] is undefined (Tensor::defined() == false) for an absent optional input.
  // Returns one tensor per node output (undefined for outputs it does not compute).
  virtual absl::StatusOr<std::vector<Tensor>> Evaluate(const Node& node,
                                                       const std::vector<Tensor>& inputs) const = 0;
  // Evaluate with every output taken from `outputs` (views of planned slots) instead of fresh
  // tensors. The default ignores `outputs`; a planned executor then reports the outputs that are
  // not in their slots.
  virtual absl::StatusOr<std::vector<Tensor>> EvaluateInto(const Node& node,
                                                           const std::vector<Tensor>& inputs,
                                                           OutputAllocator* outputs) const {
    return Evaluate(node, inputs);
  }
};

}  // namespace onnxpipe::ir
