// --backend NAME [--device N]: the backend a command runs on.
//   cpu      the CPU backend (host memory, executor/cpu's kernels);
//   cuda     GPU N (executor/cuda); an error naming the flag when this build has no CUDA backend or
//            the machine no usable GPU;
//   checked  the CPU kernels over memory the host must not touch (executor/backend/checked_backend.h),
//            for tests of the driver.
// Options of --backend cuda (an error naming the flag with any other backend): --tf32,
// --cuda-attention auto|cudnn|flash (executor/cuda/cuda_backend.h's AttentionImpl) and --gemm-tactics FILE.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "tools/flags.h"

namespace onnxpipe::tools {

struct BackendOptions {
  bool tf32 = false;                    // --tf32: fp32 GEMMs on TF32 tensor cores
  std::string cuda_attention = "auto";  // --cuda-attention
  std::string gemm_tactics;             // --gemm-tactics
};

// Declare --cuda-attention and --gemm-tactics into `out` (their one help text, shared by every command that has them).
void DeclareCudaAttentionFlag(FlagSet& fs, std::string* out);
void DeclareGemmTacticsFlag(FlagSet& fs, std::string* out);

// An error naming the flag for a bad --backend, --device or --cuda-attention value, and for
// --tf32, --gemm-tactics or a --cuda-attention other than auto with a backend other than cuda.
absl::StatusOr<std::shared_ptr<const backend::Backend>> BackendFromFlags(const std::string& name, int64_t device,
                                                                         const BackendOptions& options = {});
// A line saying which ops ran on the host instead of the device backend ("" when none or not cuda).
std::string BackendFallbackSummary(const backend::Backend& be);
// Which fused attention ran Attention/AttentionGrad on the cuda backend, e.g.
// "cuda attention: cudnn ran 12, flash ran 0" ("" for other backends or when none ran).
std::string BackendAttentionSummary(const backend::Backend& be);
// The built-in device profile (partitioner/device.h) of what `be` runs on: "cpu" for the CPU backends, the GPU's
// for cuda (partitioner::BuiltinDeviceForGpu), "" for a GPU without one. `onnxpipe profile` records it.
std::string BackendBuiltinDevice(const backend::Backend& be);
// The partitioner's device profile for what `be` runs on, for the commands that partition without --device (train
// --stages K): BackendBuiltinDevice, or the partition tool's default, h200, for a GPU without one.
std::string BackendDeviceProfile(const backend::Backend& be);
// `partition --device auto`: the built-in profile of this machine's GPU `index`. An error naming the flag when
// there is none: onnxpipe built without CUDA, no such GPU, or a GPU without a built-in profile.
absl::StatusOr<std::string> LocalGpuDevice(int64_t index);
// The cuda backend's memory: peak bytes in its buffers, the GPU's use ("" for other backends).
std::string BackendMemorySummary(const backend::Backend& be);

}  // namespace onnxpipe::tools
