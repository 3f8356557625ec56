// GELU kernels: grid-stride loops over a flat (n) buffer, computing in fp32.
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/gelu.h"

namespace onnxpipe::cuda {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kTanhC = 0.79788456080286536f;  // sqrt(2 / pi)

__device__ __forceinline__ float GeluValue(float x, bool tanh_approx) {
  if (tanh_approx) return 0.5f * x * (1.f + tanhf(kTanhC * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.f + erff(x * kInvSqrt2));
}

__device__ __forceinline__ float GeluDerivative(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float inner = kTanhC * (x + 0.044715f * x * x * x);
    const float t = tanhf(inner);
    const float dinner = kTanhC * (1.f + 3.f * 0.044715f * x * x);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner;
  }
  const float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * __expf(-0.5f * x * x);
  return cdf + x * pdf;
}

template <typename T>
__global__ void GeluForwardKernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, bool tanh_approx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    Store(y, i, GeluValue(Load(x, i), tanh_approx));
  }
}

template <typename T>
__global__ void GeluBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx, int64_t n,
                                   bool tanh_approx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    Store(dx, i, Load(dy, i) * GeluDerivative(Load(x, i), tanh_approx));
  }
}

}  // namespace

template <typename T>
cudaError_t LaunchGeluForward(const T* x, T* y, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluForwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(x, y, n, tanh_approx);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchGeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  GeluBackwardKernel<T><<<GridFor(n), kThreads, 0, stream>>>(dy, x, dx, n, tanh_approx);
  return cudaGetLastError();
}

template cudaError_t LaunchGeluForward<float>(const float*, float*, int64_t, bool, cudaStream_t);
template cudaError_t LaunchGeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool,
                                                      cudaStream_t);
template cudaError_t LaunchGeluBackward<float>(const float*, const float*, float*, int64_t, bool, cudaStream_t);
template cudaError_t LaunchGeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                       int64_t, bool, cudaStream_t);

}  // namespace onnxpipe::cuda
