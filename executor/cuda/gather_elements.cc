// Host side of GatherElements and GatherND: the shape checks and the checked Status wrappers.
#include "executor/cuda/gather_elements.h"

#include <algorithm>

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
  if (axis < -r || axis >= r)
    return INVALID_ARGUMENT() << "GatherElements: axis " << axis << " out of range for rank " << r;
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

absl::StatusOr<GatherNDShape> MakeGatherNDShape(const std::vector<int64_t>& data_dims,
                                                const std::vector<int64_t>& idx_dims, int64_t batch_dims,
                                                std::vector<int64_t>* out_dims) {
  const int64_t r = static_cast<int64_t>(data_dims.size()), q = static_cast<int64_t>(idx_dims.size());
  const int64_t b = batch_dims;
  if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q)) {
    return INVALID_ARGUMENT() << "GatherND: batch_dims " << b << " with data rank " << r << " and indices rank " << q
                              << "; expected ranks >= 1 and 0 <= batch_dims < min(ranks)";
  }
  const int64_t k = idx_dims[q - 1];
  if (k < 1 || k > r - b || k > kMaxGatherRank) {
    return INVALID_ARGUMENT() << "GatherND: index tuples of length " << k << " do not fit data rank " << r
                              << " with batch_dims " << b;
  }
  GatherNDShape s;
  s.k = static_cast<int>(k);
  s.batches = 1;
  for (int64_t d = 0; d < b; ++d) {
    if (data_dims[d] != idx_dims[d]) {
      return INVALID_ARGUMENT() << "GatherND: batch dim " << d << " is " << data_dims[d] << " in data but "
                                << idx_dims[d] << " in indices";
    }
    s.batches *= data_dims[d];
  }
  s.batch_stride = 1;
  for (int64_t d = b; d < r; ++d) s.batch_stride *= data_dims[d];
  s.slice = 1;
  for (int64_t d = b + k; d < r; ++d) s.slice *= data_dims[d];
  for (int64_t j = k - 1, stride = s.slice; j >= 0; --j) {
    s.extents[j] = data_dims[b + j];
    s.strides[j] = stride;
    stride *= data_dims[b + j];
  }
  int64_t num_idx = 1;
  for (int64_t d : idx_dims) num_idx *= d;
  s.tuples = s.batches == 0 ? 0 : num_idx / k / s.batches;
  if (out_dims != nullptr) {
    out_dims->assign(idx_dims.begin(), idx_dims.end() - 1);
    out_dims->insert(out_dims->end(), data_dims.begin() + b + k, data_dims.end());
  }
  return s;
}

absl::Status GatherND(const GatherNDShape& s, ir::DType dtype, const void* data, ir::DType idx_dtype,
                      const void* indices, void* out, uint32_t* flag, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckIndices("GatherND", idx_dtype));
  const int64_t e = ir::DTypeSize(dtype);
  if (e != 1 && e != 2 && e != 4 && e != 8) {
    return INVALID_ARGUMENT() << "GatherND: dtype " << ir::DTypeName(dtype) << " is not 1, 2, 4 or 8 bytes";
  }
  if (s.batches * s.tuples * s.slice == 0) return absl::OkStatus();
  if (data == nullptr || indices == nullptr || out == nullptr || flag == nullptr) {
    return INVALID_ARGUMENT() << "GatherND: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchGatherND(s, static_cast<int>(e), data, idx_dtype, indices, out, flag, stream));
  return absl::OkStatus();
}

absl::Status GatherNDGrad(const GatherNDShape& s, int64_t num_data, ir::DType dtype, const void* dy,
                          ir::DType idx_dtype, const void* indices, void* dx, uint32_t* flag, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckIndices("GatherNDGrad", idx_dtype));
  if (dtype != ir::DType::kF32 && dtype != ir::DType::kBF16 && dtype != ir::DType::kF16) {
    return INVALID_ARGUMENT() << "GatherNDGrad: dtype " << ir::DTypeName(dtype) << " is not f32, bf16 or f16";
  }
  if (num_data == 0) return absl::OkStatus();
  if (dx == nullptr || flag == nullptr || (s.tuples > 0 && (dy == nullptr || indices == nullptr))) {
    return INVALID_ARGUMENT() << "GatherNDGrad: null device pointer";
  }
  CUDA_RETURN_IF_ERROR(LaunchGatherNDGrad(s, num_data, dtype, dy, idx_dtype, indices, dx, flag, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
