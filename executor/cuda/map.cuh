// Dense elementwise maps (.cu files only): out[i] = f(in_0[i], ..., in_k[i]) over n elements, with
// each thread loading and storing runs of consecutive elements in single 16-byte accesses (8 bf16,
// 4 fp32) when every pointer is 16-byte aligned, else one element at a time. Memory-bound kernels
// reach the GPU's bandwidth only with wide accesses; the arithmetic per element is unchanged, so
// results are bitwise those of a one-element-per-thread loop.
//
// f takes each input's compute value (Load: fp32 for the 16-bit floats) and returns the output
// element's value, converted by Convert<Out> (a pair of values for LaunchMapPair's two outputs).
#pragma once

#include <cuda/std/tuple>
#include <cuda/std/utility>
#include <type_traits>

#include "executor/cuda/device_util.cuh"

namespace onnxpipe::cuda {

// The bits of kBytes moved as one access (several 16-byte ones above 16 bytes).
template <int kBytes>
struct RawBits {
  struct alignas(16) type {
    uint4 w[kBytes / 16];
  };
};
template <>
struct RawBits<1> {
  using type = uint8_t;
};
template <>
struct RawBits<2> {
  using type = uint16_t;
};
template <>
struct RawBits<4> {
  using type = uint32_t;
};
template <>
struct RawBits<8> {
  using type = uint2;
};
template <>
struct RawBits<16> {
  using type = uint4;
};

// W consecutive elements of T, moved as one access of W * sizeof(T) bytes.
template <typename T, int W>
struct Run {
  union {
    typename RawBits<W * sizeof(T)>::type raw;
    T v[W];
  };
  __device__ Run() {}
  __device__ Compute<T> operator[](int k) const { return Load(v, k); }
};

template <int W, typename T>
__device__ __forceinline__ Run<T, W> LoadRun(const T* p, int64_t i) {
  Run<T, W> r;
  r.raw = *reinterpret_cast<const typename RawBits<W * sizeof(T)>::type*>(p + i);
  return r;
}

template <int W, typename T>
__device__ __forceinline__ void StoreRun(T* p, int64_t i, const Run<T, W>& r) {
  *reinterpret_cast<typename RawBits<W * sizeof(T)>::type*>(p + i) = r.raw;
}

// Grid-stride over [0, n): f(i, integral_constant<int, V>) for every whole run of V elements (i a
// multiple of V), then f(i, integral_constant<int, 1>) for each element of the tail.
template <int V, typename F>
__device__ __forceinline__ void ForEachRun(int64_t n, F&& f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t runs = n / V;
  for (int64_t r = first; r < runs; r += stride) f(r * V, std::integral_constant<int, V>{});
  if constexpr (V > 1) {
    for (int64_t i = runs * V + first; i < n; i += stride) f(i, std::integral_constant<int, 1>{});
  }
}

template <int V, typename F, typename Out, typename... In>
__global__ void MapKernel(int64_t n, F f, Out* out, const In*... in) {
  ForEachRun<V>(n, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    const ::cuda::std::tuple<Run<In, W>...> args{LoadRun<W>(in, i)...};
    Run<Out, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      r.v[k] = Convert<Out>(::cuda::std::apply([&](const auto&... a) { return f(a[k]...); }, args));
    }
    StoreRun<W>(out, i, r);
  });
}

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, typename... Ts>
constexpr size_t MaxSize() {
  if constexpr (sizeof...(Ts) == 0) {
    return sizeof(T);
  } else {
    return sizeof(T) > MaxSize<Ts...>() ? sizeof(T) : MaxSize<Ts...>();
  }
}

// Two outputs per element: out0[i], out1[i] = f(in[i]...), f returning a ::cuda::std::pair of compute
// values (a backward producing two gradients from one read of its operands).
template <int V, typename F, typename Out, typename... In>
__global__ void MapPairKernel(int64_t n, F f, Out* out0, Out* out1, const In*... in) {
  ForEachRun<V>(n, [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    const ::cuda::std::tuple<Run<In, W>...> args{LoadRun<W>(in, i)...};
    Run<Out, W> r0, r1;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const auto p = ::cuda::std::apply([&](const auto&... a) { return f(a[k]...); }, args);
      r0.v[k] = Convert<Out>(p.first);
      r1.v[k] = Convert<Out>(p.second);
    }
    StoreRun<W>(out0, i, r0);
    StoreRun<W>(out1, i, r1);
  });
}

// Calls launch(integral_constant<int, V>{}, grid) for a map over n elements with runs of V = kVec
// elements when `aligned` (every pointer 16-byte aligned), else V = 1; the launch's error.
template <int kVec, typename Launch>
cudaError_t LaunchWidest(int64_t n, bool aligned, Launch&& launch) {
  if (n == 0) return cudaSuccess;
  if constexpr (kVec > 1) {
    if (aligned) {
      launch(std::integral_constant<int, kVec>{}, GridFor((n + kVec - 1) / kVec));
      return cudaGetLastError();
    }
  }
  launch(std::integral_constant<int, 1>{}, GridFor(n));
  return cudaGetLastError();
}

// Launches out[i] = f(in[i]...) for i < n on `stream`. `out` may be one of the inputs (in place).
template <typename F, typename Out, typename... In>
cudaError_t LaunchMap(int64_t n, F f, cudaStream_t stream, Out* out, const In*... in) {
  constexpr int kVec = static_cast<int>(16 / MaxSize<Out, In...>());
  return LaunchWidest<kVec>(n, Aligned16(out) && (Aligned16(in) && ...), [&](auto v, int grid) {
    MapKernel<decltype(v)::value><<<grid, kThreads, 0, stream>>>(n, f, out, in...);
  });
}

// Launches out0[i], out1[i] = f(in[i]...) for i < n on `stream` (MapPairKernel).
template <typename F, typename Out, typename... In>
cudaError_t LaunchMapPair(int64_t n, F f, cudaStream_t stream, Out* out0, Out* out1, const In*... in) {
  constexpr int kVec = static_cast<int>(16 / MaxSize<Out, In...>());
  return LaunchWidest<kVec>(n, Aligned16(out0) && Aligned16(out1) && (Aligned16(in) && ...), [&](auto v, int grid) {
    MapPairKernel<decltype(v)::value><<<grid, kThreads, 0, stream>>>(n, f, out0, out1, in...);
  });
}

}  // namespace onnxpipe::cuda
