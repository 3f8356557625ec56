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
#include "frontend/ir/dtype.h"

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

// GeluGrad's dXSums: dx viewed as (rows, cols) and sums (cols, of sums_dtype: f32, bf16 or f16) = its
// column sums as stored. The backward's threads each own VEC consecutive columns (16 bytes) of a part
// of the rows and keep their sums in registers while they write dx; the parts' fp32 sums go to the
// workspace and are added in double in a fixed order (reduce.h). The parts depend only on (rows,
// cols), so the sums are bitwise reproducible. Without 16-byte aligned pointers and cols a multiple
// of VEC, dx is written by the plain backward and then reduced (another summation order).
int64_t GeluSumsWorkspaceBytes(int64_t rows, int64_t cols);
// The fused pass alone (the parts' sums in `partial`, parts x cols floats); *launched false when the
// pointers or cols do not allow it (nothing launched).
template <typename T>
cudaError_t LaunchGeluBackwardPartialSums(const T* dy, const T* x, T* dx, int64_t rows, int64_t cols, bool tanh_approx,
                                          const DropoutParams* dropout, const uint8_t* keep_bits, float* partial,
                                          bool* launched, cudaStream_t stream);
// The parts of a (rows, cols) column sum (shape only).
int64_t GeluSumsParts(int64_t rows, int64_t cols);

#ifndef __CUDACC__
template <typename T>
absl::Status GeluBackwardWithSums(const T* dy, const T* x, T* dx, int64_t rows, int64_t cols, bool tanh_approx,
                                  const DropoutParams* dropout, const uint8_t* keep_bits, ir::DType sums_dtype,
                                  void* sums, void* workspace, cudaStream_t stream);
template <typename T>
absl::Status GeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                         uint8_t* keep_bits, cudaStream_t stream);
template <typename T>
absl::Status GeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                          const uint8_t* keep_bits, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
