#include "executor/cuda/cuda_status.h"

#include <cuda_runtime.h>


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

}  // namespace onnxpipe::cuda
