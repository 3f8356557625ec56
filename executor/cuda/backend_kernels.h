// The CUDA backend's own elementwise calls: gradient accumulation and the non-finite flag.
//   acc[i] += x[i]                 (n) fp32 | fp64
//   *flag = 1 if any x[i] is NaN/Inf (n) fp32 | fp64 | bf16 (flag is a device int, set, never cleared)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace onnxpipe::cuda {

cudaError_t LaunchAccumulateF32(float* acc, const float* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchAccumulateF64(double* acc, const double* x, int64_t n, cudaStream_t stream);
cudaError_t LaunchFlagNonFiniteF32(const float* x, int64_t n, int* flag, cudaStream_t stream);
cudaError_t LaunchFlagNonFiniteF64(const double* x, int64_t n, int* flag, cudaStream_t stream);
cudaError_t LaunchFlagNonFiniteBF16(const uint16_t* x, int64_t n, int* flag, cudaStream_t stream);

}  // namespace onnxpipe::cuda
