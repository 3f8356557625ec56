// CUDA error handling: CUDA_RETURN_IF_ERROR(cudaMalloc(...)) turns a cudaError_t into an
// absl::Status naming the call, file and line. Device discovery for tests and tools.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::cuda {

absl::Status CudaStatus(int error, const char* call, const char* file, int line);

struct DeviceInfo {
  std::string name;
  int compute_major = 0, compute_minor = 0;
  int64_t total_memory = 0;
  int sm_count = 0;
};

// Number of visible devices; 0 (not an error) when there is no GPU or no driver.
int DeviceCount();
absl::StatusOr<DeviceInfo> GetDeviceInfo(int device);

}  // namespace onnxpipe::cuda

#define CUDA_RETURN_IF_ERROR(call)                                                       \
  do {                                                                                   \
    int _onnxpipe_cuda_err = static_cast<int>(call);                                     \
    if (_onnxpipe_cuda_err != 0)                                                         \
      return ::onnxpipe::cuda::CudaStatus(_onnxpipe_cuda_err, #call, __FILE__, __LINE__); \
  } while (0)
