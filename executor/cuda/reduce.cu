// Reduction kernels, both deterministic (fixed per-thread order, fixed shared-memory tree):
//  - rows: the innermost dim is reduced, so one block per output walks contiguous memory;
//  - columns: the innermost dim is kept, so a block takes the neighbouring outputs of one 32-byte
//    sector (8 fp32 or 16 16-bit values: every byte read is used) and its 512 threads split the
//    reduced elements, so that a bias gradient of width D runs D / 8 blocks.
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

}  // namespace

cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, cudaStream_t stream) {
  if (plan.num_out == 0) return cudaSuccess;
  return DispatchFloat(x_dtype, [&](auto xtag) -> cudaError_t {
    using X = typename decltype(xtag)::type;
    return DispatchFloat(y_dtype, [&](auto ytag) -> cudaError_t {
      using Y = typename decltype(ytag)::type;
      const X* px = static_cast<const X*>(x);
      Y* py = static_cast<Y*>(y);
      if (plan.innermost_reduced) {
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
