// Host side of the GELU family: the checked Status wrappers (gelu.h).
#include "executor/cuda/gelu.h"

#include "executor/cuda/cuda_status.h"

namespace onnxpipe::cuda {

template <typename T>
absl::Status GeluForward(const T* x, T* y, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GeluForward: negative element count");
  CUDA_RETURN_IF_ERROR(LaunchGeluForward(x, y, n, tanh_approx, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status GeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GeluBackward: negative element count");
  CUDA_RETURN_IF_ERROR(LaunchGeluBackward(dy, x, dx, n, tanh_approx, stream));
  return absl::OkStatus();
}

template absl::Status GeluForward<float>(const float*, float*, int64_t, bool, cudaStream_t);
template absl::Status GeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool, cudaStream_t);
template absl::Status GeluBackward<float>(const float*, const float*, float*, int64_t, bool, cudaStream_t);
template absl::Status GeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int64_t,
                                                  bool, cudaStream_t);

}  // namespace onnxpipe::cuda
