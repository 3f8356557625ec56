// GELU forward and backward on the GPU (erf form and tanh approximation).
//   y  = x * Phi(x)                            (erf)   | 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
//   dx = dy * (Phi(x) + x phi(x))              (erf)   | derivative of the tanh form
// With a fused dropout (`dropout` non-null and active: training, ratio > 0; dropout.h) the forward
// keeps and scales y, or zeroes it, by the stream's decision for each element, and the backward
// does the same to dy before the derivative (as Gelu followed by Dropout, and their gradients).
// keep_bits (optional, n a multiple of 8; op.h's KeepBits): the forward writes its decisions there
// (all kept when the dropout is inactive) and the backward reads them instead of drawing them again.
// Buffers: x, y, dy, dx are (n) device pointers of T, float or __nv_bfloat16; bf16 computes in fp32
// and rounds y and dx once to nearest even. The Status wrappers check preconditions; the Launch*
// functions (usable from .cu code) return the cudaError_t of the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cuda/dropout.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

template <typename T>
cudaError_t LaunchGeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                              uint8_t* keep_bits, cudaStream_t stream);
template <typename T>
cudaError_t LaunchGeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx,
                               const DropoutParams* dropout, const uint8_t* keep_bits, cudaStream_t stream);

#ifndef __CUDACC__
template <typename T>
absl::Status GeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                         uint8_t* keep_bits, cudaStream_t stream);
template <typename T>
absl::Status GeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                          const uint8_t* keep_bits, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
