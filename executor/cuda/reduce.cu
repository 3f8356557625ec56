// Reduction kernels. Both are deterministic: every thread sums its elements in a fixed order, lanes
// and slices are added in a fixed order, and the geometry (reduce.cc's GeometryOf) depends only on
// the shape, so results are bitwise repeatable. Sums are kept in double (the CPU backend's order of
// magnitude of error), which costs nothing at memory bandwidth.
//  - columns: x's innermost dim is kept (a broadcast's gradient over leading or middle axes, bias
//    gradients). Each thread owns `vec` neighbouring outputs (one 16-byte load per reduced index) and
//    walks its share of the reduced index space with an odometer, four loads in flight;
//  - rows: the innermost dim is reduced in runs of >= 32 elements (a trailing-axis broadcast, a full
//    sum). A group of warps per output reads the runs in 16-byte vectors;
//  - with a workspace, the reduced range is cut into slices so that the grid fills the GPU whatever
//    the number of outputs; each slice writes one double per output, and SumSlicesKernel (a thread per
//    output) or, for few outputs, SumSlicesWarpKernel (a warp per output) adds them in a fixed order.
// Integer sums (IntegerSumKernel) take a thread per output, in order.
#include <type_traits>

#include "executor/cuda/device_util.cuh"
#include "executor/cuda/reduce.h"

namespace onnxpipe::cuda {
namespace {

constexpr int kUnroll = 4;

// Offset in x of kept element o (row-major over the kept dims).
__device__ __forceinline__ int64_t KeptOffset(const ReducePlan& p, int64_t o) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxReduceRank - 1; d >= 0; --d) {
    if (d < p.kept_rank) {
      const int64_t q = o / p.kept_dims[d];
      off += (o - q * p.kept_dims[d]) * p.kept_strides[d];
      o = q;
    }
  }
  return off;
}

// Offset in x of the q-th run of the innermost reduced dim (row-major over the other reduced dims).
__device__ __forceinline__ int64_t RunOffset(const ReducePlan& p, int64_t q) {
  int64_t off = 0;
#pragma unroll
  for (int d = kMaxReduceRank - 2; d >= 0; --d) {
    if (d < p.reduced_rank - 1) {
      const int64_t n = q / p.reduced_dims[d];
      off += (q - n * p.reduced_dims[d]) * p.reduced_strides[d];
      q = n;
    }
  }
  return off;
}

// The reduced multi-index of a running position and its offset in x; the unrolled loops over the
// rank keep idx in registers.
struct Odometer {
  int64_t idx[kMaxReduceRank];
  int64_t off;

  __device__ __forceinline__ Odometer(const ReducePlan& p, int64_t r) : off(0) {
#pragma unroll
    for (int d = kMaxReduceRank - 1; d >= 0; --d) {
      idx[d] = 0;
      if (d < p.reduced_rank) {
        const int64_t q = r / p.reduced_dims[d];
        idx[d] = r - q * p.reduced_dims[d];
        off += idx[d] * p.reduced_strides[d];
        r = q;
      }
    }
  }
  __device__ __forceinline__ void Next(const ReducePlan& p) {
#pragma unroll
    for (int d = kMaxReduceRank - 1; d >= 0; --d) {
      if (d < p.reduced_rank) {
        off += p.reduced_strides[d];
        if (++idx[d] < p.reduced_dims[d]) return;
        off -= p.reduced_dims[d] * p.reduced_strides[d];
        idx[d] = 0;
      }
    }
  }
};

// V elements of X as loaded: one X, or a 16-byte vector.
template <typename X, int V>
using Raw = std::conditional_t<V == 1, X, uint4>;

template <typename X, int V>
__device__ __forceinline__ Raw<X, V> LoadRaw(const X* p) {
  if constexpr (V == 1) {
    return *p;
  } else {
    static_assert(V * sizeof(X) == sizeof(uint4));
    return *reinterpret_cast<const uint4*>(p);
  }
}

template <typename X, int V>
__device__ __forceinline__ void Accumulate(const Raw<X, V>& raw, double (&acc)[V]) {
  const X* v = reinterpret_cast<const X*>(&raw);
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] += static_cast<double>(Load(v, k));
}

template <typename Y>
__device__ __forceinline__ void Finish(ReduceKind kind, const ReducePlan& p, double sum, Y* y, int64_t o) {
  const double v = kind == ReduceKind::kMean ? sum / static_cast<double>(p.num_reduced) : sum;
  Store(y, o, static_cast<float>(v));
}

