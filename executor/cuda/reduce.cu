// Reduction kernels, both deterministic (fixed per-thread order, fixed shared-memory tree):
//  - rows: the innermost dim is reduced, so one block per output walks contiguous memory;
//  - columns: the innermost dim is kept, so a block takes the neighbouring outputs of one 32-byte
//    sector (8 fp32 or 16 16-bit values: every byte read is used) and its 512 threads split the
//    reduced elements, so that a bias gradient of width D runs D / 8 blocks;
//  - split columns, when the caller gives the workspace ReduceWorkspaceBytes asks for: a dense
//    (rows, cols) reduced over its rows (a bias gradient) in two passes. The rows are cut into
//    slices so that the grid fills the GPU; each block sums 16-byte vectors of its slice into one
//    double per column and slice, and a second kernel adds the slices in order.
#include <optional>

#include "executor/cuda/device_util.cuh"
#include "executor/cuda/reduce.h"

namespace onnxpipe::cuda {
namespace {

__device__ __forceinline__ int64_t KeptOffset(const ReducePlan& p, int64_t o) {
  int64_t off = 0;
  for (int d = p.kept_rank - 1; d >= 0; --d) {
    const int64_t q = o / p.kept_dims[d];
    off += (o - q * p.kept_dims[d]) * p.kept_strides[d];
    o = q;
  }
  return off;
}

__device__ __forceinline__ int64_t ReducedOffset(const ReducePlan& p, int64_t r) {
  int64_t off = 0;
  for (int d = p.reduced_rank - 1; d >= 0; --d) {
    const int64_t q = r / p.reduced_dims[d];
    off += (r - q * p.reduced_dims[d]) * p.reduced_strides[d];
    r = q;
  }
  return off;
}

template <typename Y>
__device__ __forceinline__ void Finish(ReduceKind kind, const ReducePlan& p, double sum, Y* y, int64_t o) {
  const double v = kind == ReduceKind::kMean ? sum / static_cast<double>(p.num_reduced) : sum;
  if constexpr (std::is_same_v<Y, float>) {
    y[o] = static_cast<float>(v);
  } else {
    Store(y, o, static_cast<float>(v));
  }
}

template <typename X, typename Y>
__global__ void ReduceRowsKernel(ReduceKind kind, ReducePlan p, const X* __restrict__ x, Y* __restrict__ y) {
  __shared__ double partial[kThreads];
  for (int64_t o = blockIdx.x; o < p.num_out; o += gridDim.x) {
    const int64_t base = KeptOffset(p, o);
    double sum = 0;
    for (int64_t r = threadIdx.x; r < p.num_reduced; r += blockDim.x) {
      sum += static_cast<double>(Load(x, base + ReducedOffset(p, r)));
    }
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
      if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) Finish(kind, p, partial[0], y, o);
    __syncthreads();
  }
}

constexpr int kColThreads = 512;
// Outputs per column block: one 32-byte sector of x per row.
template <typename X>
constexpr int kColWidth = static_cast<int>(32 / sizeof(X));

template <typename X, typename Y>
__global__ void ReduceColumnsKernel(ReduceKind kind, ReducePlan p, const X* __restrict__ x, Y* __restrict__ y) {
  constexpr int kWidth = kColWidth<X>, kLanes = kColThreads / kWidth;
  __shared__ double partial[kLanes][kWidth + 1];
  const int col = threadIdx.x % kWidth, lane = threadIdx.x / kWidth;
  for (int64_t o0 = blockIdx.x * int64_t{kWidth}; o0 < p.num_out; o0 += int64_t{gridDim.x} * kWidth) {
    const int64_t o = o0 + col;
    double sum = 0;
    if (o < p.num_out) {
      const int64_t base = KeptOffset(p, o);
      for (int64_t r = lane; r < p.num_reduced; r += kLanes) {
        sum += static_cast<double>(Load(x, base + ReducedOffset(p, r)));
      }
    }
    partial[lane][col] = sum;
    __syncthreads();
    for (int w = kLanes / 2; w > 0; w /= 2) {
      if (lane < w) partial[lane][col] += partial[lane + w][col];
      __syncthreads();
    }
    if (lane == 0 && o < p.num_out) Finish(kind, p, partial[0][col], y, o);
    __syncthreads();
  }
}

template <typename X, typename Y>
__global__ void SplitColumnsKernel(ColumnSplit cs, const X* __restrict__ x, double* __restrict__ partials) {
  constexpr int kVec = static_cast<int>(16 / sizeof(X));
  __shared__ double red[kSplitRowLanes][kSplitVecLanes * kVec];
  const int vlane = threadIdx.x % kSplitVecLanes, rlane = threadIdx.x / kSplitVecLanes;
  const int64_t c0 = (blockIdx.x * int64_t{kSplitVecLanes} + vlane) * kVec;
  const int64_t begin = blockIdx.y * cs.rows_per_split;
  const int64_t end = begin + cs.rows_per_split < cs.rows ? begin + cs.rows_per_split : cs.rows;
  double acc[kVec] = {};
  if (c0 < cs.cols) {
#pragma unroll 4
    for (int64_t r = begin + rlane; r < end; r += kSplitRowLanes) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + r * cs.cols + c0);
      const X* v = reinterpret_cast<const X*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[k] += static_cast<double>(Load(v, k));
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) red[rlane][vlane * kVec + k] = acc[k];
  __syncthreads();
  if (rlane != 0 || c0 >= cs.cols) return;
  for (int k = 0; k < kVec; ++k) {
    double sum = 0;
    for (int l = 0; l < kSplitRowLanes; ++l) sum += red[l][vlane * kVec + k];
    partials[blockIdx.y * cs.cols + c0 + k] = sum;
  }
}

