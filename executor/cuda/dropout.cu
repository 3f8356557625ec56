// Dropout kernels: the keep decisions of the CPU backend's stream (dropout_device.cuh's
// MapWithKeepKernel: each 128-bit Philox draw made once for the eight elements it covers).
#include "executor/cpu/philox.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/dropout.h"
#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

// y = keep ? x * scale : 0 in the type the CPU backend scales in (Compute<T>: fp64 for fp64).
template <typename T>
__device__ __forceinline__ void StoreScaled(T* out, int64_t i, bool keep, const T* in, double scale) {
  using C = Compute<T>;
  Store(out, i, keep ? static_cast<C>(Load(in, i)) * static_cast<C>(scale) : C(0));
}

// Inactive forward: y = x (a copy unless in place), mask = 1. Backward with a mask:
// dx = mask ? dy * scale : 0 (scale 1 when inactive).
template <typename T>
__global__ void MaskedScaleKernel(const T* __restrict__ in, const uint8_t* __restrict__ mask, double scale,
                                  T* __restrict__ out, uint8_t* __restrict__ mask_out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const bool keep = mask == nullptr || mask[i];
    StoreScaled(out, i, keep, in, scale);
    if (mask_out != nullptr) mask_out[i] = 1;
  }
}

// keep ? x * scale : 0 (keep: the stream's decision, or a saved mask's byte), scaled as StoreScaled.
struct ScaleKept {
  double scale;
  template <typename K, typename C>
  __device__ __forceinline__ C operator()(K keep, C x) const {
    return keep ? x * static_cast<C>(scale) : C(0);
  }
};

}  // namespace

cudaError_t LaunchDropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask,
                                 int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (!DropoutActive(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(px, nullptr, 1.0, py, mask, n);
    } else {
      return LaunchMapWithKeep(p, n, ScaleKept{KeepScale(p)}, stream, KeepOutputs{mask, nullptr}, py, px);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchDropoutBackward(const DropoutParams& p, ir::DType dtype, const void* dy, const uint8_t* mask,
                                  void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    const double scale = DropoutActive(p) ? KeepScale(p) : 1.0;
    if (mask != nullptr) {
      return LaunchMap(n, ScaleKept{scale}, stream, pdx, mask, pdy);
    } else if (!DropoutActive(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(pdy, nullptr, scale, pdx, nullptr, n);
    } else {
      return LaunchMapWithKeep(p, n, ScaleKept{scale}, stream, KeepOutputs{}, pdx, pdy);
    }
    return cudaGetLastError();
  });
}

}  // namespace onnxpipe::cuda