// x (kept..., reduced...) interleaved, innermost kept. Block: (kReduceBlock / lanes) output vectors
// x lanes; grid: (output vectors / vectors per block, splits).
template <typename X, typename Y, int V, bool kOneReduced>
__global__ void __launch_bounds__(kReduceBlock)
    ReduceColumnsKernel(ReduceKind kind, ReducePlan p, ReduceGeometry g, const X* __restrict__ x, Y* __restrict__ y,
                        double* __restrict__ partials) {
  const int width = kReduceBlock / g.lanes;
  const int cv = threadIdx.x % width, lane = threadIdx.x / width;
  const int64_t ov = blockIdx.x * int64_t{width} + cv, out_vecs = p.num_out / V;
  const int64_t begin = blockIdx.y * g.chunk;
  const int64_t end = begin + g.chunk < p.num_reduced ? begin + g.chunk : p.num_reduced;
  const int64_t share = (g.chunk + g.lanes - 1) / g.lanes;
  const int64_t r0 = begin + lane * share < end ? begin + lane * share : end;
  const int64_t r1 = r0 + share < end ? r0 + share : end;
  double acc[V] = {};
  if (ov < out_vecs) {
    const X* base = x + KeptOffset(p, ov * V);
    if constexpr (kOneReduced) {
      const int64_t stride = p.reduced_strides[0];
      int64_t r = r0;
      for (; r + kUnroll <= r1; r += kUnroll) {
        Raw<X, V> v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = LoadRaw<X, V>(base + (r + u) * stride);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) Accumulate<X, V>(v[u], acc);
      }
      for (; r < r1; ++r) Accumulate<X, V>(LoadRaw<X, V>(base + r * stride), acc);
    } else {
      Odometer od(p, r0);
      int64_t r = r0;
      for (; r + kUnroll <= r1; r += kUnroll) {
        Raw<X, V> v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          v[u] = LoadRaw<X, V>(base + od.off);
          od.Next(p);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) Accumulate<X, V>(v[u], acc);
      }
      for (; r < r1; ++r) {
        Accumulate<X, V>(LoadRaw<X, V>(base + od.off), acc);
        od.Next(p);
      }
    }
  }
  if (g.lanes > 1) {  // add the lanes' shares in order
    __shared__ double red[kReduceBlock * V];
#pragma unroll
    for (int k = 0; k < V; ++k) red[k * kReduceBlock + threadIdx.x] = acc[k];
    __syncthreads();
    if (lane != 0) return;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[k] = 0;
      for (int l = 0; l < g.lanes; ++l) acc[k] += red[k * kReduceBlock + l * width + cv];
    }
  }
  if (ov >= out_vecs) return;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if (g.splits == 1) {
      Finish(kind, p, acc[k], y, ov * V + k);
    } else {
      partials[blockIdx.y * p.num_out + ov * V + k] = acc[k];
    }
  }
}

// x (..., run) with the innermost dim reduced. A group of `lanes` warps per (output, slice); a block
// holds kReduceBlock / 32 / lanes groups. kOneRun: the innermost dim is the only reduced one, so a
// group's elements are contiguous and its loads need no odometer (no 64-bit divisions per load).
template <typename X, typename Y, int V, bool kOneRun>
__global__ void __launch_bounds__(kReduceBlock)
    ReduceRowsKernel(ReduceKind kind, ReducePlan p, ReduceGeometry g, const X* __restrict__ x, Y* __restrict__ y,
                     double* __restrict__ partials) {
  __shared__ double red[kReduceBlock / 32];
  const int group_threads = 32 * g.lanes;
  const int gl = threadIdx.x % group_threads, warp = threadIdx.x / 32;
  const int64_t group = blockIdx.x * int64_t{kReduceBlock / group_threads} + threadIdx.x / group_threads;
  const bool live = group < p.num_out * g.splits;
  const int64_t o = g.splits == 1 ? group : group / g.splits, s = group - o * g.splits;  // (64-bit divisions are slow)
  double sum = 0;
  if (live) {
    const X* base = x + KeptOffset(p, o);
    const int64_t begin = s * g.chunk;
    const int64_t end = begin + g.chunk < p.num_reduced ? begin + g.chunk : p.num_reduced;
    const int64_t step = int64_t{group_threads} * V;
    int64_t r = begin + int64_t{gl} * V;
    double acc[V] = {};
    if constexpr (kOneRun) {
      for (; r < end; r += kUnroll * step) {
        Raw<X, V> v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * step < end) v[u] = LoadRaw<X, V>(base + r + u * step);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (r + u * step < end) Accumulate<X, V>(v[u], acc);
        }
      }
    }
    const int64_t run = p.reduced_dims[p.reduced_rank - 1];
    int64_t q = kOneRun ? 0 : r / run, l = r - q * run;  // run index and position in it
    int64_t run_off = kOneRun ? 0 : RunOffset(p, q);
    for (; !kOneRun && r < end; r += kUnroll * step) {
      Raw<X, V> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (r + u * step < end) v[u] = LoadRaw<X, V>(base + run_off + l);
        l += step;
        if (l >= run) {
          q += l / run;
          l %= run;
          run_off = RunOffset(p, q);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (r + u * step < end) Accumulate<X, V>(v[u], acc);
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) sum += acc[k];
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
  if (g.lanes > 1) {  // add the group's warps in order
    if (threadIdx.x % 32 == 0) red[warp] = sum;
    __syncthreads();
    if (gl != 0) return;
    for (int w = 1; w < g.lanes; ++w) sum += red[warp + w];
  }
  if (!live || gl != 0) return;
  if (g.splits == 1) {
    Finish(kind, p, sum, y, o);
  } else {
    partials[s * p.num_out + o] = sum;
  }
}

