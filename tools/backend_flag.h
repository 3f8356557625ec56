// --backend NAME [--device N]: the backend a command runs on.
//   cpu      the CPU backend (host memory, executor/cpu's kernels);
//   cuda     GPU N (executor/cuda); an error naming the flag when this build has no CUDA backend or
//            the machine no usable GPU;
//   checked  the CPU kernels over memory the host must not touch (executor/backend/checked_backend.h),
//            for tests of the driver.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"

namespace onnxpipe::tools {

// tf32: --tf32 (cuda only: fp32 GEMMs on TF32 tensor cores).
absl::StatusOr<std::shared_ptr<const backend::Backend>> BackendFromFlags(const std::string& name, int64_t device,
                                                                         bool tf32);
// A line saying which ops ran on the host instead of the device backend ("" when none or not cuda).
std::string BackendFallbackSummary(const backend::Backend& be);
// The cuda backend's memory: peak bytes in its buffers, the GPU's use ("" for other backends).
std::string BackendMemorySummary(const backend::Backend& be);

}  // namespace onnxpipe::tools
