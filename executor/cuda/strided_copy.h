// A strided copy on the GPU: the data movement of Transpose, Slice and SliceGrad. Element i of
// the row-major index space `dims` (rank <= kMaxCopyRank) is read at
// src_offset + sum_d idx_d * src_strides[d] and written at dst_offset + sum_d idx_d *
// dst_strides[d] (offsets and strides in elements, strides may be negative or 0 on the source
// side). Elements are moved as raw bytes (1, 2, 4 or 8 each), so any dtype is copied bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace onnxpipe::cuda {

constexpr int kMaxCopyRank = 8;

struct StridedCopy {
  int rank = 0;
  int64_t dims[kMaxCopyRank] = {};
  int64_t src_strides[kMaxCopyRank] = {};
  int64_t dst_strides[kMaxCopyRank] = {};
  int64_t src_offset = 0, dst_offset = 0;
};

// cudaErrorInvalidValue for a rank above kMaxCopyRank or an element size other than 1, 2, 4, 8.
cudaError_t LaunchStridedCopy(const StridedCopy& c, int elem_bytes, const void* src, void* dst, cudaStream_t stream);

}  // namespace onnxpipe::cuda
