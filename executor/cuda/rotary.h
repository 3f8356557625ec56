// Rotary position embedding on the GPU (frontend/ir/op.h: Rotary, RotaryGrad), forward and
// transpose, f32 or bf16 (computed in fp32, each output rounded once), one launch each.
//   forward    y[lo] = x[lo] c[lo] - x[hi] s[lo],   y[hi] = x[hi] c[hi] + x[lo] s[hi]
//   transpose dx[lo] = dy[lo] c[lo] + dy[hi] s[hi], dx[hi] = dy[hi] c[hi] - dy[lo] s[lo]
// for each pair (lo, hi) = (i, i + R/2) (rotate-half) or (2i, 2i + 1) (interleaved) of a row's first
// R features; features [R, W) are copied. Buffers: x, y (rows, W); cos, sin (table rows, R), the
// table row of x's row r being sum_d index_d(r) * table_strides[d] over the (merged) leading dims.
// Threads move 16 bytes per access where every row, half and pointer allows it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#ifndef __CUDACC__
#include "absl/status/statusor.h"
#endif

namespace onnxpipe::cuda {

constexpr int kMaxRotaryLeadDims = 6;

struct RotaryDims {
  int64_t rows = 0, width = 0, rotary_dim = 0;
  bool interleaved = false;
  int lead_rank = 0;                               // merged leading dims of x (size-1 dims dropped)
  int64_t lead_dims[kMaxRotaryLeadDims] = {};      // outermost first
  int64_t table_strides[kMaxRotaryLeadDims] = {};  // in table rows; 0 where the tables broadcast
};

template <typename T>
cudaError_t LaunchRotary(const RotaryDims& dims, bool transpose, const T* x, const T* cos, const T* sin, T* y,
                         cudaStream_t stream);

#ifndef __CUDACC__
// The geometry of x (dims) against tables (dims, last = rotary_dim) as op.h defines it; an error
// when they do not fit, Unimplemented when the merged leading dims exceed kMaxRotaryLeadDims.
absl::StatusOr<RotaryDims> MakeRotaryDims(const std::vector<int64_t>& x, const std::vector<int64_t>& table,
                                          int64_t rotary_dim, bool interleaved);
// y = Rotary(x, cos, sin) or, with `transpose`, dx = RotaryGrad(dy = x, cos, sin).
template <typename T>
absl::Status Rotary(const RotaryDims& dims, bool transpose, const T* x, const T* cos, const T* sin, T* y,
                    cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
