// Gated activation kernels: dense maps (map.cuh) over flat (n) buffers, computing in fp32, the
// activation a template argument (one kernel per activation, no per-element branch). The backward
// with both gradients is one map with two outputs (MapPairKernel), with one of them a plain map.
#include <cuda/std/utility>

#include "executor/cuda/activation.cuh"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/gated_activation.h"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

using ir::GatedAct;

template <GatedAct kAct>
__device__ __forceinline__ float ActValue(float x) {
  if constexpr (kAct == GatedAct::kSilu) return SiluValue(x);
  return GeluValue(x, kAct == GatedAct::kGeluTanh);
}

template <GatedAct kAct>
__device__ __forceinline__ float ActDerivative(float x) {
  if constexpr (kAct == GatedAct::kSilu) return SiluDerivative(x);
  return GeluDerivative(x, kAct == GatedAct::kGeluTanh);
}

// y = act(gate) * up.
template <GatedAct kAct>
struct ForwardFn {
  __device__ __forceinline__ float operator()(float gate, float up) const { return ActValue<kAct>(gate) * up; }
};

// (dgate, dup) from (dy, gate, up).
template <GatedAct kAct>
struct BothGradsFn {
  __device__ __forceinline__ ::cuda::std::pair<float, float> operator()(float dy, float gate, float up) const {
    return {dy * up * ActDerivative<kAct>(gate), dy * ActValue<kAct>(gate)};
  }
};

// dgate alone from (dy, gate, up).
template <GatedAct kAct>
struct GateGradFn {
  __device__ __forceinline__ float operator()(float dy, float gate, float up) const {
    return dy * up * ActDerivative<kAct>(gate);
  }
};

// dup alone from (dy, gate).
template <GatedAct kAct>
struct UpGradFn {
  __device__ __forceinline__ float operator()(float dy, float gate) const { return dy * ActValue<kAct>(gate); }
};

// f(integral_constant<GatedAct, act>).
template <typename F>
cudaError_t WithAct(GatedAct act, F&& f) {
  switch (act) {
    case GatedAct::kSilu:
      return f(std::integral_constant<GatedAct, GatedAct::kSilu>{});
    case GatedAct::kGeluErf:
      return f(std::integral_constant<GatedAct, GatedAct::kGeluErf>{});
    case GatedAct::kGeluTanh:
      return f(std::integral_constant<GatedAct, GatedAct::kGeluTanh>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

template <typename T>
cudaError_t LaunchGatedActivationForward(GatedAct act, const T* gate, const T* up, T* y, int64_t n,
                                         cudaStream_t stream) {
  return WithAct(act, [&](auto a) { return LaunchMap(n, ForwardFn<decltype(a)::value>{}, stream, y, gate, up); });
}

template <typename T>
cudaError_t LaunchGatedActivationBackward(GatedAct act, const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                          int64_t n, cudaStream_t stream) {
  return WithAct(act, [&](auto a) {
    constexpr GatedAct kAct = decltype(a)::value;
    if (dgate != nullptr && dup != nullptr)
      return LaunchMapPair(n, BothGradsFn<kAct>{}, stream, dgate, dup, dy, gate, up);
    if (dgate != nullptr) return LaunchMap(n, GateGradFn<kAct>{}, stream, dgate, dy, gate, up);
    if (dup != nullptr) return LaunchMap(n, UpGradFn<kAct>{}, stream, dup, dy, gate);
    return cudaSuccess;
  });
}

template cudaError_t LaunchGatedActivationForward<float>(GatedAct, const float*, const float*, float*, int64_t,
                                                         cudaStream_t);
template cudaError_t LaunchGatedActivationForward<__nv_bfloat16>(GatedAct, const __nv_bfloat16*, const __nv_bfloat16*,
                                                                 __nv_bfloat16*, int64_t, cudaStream_t);
template cudaError_t LaunchGatedActivationBackward<float>(GatedAct, const float*, const float*, const float*, float*,
                                                          float*, int64_t, cudaStream_t);
template cudaError_t LaunchGatedActivationBackward<__nv_bfloat16>(GatedAct, const __nv_bfloat16*, const __nv_bfloat16*,
                                                                  const __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*,
                                                                  int64_t, cudaStream_t);

}  // namespace onnxpipe::cuda
