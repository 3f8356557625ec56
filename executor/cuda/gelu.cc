// Host side of the GELU family: the checked Status wrappers (gelu.h).
#include "executor/cuda/gelu.h"

#include <type_traits>

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/reduce.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckArgs(const char* what, int64_t n, const DropoutParams* dropout, const void* keep_bits) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": negative element count"));
  if (keep_bits != nullptr && n % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": keep bits of ", n, " elements, not a multiple of 8"));
  }
  if (dropout != nullptr && !(dropout->ratio >= 0.0 && dropout->ratio <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dropout ratio ", dropout->ratio, ", expected [0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
absl::Status GeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                         uint8_t* keep_bits, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs("GeluForward", n, dropout, keep_bits));
  CUDA_RETURN_IF_ERROR(LaunchGeluForward(x, y, n, tanh_approx, dropout, keep_bits, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                          const uint8_t* keep_bits, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs("GeluBackward", n, dropout, keep_bits));
  CUDA_RETURN_IF_ERROR(LaunchGeluBackward(dy, x, dx, n, tanh_approx, dropout, keep_bits, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBackwardWithSums(const T* dy, const T* x, T* dx, int64_t rows, int64_t cols, bool tanh_approx,
                                  const DropoutParams* dropout, const uint8_t* keep_bits, ir::DType sums_dtype,
                                  void* sums, void* workspace, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return absl::InvalidArgumentError("GeluBackwardWithSums: negative extent");
  RETURN_IF_ERROR(CheckArgs("GeluBackwardWithSums", rows * cols, dropout, keep_bits));
  if (sums == nullptr || (workspace == nullptr && GeluSumsWorkspaceBytes(rows, cols) > 0)) {
    return absl::InvalidArgumentError("GeluBackwardWithSums: null sums or workspace");
  }
  bool fused = false;
  float* const partial = static_cast<float*>(workspace);
  CUDA_RETURN_IF_ERROR(
      LaunchGeluBackwardPartialSums(dy, x, dx, rows, cols, tanh_approx, dropout, keep_bits, partial, &fused, stream));
  if (!fused) CUDA_RETURN_IF_ERROR(LaunchGeluBackward(dy, x, dx, rows * cols, tanh_approx, dropout, keep_bits, stream));
  const int64_t parts = fused ? GeluSumsParts(rows, cols) : rows;
  ASSIGN_OR_RETURN(const ReducePlan plan, MakeReducePlan({parts, cols}, {0}));
  return Reduce(ReduceKind::kSum, plan, fused || std::is_same_v<T, float> ? ir::DType::kF32 : ir::DType::kBF16,
                fused ? static_cast<const void*>(partial) : dx, sums_dtype, sums, stream);
}

template absl::Status GeluBackwardWithSums<float>(const float*, const float*, float*, int64_t, int64_t, bool,
                                                  const DropoutParams*, const uint8_t*, ir::DType, void*, void*,
                                                  cudaStream_t);
template absl::Status GeluBackwardWithSums<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                          int64_t, int64_t, bool, const DropoutParams*, const uint8_t*,
                                                          ir::DType, void*, void*, cudaStream_t);
template absl::Status GeluForward<float>(const float*, float*, int64_t, bool, const DropoutParams*, uint8_t*,
                                         cudaStream_t);
template absl::Status GeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool,
                                                 const DropoutParams*, uint8_t*, cudaStream_t);
template absl::Status GeluBackward<float>(const float*, const float*, float*, int64_t, bool, const DropoutParams*,
                                          const uint8_t*, cudaStream_t);
template absl::Status GeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                  bool, const DropoutParams*, const uint8_t*, cudaStream_t);

}  // namespace onnxpipe::cuda
