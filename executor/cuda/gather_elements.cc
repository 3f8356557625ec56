// Host side of GatherElements: the shape check and the checked Status wrappers.
#include "executor/cuda/gather_elements.h"

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckIndices(const char* op, ir::DType idx_dtype) {
  if (idx_dtype != ir::DType::kI64 && idx_dtype != ir::DType::kI32) {
    return INVALID_ARGUMENT() << op << ": indices dtype " << ir::DTypeName(idx_dtype) << " is not i64 or i32";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GatherElementsShape> MakeGatherElementsShape(const std::vector<int64_t>& data_dims,
                                                            const std::vector<int64_t>& idx_dims, int64_t axis) {
  const int64_t r = static_cast<int64_t>(data_dims.size());
  if (r == 0 || r > kMaxGatherRank || static_cast<int64_t>(idx_dims.size()) != r) {
    return INVALID_ARGUMENT() << "GatherElements: data rank " << r << " and indices rank " << idx_dims.size()
                              << " must be equal and in [1, " << kMaxGatherRank << "]";
  }
  if (axis < -r || axis >= r) return INVALID_ARGUMENT() << "GatherElements: axis " << axis << " out of range for rank " << r;
  GatherElementsShape s;
  s.rank = static_cast<int>(r);
  s.axis = static_cast<int>(axis < 0 ? axis + r : axis);
  for (int64_t d = 0; d < r; ++d) {
    if (d != s.axis && idx_dims[d] > data_dims[d]) {
      return INVALID_ARGUMENT() << "GatherElements: indices dim " << idx_dims[d] << " exceeds data's " << data_dims[d]
                                << " at axis " << d;
    }
    s.data_dims[d] = data_dims[d];
    s.idx_dims[d] = idx_dims[d];
    s.num_data *= data_dims[d];
    s.num_idx *= idx_dims[d];
  }
  return s;
}

absl::Status GatherElements(const GatherElementsShape& s, ir::DType dtype, const void* data, ir::DType idx_dtype,
                            const void* indices, void* out, uint32_t* flag, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckIndices("GatherElements", idx_dtype));
  const int64_t e = ir::DTypeSize(dtype);
  if (e != 1 && e != 2 && e != 4 && e != 8) {
    return INVALID_ARGUMENT() << "GatherElements: dtype " << ir::DTypeName(dtype) << " is not 1, 2, 4 or 8 bytes";
  }
  if (s.num_idx == 0) return absl::OkStatus();
  if (data == nullptr || indices == nullptr || out == nullptr || flag == nullptr) {
    return INVALID_ARGUMENT() << "GatherElements: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchGatherElements(s, static_cast<int>(e), data, idx_dtype, indices, out, flag, stream));
  return absl::OkStatus();
}

absl::Status GatherElementsGrad(const GatherElementsShape& s, ir::DType dtype, const void* dy, ir::DType idx_dtype,
                                const void* indices, void* dx, uint32_t* flag, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckIndices("GatherElementsGrad", idx_dtype));
  if (dtype != ir::DType::kF32 && dtype != ir::DType::kBF16 && dtype != ir::DType::kF16) {
    return INVALID_ARGUMENT() << "GatherElementsGrad: dtype " << ir::DTypeName(dtype) << " is not f32, bf16 or f16";
  }
  if (s.num_data == 0) return absl::OkStatus();
  if (dx == nullptr || flag == nullptr || (s.num_idx > 0 && (dy == nullptr || indices == nullptr))) {
    return INVALID_ARGUMENT() << "GatherElementsGrad: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchGatherElementsGrad(s, dtype, dy, idx_dtype, indices, dx, flag, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
