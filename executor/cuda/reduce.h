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
#include <optional>
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

// The split-columns geometry (reduce.cu) of a dense (rows, cols) reduced over its rows, when cols is a
// whole number of 16-byte vectors of `elem_bytes` elements; nullopt for any other plan.
constexpr int kSplitVecLanes = 32, kSplitRowLanes = 8;  // a block: 32 vectors of columns x 8 rows
struct ColumnSplit {
  int64_t rows = 0, cols = 0, splits = 1, rows_per_split = 0, col_blocks = 0;
};
std::optional<ColumnSplit> ColumnSplitOf(const ReducePlan& plan, int elem_bytes);
// Device scratch that makes `plan` take the split-columns path (0: it cannot).
int64_t ReduceWorkspaceBytes(const ReducePlan& plan, ir::DType x_dtype);

// `workspace` (ReduceWorkspaceBytes of it, or null) chooses the split-columns path where it applies.
cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

#ifndef __CUDACC__
// The plan of reducing `in_dims` over `axes` (negative counts from the end; empty = every axis,
// ONNX's default); an error for an axis out of range, repeated, or too many dims.
absl::StatusOr<ReducePlan> MakeReducePlan(const std::vector<int64_t>& in_dims, const std::vector<int64_t>& axes);
// The plan of ReduceToShapeOf: sum x (in_dims) over the axes along which `like` (right-aligned,
// numpy rules) broadcasts to in_dims; y has like's shape. An error when like does not broadcast.
absl::StatusOr<ReducePlan> MakeReduceToShapePlan(const std::vector<int64_t>& in_dims,
                                                 const std::vector<int64_t>& like_dims);

absl::Status Reduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                    void* y, cudaStream_t stream, void* workspace = nullptr, int64_t workspace_bytes = 0);
#endif

}  // namespace onnxpipe::cuda
