// Gather along an axis (the embedding lookup) and its backward scatter-add (GatherGrad) on the GPU.
//
// With data (outer, n_axis, inner) and indices (num_idx) (any index shape, flattened):
//   forward:  out (outer, num_idx, inner): out[o, j, :] = data[o, idx[j], :]; any dtype (copied by
//             element size); negative indices wrap once as in ONNX Gather.
//   backward: dtable (outer, n_axis, inner) = zeros with dy (outer, num_idx, inner) rows added at
//             idx[j]: each table row is owned by one block, which adds its gathered rows in
//             increasing j in fp32 (a stable radix sort groups the positions by row), so the result
//             is deterministic and equal to the CPU backend's GatherGrad. dy and dtable: f32 bf16
//             f16 (independently; e.g. a bf16 gradient into an fp32 table gradient). With
//             accumulate = true the sum is added to dtable's contents instead of replacing them.
// An index outside [-n_axis, n_axis) reads or writes nothing (its output row is zeros) and sets
// *bad_index (a device uint32, may be null) to 1; the host cannot see indices without a sync.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "frontend/ir/dtype.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#endif

namespace onnxpipe::cuda {

struct GatherShape {
  int64_t outer = 1, n_axis = 0, inner = 1;
  int64_t num_idx = 0;
};

cudaError_t LaunchGather(const GatherShape& s, ir::DType dtype, const void* data, ir::DType index_dtype,
                         const void* indices, void* out, uint32_t* bad_index, cudaStream_t stream);
// Bytes of device workspace LaunchGatherGrad needs (radix-sort keys, positions and scratch).
size_t GatherGradWorkspaceBytes(const GatherShape& s);
cudaError_t LaunchGatherGrad(const GatherShape& s, ir::DType dy_dtype, const void* dy, ir::DType index_dtype,
                             const void* indices, ir::DType out_dtype, void* dtable, bool accumulate, void* workspace,
                             size_t workspace_bytes, uint32_t* bad_index, cudaStream_t stream);

#ifndef __CUDACC__
// The GatherShape of Gather(data of `data_dims`, indices of num_idx elements, axis); an error
// for a bad axis or rank-0 data.
absl::StatusOr<GatherShape> MakeGatherShape(const std::vector<int64_t>& data_dims, int64_t axis, int64_t num_idx);

absl::Status Gather(const GatherShape& s, ir::DType dtype, const void* data, ir::DType index_dtype, const void* indices,
                    void* out, uint32_t* bad_index, cudaStream_t stream);
absl::Status GatherGrad(const GatherShape& s, ir::DType dy_dtype, const void* dy, ir::DType index_dtype,
                        const void* indices, ir::DType out_dtype, void* dtable, bool accumulate, void* workspace,
                        size_t workspace_bytes, uint32_t* bad_index, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
