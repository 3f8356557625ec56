// Host side of the embedding family: shape derivation and the checked Status wrappers.
#include "executor/cuda/embedding.h"

#include <limits>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

bool IsFloat16Or32(ir::DType t) { return t == ir::DType::kF32 || t == ir::DType::kBF16 || t == ir::DType::kF16; }

absl::Status CheckShapeAndIndices(const char* what, const GatherShape& s, ir::DType index_dtype) {
  if (s.outer < 0 || s.n_axis < 0 || s.inner < 0 || s.num_idx < 0) {
    return INVALID_ARGUMENT() << what << ": negative extent in shape (outer " << s.outer << ", n_axis " << s.n_axis
                              << ", inner " << s.inner << ", indices " << s.num_idx << ")";
  }
  if (index_dtype != ir::DType::kI64 && index_dtype != ir::DType::kI32) {
    return INVALID_ARGUMENT() << what << ": indices have dtype " << ir::DTypeName(index_dtype)
                              << ", expected i64 or i32";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GatherShape> MakeGatherShape(const std::vector<int64_t>& data_dims, int64_t axis, int64_t num_idx) {
  const int64_t rank = static_cast<int64_t>(data_dims.size());
  if (rank == 0) return INVALID_ARGUMENT() << "Gather: data must have rank >= 1";
  if (axis < -rank || axis >= rank) {
    return INVALID_ARGUMENT() << "Gather: axis " << axis << " is out of range for rank " << rank;
  }
  if (axis < 0) axis += rank;
  GatherShape s;
  for (int64_t d = 0; d < axis; ++d) s.outer *= data_dims[d];
  for (int64_t d = axis + 1; d < rank; ++d) s.inner *= data_dims[d];
  s.n_axis = data_dims[axis];
  s.num_idx = num_idx;
  return s;
}

absl::Status Gather(const GatherShape& s, ir::DType dtype, const void* data, ir::DType index_dtype, const void* indices,
                    void* out, uint32_t* bad_index, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShapeAndIndices("Gather", s, index_dtype));
  if (s.outer * s.num_idx * s.inner > 0 && (data == nullptr || indices == nullptr || out == nullptr)) {
    return INVALID_ARGUMENT() << "Gather: null device pointer";
  }
  if (s.n_axis == 0 && s.num_idx > 0) {
    return INVALID_ARGUMENT() << "Gather: " << s.num_idx << " indices into an axis of size 0";
  }
  CUDA_RETURN_IF_ERROR(LaunchGather(s, dtype, data, index_dtype, indices, out, bad_index, stream));
  return absl::OkStatus();
}

absl::Status GatherGrad(const GatherShape& s, ir::DType dy_dtype, const void* dy, ir::DType index_dtype,
                        const void* indices, ir::DType out_dtype, void* dtable, bool accumulate, void* workspace,
                        size_t workspace_bytes, uint32_t* bad_index, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShapeAndIndices("GatherGrad", s, index_dtype));
  if (!IsFloat16Or32(dy_dtype) || !IsFloat16Or32(out_dtype)) {
    return INVALID_ARGUMENT() << "GatherGrad: dY " << ir::DTypeName(dy_dtype) << " into " << ir::DTypeName(out_dtype)
                              << " is not supported, expected f32, bf16 or f16 for both";
  }
  if (s.num_idx >= std::numeric_limits<int32_t>::max() || s.n_axis >= std::numeric_limits<uint32_t>::max()) {
    return INVALID_ARGUMENT() << "GatherGrad: " << s.num_idx << " indices, axis " << s.n_axis
                              << " exceed the kernel's limits (2^31 indices, 2^32 rows)";
  }
  if (s.outer * s.n_axis * s.inner > 0 && dtable == nullptr) return INVALID_ARGUMENT() << "GatherGrad: null dtable";
  if (s.outer * s.num_idx * s.inner > 0 && (dy == nullptr || indices == nullptr || workspace == nullptr)) {
    return INVALID_ARGUMENT() << "GatherGrad: null device pointer (dY, indices or workspace)";
  }
  const size_t need = GatherGradWorkspaceBytes(s);
  if (workspace_bytes < need) {
    return INVALID_ARGUMENT() << "GatherGrad: workspace of " << workspace_bytes << " bytes, needs " << need
                              << " (GatherGradWorkspaceBytes)";
  }
  CUDA_RETURN_IF_ERROR(LaunchGatherGrad(s, dy_dtype, dy, index_dtype, indices, out_dtype, dtable, accumulate, workspace,
                                        workspace_bytes, bad_index, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
