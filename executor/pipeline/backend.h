// What the pipeline driver needs from a backend: run one node of a stage program, add a gradient
// into an accumulator, and test a tensor for NaN/Inf. The CPU backend wraps cpu::CpuEvaluator; a
// CUDA backend implements the same three calls on device tensors and streams, and the driver,
// schedules, comm and stage programs stay as they are. Implementations are used by every stage
// thread at once: their methods must be thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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
  // absent optional input.
  virtual absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                                      const RandomContext& ctx) const = 0;
  // acc + x (same dtype and dims), a new tensor: acc may be shared with other holders.
  virtual absl::StatusOr<ir::Tensor> Accumulate(const ir::Tensor& acc, const ir::Tensor& x) const = 0;
  // acc += x in place; the caller owns acc's storage exclusively. Element for element the same
  // addition as Accumulate (acc[i] + x[i]), so results do not depend on which one ran.
  virtual absl::Status AccumulateInPlace(ir::Tensor& acc, const ir::Tensor& x) const = 0;
  virtual bool AllFinite(const ir::Tensor& t) const = 0;
};

std::shared_ptr<const StageBackend> MakeCpuBackend();

}  // namespace onnxpipe::pipeline