// A warp per output (few outputs, many slices, as a full sum has): lane l adds slices l, l + 32, ... in order, then
// the lanes are added in a fixed tree.
template <typename Y>
__global__ void SumSlicesWarpKernel(ReduceKind kind, ReducePlan p, int64_t splits, const double* __restrict__ partials,
                                    Y* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  for (int64_t o = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32; o < p.num_out;
       o += int64_t{gridDim.x} * blockDim.x / 32) {
    double sum = 0;
    for (int64_t s = lane; s < splits; s += 32) sum += partials[s * p.num_out + o];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) Finish(kind, p, sum, y, o);
  }
}

template <typename Y>
__global__ void SumSlicesKernel(ReduceKind kind, ReducePlan p, int64_t splits, const double* __restrict__ partials,
                                Y* __restrict__ y) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < p.num_out;
       o += int64_t{gridDim.x} * blockDim.x) {
    double sum = 0;
    for (int64_t s = 0; s < splits; ++s) sum += partials[s * p.num_out + o];
    Finish(kind, p, sum, y, o);
  }
}

// Integer sums (i64, i32: a mask's count of tokens): a thread per output walks its reduced elements in
// order, accumulating in int64 with wrap-around, as the CPU backend does; the result is stored as T.
template <typename T>
__global__ void IntegerSumKernel(ReducePlan p, const T* __restrict__ x, T* __restrict__ y) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < p.num_out;
       o += int64_t{gridDim.x} * blockDim.x) {
    const T* base = x + KeptOffset(p, o);
    Odometer od(p, 0);
    uint64_t acc = 0;
    for (int64_t r = 0; r < p.num_reduced; ++r, od.Next(p)) acc += static_cast<uint64_t>(base[od.off]);
    y[o] = static_cast<T>(static_cast<int64_t>(acc));
  }
}

// One thread per (o, i) line of x (outer, n, inner); neighbouring threads take neighbouring i.
template <typename T, typename Acc>
__global__ void CumSumKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner,
                             bool exclusive, bool reverse) {
  for (int64_t line = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; line < outer * inner;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = line / inner, i = line - o * inner;
    const T* px = x + o * n * inner + i;
    T* py = y + o * n * inner + i;
    Acc acc = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t off = (reverse ? n - 1 - s : s) * inner;
      if (exclusive) Store(py, off, acc);
      if constexpr (std::is_integral_v<Acc>) {
        acc = static_cast<Acc>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(px[off]));  // wraps
      } else {
        acc += static_cast<Acc>(Load(px, off));
      }
      if (!exclusive) Store(py, off, acc);
    }
  }
}

template <typename X, typename Y, int V>
void LaunchColumns(ReduceKind kind, const ReducePlan& p, const ReduceGeometry& g, const X* x, Y* y, double* partials,
                   cudaStream_t stream) {
  const int64_t width = kReduceBlock / g.lanes;
  const dim3 grid(static_cast<unsigned>((p.num_out / V + width - 1) / width), static_cast<unsigned>(g.splits));
  if (p.reduced_rank <= 1) {
    ReduceColumnsKernel<X, Y, V, true><<<grid, kReduceBlock, 0, stream>>>(kind, p, g, x, y, partials);
  } else {
    ReduceColumnsKernel<X, Y, V, false><<<grid, kReduceBlock, 0, stream>>>(kind, p, g, x, y, partials);
  }
}

}  // namespace

