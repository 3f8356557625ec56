// GatherElements, GatherND and their gradients on the GPU (the index ops of transformers' mask code,
// of RoBERTa's position ids and of DistilBERT's dynamo export). data is dense row-major (rank <= 8); indices (i64 or
// i32) have data's rank, no dim above data's except along `axis`, and the output has the indices' dims. An index
// outside
// [-n, n) is not read through: the kernels raise `flag` (device memory, zeroed by the caller) and the
// backend then runs the op on the host, where the CPU kernel names the index.
// The gradient is deterministic without atomics: a thread per element of dX walks the indices along
// `axis` in order and adds the dY elements that point at it, in T, one rounding per add, as the CPU
// backend's scatter-add does (fp32 results equal the CPU's bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#endif

namespace onnxpipe::cuda {

constexpr int kMaxGatherRank = 8;
struct GatherElementsShape {
  int rank = 0;
  int axis = 0;
  int64_t data_dims[kMaxGatherRank] = {}, idx_dims[kMaxGatherRank] = {};
  int64_t num_data = 1, num_idx = 1;
};

// out (idx dims) = data[.., indices[i], ..]; elem_bytes 1, 2, 4 or 8 (raw elements: any dtype).
cudaError_t LaunchGatherElements(const GatherElementsShape& s, int elem_bytes, const void* data, ir::DType idx_dtype,
                                 const void* indices, void* out, uint32_t* flag, cudaStream_t stream);
// dx (data dims) = zeros with dy (idx dims) added at the gathered positions; dtype f32 bf16 f16.
cudaError_t LaunchGatherElementsGrad(const GatherElementsShape& s, ir::DType dtype, const void* dy, ir::DType idx_dtype,
                                     const void* indices, void* dx, uint32_t* flag, cudaStream_t stream);

// GatherND with batch_dims b: data (batches, ..., slice...), indices (batches, tuples..., k); for each
// batch position and index tuple, the `slice` elements of data after the k indexed dims.
struct GatherNDShape {
  int k = 0;
  int64_t batches = 0, tuples = 0;  // tuples per batch position
  int64_t batch_stride = 0, slice = 0;
  int64_t extents[kMaxGatherRank] = {}, strides[kMaxGatherRank] = {};  // of the k indexed dims
};
// out (batches * tuples, slice) = the gathered slices; raw elements of elem_bytes 1, 2, 4 or 8.
cudaError_t LaunchGatherND(const GatherNDShape& s, int elem_bytes, const void* data, ir::DType idx_dtype,
                           const void* indices, void* out, uint32_t* flag, cudaStream_t stream);
// dx (data dims, zeroed here) += dy at the gathered slices: a thread per (batch, slice column)
// walks the tuples in order, so the sums are repeatable and in the CPU's order (f32 bit for bit).
cudaError_t LaunchGatherNDGrad(const GatherNDShape& s, int64_t num_data, ir::DType dtype, const void* dy,
                               ir::DType idx_dtype, const void* indices, void* dx, uint32_t* flag, cudaStream_t stream);

#ifndef __CUDACC__
// The shape of GatherND(data, indices) with batch_dims, and its output dims; an error naming
// GatherND for ranks, batch_dims or tuple lengths that do not fit.
absl::StatusOr<GatherNDShape> MakeGatherNDShape(const std::vector<int64_t>& data_dims,
                                                const std::vector<int64_t>& idx_dims, int64_t batch_dims,
                                                std::vector<int64_t>* out_dims);
absl::Status GatherND(const GatherNDShape& s, ir::DType dtype, const void* data, ir::DType idx_dtype,
                      const void* indices, void* out, uint32_t* flag, cudaStream_t stream);
absl::Status GatherNDGrad(const GatherNDShape& s, int64_t num_data, ir::DType dtype, const void* dy,
                          ir::DType idx_dtype, const void* indices, void* dx, uint32_t* flag, cudaStream_t stream);

// The shape of GatherElements(data, indices) along `axis` (negative counts from the end); an error
// naming GatherElements for a rank mismatch, a rank above 8 or indices larger than data off the axis.
absl::StatusOr<GatherElementsShape> MakeGatherElementsShape(const std::vector<int64_t>& data_dims,
                                                            const std::vector<int64_t>& idx_dims, int64_t axis);
absl::Status GatherElements(const GatherElementsShape& s, ir::DType dtype, const void* data, ir::DType idx_dtype,
                            const void* indices, void* out, uint32_t* flag, cudaStream_t stream);
absl::Status GatherElementsGrad(const GatherElementsShape& s, ir::DType dtype, const void* dy, ir::DType idx_dtype,
                                const void* indices, void* dx, uint32_t* flag, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
