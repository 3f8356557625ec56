// Device helpers shared by the row-wise kernel families (layernorm.cu, softmax.cu): element
// conversion for fp32/bf16, aligned vector loads and stores, and deterministic block reductions.
// Included only from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace onnxpipe::cuda::rows {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements of T in one 16-byte access.
template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));

// VEC consecutive elements, loaded and stored as one access (16 bytes for VEC = kVec16<T>).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[VEC]) {
  const Pack<T, VEC> pk = *reinterpret_cast<const Pack<T, VEC>*>(p);
#pragma unroll
  for (int j = 0; j < VEC; ++j) out[j] = ToFloat(pk.v[j]);
}

template <typename T, int VEC>
__device__ __forceinline__ void StoreFloats(T* p, const float (&in)[VEC]) {
  Pack<T, VEC> pk;
#pragma unroll
  for (int j = 0; j < VEC; ++j) pk.v[j] = FromFloat<T>(in[j]);
  *reinterpret_cast<Pack<T, VEC>*>(p) = pk;
}

// True when every pointer is null or aligned to `bytes`.
template <typename... P>
bool AllAligned(int bytes, const P*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

// Threads for a row of `chunks` work items: a multiple of 32 in [32, max_threads].
inline int ThreadsFor(int64_t chunks, int max_threads) {
  const int64_t t = (chunks + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > max_threads ? max_threads : t));
}

// Block-wide reductions for blockDim.x a multiple of 32 (at most 1024). Every thread receives the
// result. The combination order is fixed (xor butterfly in each warp, then warps in index order),
// so results are bitwise reproducible. `smem` holds 32 * N floats; consecutive calls may share it.
template <int N>
__device__ __forceinline__ void BlockSum(float (&v)[N], float* smem) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // the previous call's readers are done with smem
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) smem[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float t = 0.f;
    for (int w = 0; w < warps; ++w) t += smem[k * 32 + w];
    v[k] = t;
  }
}

__device__ __forceinline__ float BlockMax(float v, float* smem) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  float m = smem[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, smem[w]);
  return m;
}

}  // namespace onnxpipe::cuda::rows
