// What the pipeline driver needs from a backend: run one node of a stage program into planned
// slots, say how much kernel scratch a node needs, add a gradient into an accumulator, and test a
// tensor for NaN/Inf. The CPU backend wraps cpu::CpuEvaluator; a
// CUDA backend implements the same three calls on device tensors and streams, and the driver,
// schedules, comm and stage programs stay as they are. Implementations are used by every stage
// thread at once: their methods must be thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::pipeline {

// The random stream of one micro-batch (cpu::EvalContext's fields): a node evaluated twice with the
// same context (recompute) draws the same dropout mask, and a micro-batch of rows
// [row_offset, row_offset + rows) draws those rows of the full batch's masks.
struct RandomContext {
  bool training = false;
  uint64_t seed = 0;
  uint64_t offset = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
};

class StageBackend {
 public:
  virtual ~StageBackend() = default;
  virtual std::string name() const = 0;
  // One tensor per node output (undefined for outputs not computed); inputs[i] undefined for an
  // absent optional input. With `outputs` (the stage's planned slots, stage_arena.h) every output
  // and the kernel's scratch come from it; without, from fresh allocations.
  virtual absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                                      const RandomContext& ctx,
                                                      ir::OutputAllocator* outputs = nullptr) const = 0;
  // Scratch bytes the kernel of `node` takes from OutputAllocator::Workspace (the memory plan's
  // workspace function).
  virtual int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const = 0;
  // acc += x in place (acc[i] + x[i], the addition of the graph's gradient Sums); the caller owns
  // acc's storage exclusively.
  virtual absl::Status AccumulateInPlace(ir::Tensor& acc, const ir::Tensor& x) const = 0;
  virtual bool AllFinite(const ir::Tensor& t) const = 0;
};

std::shared_ptr<const StageBackend> MakeCpuBackend();

}  // namespace onnxpipe::pipeline
