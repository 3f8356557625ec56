// GELU kernels: grid-stride loops over a flat (n) buffer, 4 elements per thread per iteration.
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

__global__ void GeluForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                                  bool tanh_approx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = GeluValue(x[i], tanh_approx);
  }
}

__global__ void GeluBackwardKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                   float* __restrict__ dx, int64_t n, bool tanh_approx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    dx[i] = dy[i] * GeluDerivative(x[i], tanh_approx);
  }
}

int GridFor(int64_t n, int block) {
  int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

}  // namespace

cudaError_t LaunchGeluForward(const float* x, float* y, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  GeluForwardKernel<<<GridFor(n, kBlock), kBlock, 0, stream>>>(x, y, n, tanh_approx);
  return cudaGetLastError();
}

cudaError_t LaunchGeluBackward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  GeluBackwardKernel<<<GridFor(n, kBlock), kBlock, 0, stream>>>(dy, x, dx, n, tanh_approx);
  return cudaGetLastError();
}

}  // namespace onnxpipe::cuda
