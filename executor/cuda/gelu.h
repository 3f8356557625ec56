// GELU forward and backward on the GPU (erf form and tanh approximation), fp32.
//   y  = x * Phi(x)                            (erf)   | 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
//   dx = dy * (Phi(x) + x phi(x))              (erf)   | derivative of the tanh form
// Buffers: x, y, dy, dx are (n) device pointers. The Status wrappers check preconditions; the
// Launch* functions (usable from .cu code) return the cudaError_t of the launch.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

cudaError_t LaunchGeluForward(const float* x, float* y, int64_t n, bool tanh_approx, cudaStream_t stream);
cudaError_t LaunchGeluBackward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx,
                               cudaStream_t stream);

#ifndef __CUDACC__
absl::Status GeluForward(const float* x, float* y, int64_t n, bool tanh_approx, cudaStream_t stream);
absl::Status GeluBackward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx,
                          cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
