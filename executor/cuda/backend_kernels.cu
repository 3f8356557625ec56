#include "executor/cuda/backend_kernels.h"

namespace onnxpipe::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

template <typename T>
__global__ void AccumulateKernel(T* acc, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc[i] += x[i];
  }
}

__device__ bool NonFinite(float v) { return !isfinite(v); }
__device__ bool NonFinite(double v) { return !isfinite(v); }
// bf16: exponent bits all ones.
__device__ bool NonFinite(uint16_t v) { return (v & 0x7F80u) == 0x7F80u; }

template <typename T>
__global__ void FlagKernel(const T* x, int64_t n, int* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bad |= NonFinite(x[i]);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

template <typename T>
cudaError_t Accumulate(T* acc, const T* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AccumulateKernel<<<Blocks(n), kThreads, 0, stream>>>(acc, x, n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Flag(const T* x, int64_t n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FlagKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, flag);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAccumulateF32(float* acc, const float* x, int64_t n, cudaStream_t s) {
  return Accumulate(acc, x, n, s);
}
cudaError_t LaunchAccumulateF64(double* acc, const double* x, int64_t n, cudaStream_t s) {
  return Accumulate(acc, x, n, s);
}
cudaError_t LaunchFlagNonFiniteF32(const float* x, int64_t n, int* f, cudaStream_t s) { return Flag(x, n, f, s); }
cudaError_t LaunchFlagNonFiniteF64(const double* x, int64_t n, int* f, cudaStream_t s) { return Flag(x, n, f, s); }
cudaError_t LaunchFlagNonFiniteBF16(const uint16_t* x, int64_t n, int* f, cudaStream_t s) { return Flag(x, n, f, s); }

}  // namespace onnxpipe::cuda
