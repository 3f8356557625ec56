// Host side of the gated activation family: the checked Status wrappers (gated_activation.h).
#include "executor/cuda/gated_activation.h"

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {

template <typename T>
absl::Status GatedActivationForward(ir::GatedAct act, const T* gate, const T* up, T* y, int64_t n,
                                    cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GatedActivationForward: negative element count");
  CUDA_RETURN_IF_ERROR(LaunchGatedActivationForward(act, gate, up, y, n, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status GatedActivationBackward(ir::GatedAct act, const T* dy, const T* gate, const T* up, T* dgate, T* dup,
                                     int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GatedActivationBackward: negative element count");
  if (dgate == nullptr && dup == nullptr)
    return absl::InvalidArgumentError("GatedActivationBackward: neither dgate nor dup is wanted");
  CUDA_RETURN_IF_ERROR(LaunchGatedActivationBackward(act, dy, gate, up, dgate, dup, n, stream));
  return absl::OkStatus();
}

template absl::Status GatedActivationForward<float>(ir::GatedAct, const float*, const float*, float*, int64_t,
                                                    cudaStream_t);
template absl::Status GatedActivationForward<__nv_bfloat16>(ir::GatedAct, const __nv_bfloat16*, const __nv_bfloat16*,
                                                            __nv_bfloat16*, int64_t, cudaStream_t);
template absl::Status GatedActivationBackward<float>(ir::GatedAct, const float*, const float*, const float*, float*,
                                                     float*, int64_t, cudaStream_t);
template absl::Status GatedActivationBackward<__nv_bfloat16>(ir::GatedAct, const __nv_bfloat16*, const __nv_bfloat16*,
                                                             const __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*,
                                                             int64_t, cudaStream_t);

}  // namespace onnxpipe::cuda