template <typename Y>
__global__ void SumSplitsKernel(ReduceKind kind, ReducePlan p, ColumnSplit cs, const double* __restrict__ partials,
                                Y* __restrict__ y) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cs.cols; c += int64_t{gridDim.x} * blockDim.x) {
    double sum = 0;
    for (int64_t s = 0; s < cs.splits; ++s) sum += partials[s * cs.cols + c];
    Finish(kind, p, sum, y, c);
  }
}

}  // namespace

cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  if (plan.num_out == 0) return cudaSuccess;
  return DispatchFloat(x_dtype, [&](auto xtag) -> cudaError_t {
    using X = typename decltype(xtag)::type;
    return DispatchFloat(y_dtype, [&](auto ytag) -> cudaError_t {
      using Y = typename decltype(ytag)::type;
      const X* px = static_cast<const X*>(x);
      Y* py = static_cast<Y*>(y);
      const std::optional<ColumnSplit> cs = ColumnSplitOf(plan, sizeof(X));
      if (cs && workspace != nullptr && workspace_bytes >= ReduceWorkspaceBytes(plan, x_dtype) &&
          reinterpret_cast<uintptr_t>(x) % 16 == 0) {
        auto* partials = static_cast<double*>(workspace);
        const dim3 grid(static_cast<unsigned>(cs->col_blocks), static_cast<unsigned>(cs->splits));
        SplitColumnsKernel<X, Y><<<grid, kSplitVecLanes * kSplitRowLanes, 0, stream>>>(*cs, px, partials);
        SumSplitsKernel<Y><<<GridFor(cs->cols), kThreads, 0, stream>>>(kind, plan, *cs, partials, py);
      } else if (plan.innermost_reduced) {
        const int blocks = static_cast<int>(plan.num_out < 65535 * 8 ? plan.num_out : 65535 * 8);
        ReduceRowsKernel<X, Y><<<blocks, kThreads, 0, stream>>>(kind, plan, px, py);
      } else {
        const int blocks = GridFor(plan.num_out, kColWidth<X>);
        ReduceColumnsKernel<X, Y><<<blocks, kColThreads, 0, stream>>>(kind, plan, px, py);
      }
      return cudaGetLastError();
    });
  });
}

}  // namespace onnxpipe::cuda
