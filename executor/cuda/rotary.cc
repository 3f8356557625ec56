// Host side of the rotary family: the geometry (leading dims merged where x and the tables walk
// them alike) and the checked Status wrapper (rotary.h).
#include "executor/cuda/rotary.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {

absl::StatusOr<RotaryDims> MakeRotaryDims(const std::vector<int64_t>& x, const std::vector<int64_t>& table,
                                          int64_t rotary_dim, bool interleaved) {
  if (x.empty() || table.empty() || table.size() > x.size() || table.back() != rotary_dim || rotary_dim <= 0 ||
      rotary_dim % 2 != 0 || rotary_dim > x.back()) {
    return absl::InvalidArgumentError(absl::StrCat("Rotary: x (", absl::StrJoin(x, ", "), ") and tables (",
                                                   absl::StrJoin(table, ", "), ") do not fit rotary_dim ", rotary_dim));
  }
  RotaryDims d;
  d.width = x.back();
  d.rotary_dim = rotary_dim;
  d.interleaved = interleaved;
  d.rows = 1;
  // The tables' row strides along x's leading dims, right-aligned; 0 where they broadcast.
  const size_t lead = x.size() - 1, tlead = table.size() - 1;
  std::vector<int64_t> dims, strides;
  int64_t stride = 1;
  std::vector<int64_t> tstride(lead, 0);
  for (size_t k = 0; k < tlead; ++k) {
    const int64_t t = table[tlead - 1 - k], xd = x[lead - 1 - k];
    if (t != 1 && t != xd) return absl::InvalidArgumentError("Rotary: the tables do not broadcast to x");
    tstride[lead - 1 - k] = t == 1 ? 0 : stride;
    stride *= t;
  }
  for (size_t k = 0; k < lead; ++k) {
    d.rows *= x[k];
    if (x[k] == 1) continue;
    // Merge into the previous dim when the table walks both as one (contiguous, or both broadcast).
    if (!dims.empty() && strides.back() == tstride[k] * x[k]) {
      dims.back() *= x[k];
      strides.back() = tstride[k];
      continue;
    }
    dims.push_back(x[k]);
    strides.push_back(tstride[k]);
  }
  if (dims.size() > kMaxRotaryLeadDims)
    return absl::UnimplementedError(absl::StrCat("Rotary: ", dims.size(), " leading dims after merging"));
  d.lead_rank = static_cast<int>(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    d.lead_dims[k] = dims[k];
    d.table_strides[k] = strides[k];
  }
  return d;
}

template <typename T>
absl::Status Rotary(const RotaryDims& dims, bool transpose, const T* x, const T* cos, const T* sin, T* y,
                    cudaStream_t stream) {
  if (dims.rows < 0 || dims.rotary_dim <= 0 || dims.rotary_dim % 2 != 0 || dims.rotary_dim > dims.width)
    return absl::InvalidArgumentError("Rotary: invalid geometry");
  if (dims.rows == 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(LaunchRotary(dims, transpose, x, cos, sin, y, stream));
  return absl::OkStatus();
}

template absl::Status Rotary<float>(const RotaryDims&, bool, const float*, const float*, const float*, float*,
                                    cudaStream_t);
template absl::Status Rotary<__nv_bfloat16>(const RotaryDims&, bool, const __nv_bfloat16*, const __nv_bfloat16*,
                                            const __nv_bfloat16*, __nv_bfloat16*, cudaStream_t);

}  // namespace onnxpipe::cuda
