// Dropout on the GPU with the CPU backend's random stream (executor/cpu/philox.h): element i of a
// node's tensor is kept iff DropoutStream::Make(seed, node_key, offset, ratio).Keep(counter_base + i),
// so masks are bit-identical to the CPU backend's for the same node and EvalContext, and a
// recompute or backward replays the forward's mask.
//   forward:  y = keep ? x * scale : 0, scale = 1 / (1 - ratio) rounded to fp32 (0 when ratio = 1);
//             mask (optional, one byte per element, 1 = keep).
//   backward: dx = keep ? dy * scale : 0, keep read from `mask` or, when mask is null, regenerated.
// Buffers x, y, dy, dx, mask: (n), dtypes f32 bf16 f16 (the 16-bit ones compute in fp32).
// Inference (training = false) or ratio 0: y = x, mask all 1, dx = dy.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#endif

namespace onnxpipe::cuda {

struct DropoutParams {
  bool training = true;
  double ratio = 0.5;
  uint64_t seed = 0;          // EvalContext::seed
  uint64_t node_key = 0;      // cpu::NodeRngKey(node): FNV-1a of attr rng_key, else the node's name
  uint64_t offset = 0;        // EvalContext::offset (the step)
  uint64_t counter_base = 0;  // counter of element 0: row_offset * (numel / rows) for a micro-batch
  // CUDA graphs: when set, the offset is read from this device value when the kernel runs (update it
  // before each replay) and `offset` is ignored.
  const uint64_t* device_offset = nullptr;
};

// Whether `p` drops anything: training with a ratio over 0.
inline bool DropoutActive(const DropoutParams& p) { return p.training && p.ratio > 0.0; }
// The CPU backend's scale of a kept element, 1 / (1 - ratio) (0 when everything drops).
inline double KeepScale(const DropoutParams& p) { return p.ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - p.ratio); }

cudaError_t LaunchDropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask,
                                 int64_t n, cudaStream_t stream);
cudaError_t LaunchDropoutBackward(const DropoutParams& p, ir::DType dtype, const void* dy, const uint8_t* mask,
                                  void* dx, int64_t n, cudaStream_t stream);

#ifndef __CUDACC__
// The parameters the CPU backend uses for `node` (attrs rng_key and the ratio: a Dropout's or
// DropoutGrad's `ratio`, the `dropout` of an op with a fused dropout, op.h) evaluated on a tensor of
// `numel` elements under an EvalContext with these fields; an error naming the node when ratio is
// outside [0, 1] or numel does not split into `rows` batch rows.
absl::StatusOr<DropoutParams> DropoutParamsFor(const ir::Node& node, bool training, uint64_t seed, uint64_t offset,
                                               int64_t row_offset, int64_t rows, int64_t numel);

// mask may be null (not written).
absl::Status DropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask, int64_t n,
                            cudaStream_t stream);
// mask may be null: the keep decisions are regenerated from p.
absl::Status DropoutBackward(const DropoutParams& p, ir::DType dtype, const void* dy, const uint8_t* mask, void* dx,
                             int64_t n, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
