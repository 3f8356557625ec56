// Device-side helpers shared by the kernel families (.cu files only): launch geometry, element
// load/store with fp32 compute for the 16-bit float types, and host-side dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "frontend/ir/dtype.h"

namespace onnxpipe::cuda {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed.
inline int GridFor(int64_t n, int block = kThreads) {
  const int64_t blocks = (n + block - 1) / block;
  constexpr int64_t kMaxBlocks = 65535 * 8;
  return static_cast<int>(blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

// The arithmetic type of a stored element type: 16-bit floats compute in fp32.
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct ComputeOf<__half> {
  using type = float;
};
template <typename T>
using Compute = typename ComputeOf<T>::type;

template <typename T>
__device__ __forceinline__ Compute<T> Load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(p[i]);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(p[i]);
  } else {
    return p[i];
  }
}

// v (any arithmetic type) as T, rounding to nearest even for the 16-bit floats.
template <typename T, typename V>
__device__ __forceinline__ T Convert(V v) {
  if constexpr (std::is_same_v<T, V>) {
    return v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// Stores v as T (Convert).
template <typename T, typename V>
__device__ __forceinline__ void Store(T* p, int64_t i, V v) {
  p[i] = Convert<T>(v);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) for the 16/32-bit float dtypes; cudaErrorInvalidValue for any other.
template <typename F>
cudaError_t DispatchFloat(ir::DType dt, F&& f) {
  switch (dt) {
    case ir::DType::kF32:
      return f(TypeTag<float>{});
    case ir::DType::kBF16:
      return f(TypeTag<__nv_bfloat16>{});
    case ir::DType::kF16:
      return f(TypeTag<__half>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// As DispatchFloat, plus the 32/64-bit integers.
template <typename F>
cudaError_t DispatchArith(ir::DType dt, F&& f) {
  switch (dt) {
    case ir::DType::kI64:
      return f(TypeTag<int64_t>{});
    case ir::DType::kI32:
      return f(TypeTag<int32_t>{});
    default:
      return DispatchFloat(dt, static_cast<F&&>(f));
  }
}

}  // namespace onnxpipe::cuda
