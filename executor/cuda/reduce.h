// ReduceSum / ReduceMean over a set of axes on the GPU: bias gradients, the gradient of a
// broadcast (ReduceToShapeOf) and the ONNX Reduce ops.
//
// x is a dense row-major (in_dims) tensor; y holds the kept elements in row-major order (keepdims
// only changes the dims a caller records, never the layout). Sums accumulate in double, in a fixed
// order (deterministic), and round once to y's dtype; Mean divides the double sum by the number of
// reduced elements, as the CPU backend does. x and y dtypes: f32 bf16 f16 (independently, e.g. a
// bf16 gradient reduced into an fp32 bias gradient); or i64 / i32 summed into their own dtype, in
// int64 with wrap-around (a mask's token count: the mean pooling of ModernBERT-like encoders).
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

// How LaunchReduce walks a plan (reduce.cu). GeometryOf depends on the plan, the element size and
// whether a workspace is given, never on the device, so a shape always sums in the same order:
//  - columns (x's innermost dim kept): a block holds 256 / lanes neighbouring output vectors of `vec`
//    elements (16 bytes where the innermost kept extent allows) times `lanes` reduced lanes, each lane
//    summing its contiguous share of the slice in order; the lanes are added in order in shared memory;
//  - rows (the innermost dim reduced, runs of >= 32 elements): `lanes` warps per output read 16-byte
//    vectors of the contiguous runs and add up in a fixed shuffle/shared-memory tree.
// With `splits` > 1 each slice of `chunk` reduced elements writes one double per output into the
// workspace, and a second kernel adds the slices in order.
constexpr int kReduceBlock = 256;
struct ReduceGeometry {
  bool rows = false;
  int vec = 1;
  int lanes = 1;
  int64_t splits = 1, chunk = 0;
};
ReduceGeometry GeometryOf(const ReducePlan& plan, int elem_bytes, bool split);
// Device scratch that lets `plan` split its reduced range over the GPU (0: it never splits).
int64_t ReduceWorkspaceBytes(const ReducePlan& plan, ir::DType x_dtype);

// `workspace` (ReduceWorkspaceBytes of it, or null) lets the reduction split its reduced range.
cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

// CumSum along the middle dim of a dense (outer, n, inner) x into y (same dims): y[o, j, i] = the sum
// of x[o, s, i] over s <= j (exclusive: s < j; reverse: s >= j; both: s > j). A thread per (o, i)
// line, in order: floats sum in double and round each output once, integers in int64 (wrapping), as
// the CPU backend. dtypes f32 bf16 f16 i64 i32.
cudaError_t LaunchCumSum(ir::DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                         bool exclusive, bool reverse, cudaStream_t stream);

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
// LaunchCumSum, checked: an error naming CumSum for another dtype, a negative extent or a null pointer.
absl::Status CumSum(ir::DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner, bool exclusive,
                    bool reverse, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
