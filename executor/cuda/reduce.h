// ReduceSum / ReduceMean over a set of axes on the GPU: bias gradients, the gradient of a
// broadcast (ReduceToShapeOf) and the ONNX Reduce ops.
//
// x is a dense row-major (in_dims) tensor; y holds the kept elements in row-major order (keepdims
// only changes the dims a caller records, never the layout). Sums accumulate in double, in a fixed
// order (deterministic), and round once to y's dtype; Mean divides the double sum by the number of
// reduced elements, as the CPU backend does. x and y dtypes: f32 bf16 f16 (independently, e.g. a
// bf16 gradient reduced into an fp32 bias gradient).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#endif

namespace onnxpipe::cuda {

enum class ReduceKind { kSum, kMean };

// Kept and reduced dims (merged where contiguous), each with its element stride in x.
constexpr int kMaxReduceRank = 8;
struct ReducePlan {
  int kept_rank = 0, reduced_rank = 0;
  int64_t kept_dims[kMaxReduceRank] = {}, kept_strides[kMaxReduceRank] = {};
  int64_t reduced_dims[kMaxReduceRank] = {}, reduced_strides[kMaxReduceRank] = {};
  int64_t num_out = 1, num_reduced = 1;
  bool innermost_reduced = false;  // x's last (non-1) dim is reduced: rows are contiguous
};

cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, cudaStream_t stream);

#ifndef __CUDACC__
// The plan of reducing `in_dims` over `axes` (negative counts from the end; empty = every axis,
// ONNX's default); an error for an axis out of range, repeated, or too many dims.
absl::StatusOr<ReducePlan> MakeReducePlan(const std::vector<int64_t>& in_dims, const std::vector<int64_t>& axes);
// The plan of ReduceToShapeOf: sum x (in_dims) over the axes along which `like` (right-aligned,
// numpy rules) broadcasts to in_dims; y has like's shape. An error when like does not broadcast.
absl::StatusOr<ReducePlan> MakeReduceToShapePlan(const std::vector<int64_t>& in_dims,
                                                 const std::vector<int64_t>& like_dims);

absl::Status Reduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                    void* y, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
