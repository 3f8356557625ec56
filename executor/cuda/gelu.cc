// Host side of the GELU family: the checked Status wrappers (gelu.h).
#include "executor/cuda/gelu.h"

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"
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

template absl::Status GeluForward<float>(const float*, float*, int64_t, bool, const DropoutParams*, uint8_t*,
                                         cudaStream_t);
template absl::Status GeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool,
                                                 const DropoutParams*, uint8_t*, cudaStream_t);
template absl::Status GeluBackward<float>(const float*, const float*, float*, int64_t, bool, const DropoutParams*,
                                          const uint8_t*, cudaStream_t);
template absl::Status GeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                  bool, const DropoutParams*, const uint8_t*, cudaStream_t);

}  // namespace onnxpipe::cuda
