// GatherElements and its gradient on the GPU (the index ops of transformers' mask code and of
// RoBERTa's position ids). data is dense row-major (rank <= 8); indices (i64 or i32) have data's rank,
// no dim above data's except along `axis`, and the output has the indices' dims. An index outside
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
cudaError_t LaunchGatherElementsGrad(const GatherElementsShape& s, ir::DType dtype, const void* dy,
                                     ir::DType idx_dtype, const void* indices, void* dx, uint32_t* flag,
                                     cudaStream_t stream);

#ifndef __CUDACC__
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