cudaError_t LaunchReduce(ReduceKind kind, const ReducePlan& plan, ir::DType x_dtype, const void* x, ir::DType y_dtype,
                         void* y, void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  if (plan.num_out == 0) return cudaSuccess;
  if (x_dtype == ir::DType::kI64 || x_dtype == ir::DType::kI32) {
    if (kind != ReduceKind::kSum || y_dtype != x_dtype) return cudaErrorInvalidValue;
    const unsigned grid = GridFor(plan.num_out);
    if (x_dtype == ir::DType::kI64) {
      IntegerSumKernel<<<grid, kThreads, 0, stream>>>(plan, static_cast<const int64_t*>(x), static_cast<int64_t*>(y));
    } else {
      IntegerSumKernel<<<grid, kThreads, 0, stream>>>(plan, static_cast<const int32_t*>(x), static_cast<int32_t*>(y));
    }
    return cudaGetLastError();
  }
  return DispatchFloat(x_dtype, [&](auto xtag) -> cudaError_t {
    using X = typename decltype(xtag)::type;
    return DispatchFloat(y_dtype, [&](auto ytag) -> cudaError_t {
      using Y = typename decltype(ytag)::type;
      constexpr int kVec = static_cast<int>(16 / sizeof(X));
      const X* px = static_cast<const X*>(x);
      Y* py = static_cast<Y*>(y);
      const int64_t need = ReduceWorkspaceBytes(plan, x_dtype);
      const bool split = need > 0 && workspace != nullptr && workspace_bytes >= need;
      ReduceGeometry g = GeometryOf(plan, sizeof(X), split);
      if (reinterpret_cast<uintptr_t>(x) % 16 != 0) g.vec = 1;  // same slices and lanes, scalar loads
      auto* partials = static_cast<double*>(workspace);
      if (plan.num_reduced == 0) {
        LaunchColumns<X, Y, 1>(kind, plan, g, px, py, partials, stream);
      } else if (g.rows) {
        const int groups_per_block = kReduceBlock / (32 * g.lanes);
        const int64_t blocks = (plan.num_out * g.splits + groups_per_block - 1) / groups_per_block;
        const unsigned grid = static_cast<unsigned>(blocks);
        const bool one_run = plan.reduced_rank == 1;
        if (g.vec == kVec && one_run) {
          ReduceRowsKernel<X, Y, kVec, true><<<grid, kReduceBlock, 0, stream>>>(kind, plan, g, px, py, partials);
        } else if (g.vec == kVec) {
          ReduceRowsKernel<X, Y, kVec, false><<<grid, kReduceBlock, 0, stream>>>(kind, plan, g, px, py, partials);
        } else if (one_run) {
          ReduceRowsKernel<X, Y, 1, true><<<grid, kReduceBlock, 0, stream>>>(kind, plan, g, px, py, partials);
        } else {
          ReduceRowsKernel<X, Y, 1, false><<<grid, kReduceBlock, 0, stream>>>(kind, plan, g, px, py, partials);
        }
      } else if (g.vec == kVec) {
        LaunchColumns<X, Y, kVec>(kind, plan, g, px, py, partials, stream);
      } else {
        LaunchColumns<X, Y, 1>(kind, plan, g, px, py, partials, stream);
      }
      if (g.splits > 1 && plan.num_out * 32 <= int64_t{kThreads} * 1024) {
        SumSlicesWarpKernel<Y><<<GridFor(plan.num_out * 32), kThreads, 0, stream>>>(kind, plan, g.splits, partials, py);
      } else if (g.splits > 1) {
        SumSlicesKernel<Y><<<GridFor(plan.num_out), kThreads, 0, stream>>>(kind, plan, g.splits, partials, py);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchCumSum(ir::DType dtype, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                         bool exclusive, bool reverse, cudaStream_t stream) {
  if (outer * n * inner == 0) return cudaSuccess;
  return DispatchArith(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    CumSumKernel<T, Acc><<<GridFor(outer * inner), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                                          outer, n, inner, exclusive, reverse);
    return cudaGetLastError();
  });
}

}  // namespace onnxpipe::cuda
