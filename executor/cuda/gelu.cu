// GELU kernels: dense maps (map.cuh) over a flat (n) buffer, computing in fp32.
#include "executor/cuda/activation.cuh"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/gelu.h"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

// The functors take the form as a template argument: one kernel per form, no per-element branch.
template <bool kTanh>
struct GeluFn {
  __device__ __forceinline__ float operator()(float x) const { return GeluValue(x, kTanh); }
};

template <bool kTanh>
struct GeluGradFn {
  __device__ __forceinline__ float operator()(float dy, float x) const { return dy * GeluDerivative(x, kTanh); }
};

// With the fused dropout: kept elements scaled (forward: the result; backward: dy), the others 0.
template <bool kTanh>
struct GeluDropFn {
  float scale;
  __device__ __forceinline__ float operator()(bool keep, float x) const {
    return keep ? GeluValue(x, kTanh) * scale : 0.f;
  }
};

template <bool kTanh>
struct GeluGradDropFn {
  float scale;
  __device__ __forceinline__ float operator()(bool keep, float dy, float x) const {
    return (keep ? dy * scale : 0.f) * GeluDerivative(x, kTanh);
  }
};

// f(integral_constant<bool, tanh_approx>).
template <typename F>
cudaError_t WithForm(bool tanh_approx, F&& f) {
  return tanh_approx ? f(std::true_type{}) : f(std::false_type{});
}

bool Active(const DropoutParams* p) { return p != nullptr && DropoutActive(*p); }

}  // namespace

template <typename T>
cudaError_t LaunchGeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                              uint8_t* keep_bits, cudaStream_t stream) {
  return WithForm(tanh_approx, [&](auto form) {
    constexpr bool kTanh = decltype(form)::value;
    if (!Active(dropout)) {
      if (keep_bits != nullptr) {
        const cudaError_t e = cudaMemsetAsync(keep_bits, 0xFF, n / 8, stream);
        if (e != cudaSuccess) return e;
      }
      return LaunchMap(n, GeluFn<kTanh>{}, stream, y, x);
    }
    const float scale = static_cast<float>(KeepScale(*dropout));
    return LaunchMapWithKeep(*dropout, n, GeluDropFn<kTanh>{scale}, stream, KeepOutputs{nullptr, keep_bits}, y, x);
  });
}

template <typename T>
cudaError_t LaunchGeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx,
                               const DropoutParams* dropout, const uint8_t* keep_bits, cudaStream_t stream) {
  return WithForm(tanh_approx, [&](auto form) {
    constexpr bool kTanh = decltype(form)::value;
    if (!Active(dropout)) return LaunchMap(n, GeluGradFn<kTanh>{}, stream, dx, dy, x);
    const GeluGradDropFn<kTanh> f{static_cast<float>(KeepScale(*dropout))};
    if (keep_bits != nullptr) return LaunchMapWithKeepBits(keep_bits, n, f, stream, dx, dy, x);
    return LaunchMapWithKeep(*dropout, n, f, stream, KeepOutputs{}, dx, dy, x);
  });
}

template cudaError_t LaunchGeluForward<float>(const float*, float*, int64_t, bool, const DropoutParams*, uint8_t*,
                                              cudaStream_t);
template cudaError_t LaunchGeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool,
                                                      const DropoutParams*, uint8_t*, cudaStream_t);
template cudaError_t LaunchGeluBackward<float>(const float*, const float*, float*, int64_t, bool, const DropoutParams*,
                                               const uint8_t*, cudaStream_t);
template cudaError_t LaunchGeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                       int64_t, bool, const DropoutParams*, const uint8_t*,
                                                       cudaStream_t);

}  // namespace onnxpipe::cuda
