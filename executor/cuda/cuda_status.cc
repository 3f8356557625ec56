#include "executor/cuda/cuda_status.h"

#include <cuda_runtime.h>

#include "executor/cuda/gelu.h"

namespace onnxpipe::cuda {

absl::Status CudaStatus(int error, const char* call, const char* file, int line) {
  return absl::InternalError(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                             ": " + cudaGetErrorString(static_cast<cudaError_t>(error)));
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_memory = static_cast<int64_t>(prop.totalGlobalMem);
  info.sm_count = prop.multiProcessorCount;
  return info;
}

absl::Status GeluForward(const float* x, float* y, int64_t n, bool tanh_approx, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GeluForward: negative element count");
  CUDA_RETURN_IF_ERROR(LaunchGeluForward(x, y, n, tanh_approx, stream));
  return absl::OkStatus();
}

absl::Status GeluBackward(const float* dy, const float* x, float* dx, int64_t n, bool tanh_approx,
                          cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError("GeluBackward: negative element count");
  CUDA_RETURN_IF_ERROR(LaunchGeluBackward(dy, x, dx, n, tanh_approx, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
