// Device profiles: what the partitioner knows about one pipeline stage's accelerator. Built-in
// profiles for the GPUs HPC centres run (h200, h100-80gb, a100-80gb, a100-40gb, v100-32gb) and a
// `cpu` calibrated from measurements of the CPU backend (device.cc); any other device comes from a
// JSON file (format below; `onnxpipe profile --device-out` writes one for the machine it runs on).
// Tests build profiles by hand (fake devices) and hand them to Partition() directly.
//
// JSON device file (every key below; unknown keys are an error so that a typo is not ignored):
//   {
//     "name": "my-gpu",                      required
//     "memory": "80GiB",                     required; a byte count or a string with a unit
//                                            (B, KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB,
//                                            TiB: powers of 1024)
//     "reserved": "1GiB",                    memory the plan may not use (CUDA context, library
//                                            workspaces); default 0
//     "peak_tflops": {"fp32": 494, "bf16": 989},  required (at least one); dense GEMM peaks;
//                                            "fp32" means the fp32 training mode (TF32 GEMMs)
//     "vector_tflops": 67,                   non-GEMM arithmetic peak; default = peak fp32 / 8
//     "memory_bandwidth_gbps": 4800,         required; device memory, GB/s (1e9 bytes/s)
//     "link_bandwidth_gbps": 450,            required; stage-to-stage, one direction, GB/s
//     "link_latency_us": 5,                  per transfer; default 5
//     "data_parallel_bandwidth_gbps": 50,    between a stage's data-parallel replicas (the gradient
//                                            all-reduce), one direction, GB/s; default
//                                            link_bandwidth_gbps. Set it when the replicas talk
//                                            over InfiniBand and the stages over NVLink. Its
//                                            latency is link_latency_us
//     "op_overhead_us": 4,                   per kernel (launch, tails); default 4
//     "compute_efficiency": 0.8,             achieved fraction of the GEMM peak; default 0.8
//     "memory_efficiency": 0.8,              achieved fraction of the bandwidth; default 0.8
//     "backend": "cuda"                      the backend whose kernels run on it: "cpu" | "cuda"
//                                            (whose kernel scratch a plan counts); default "cuda"
//   }
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::partitioner {

// Compute precision of the training step. kBF16 = bf16 activations and GEMMs with fp32 master
// weights, gradients and optimizer state (DESIGN.md). It picks the device's GEMM peak; the bytes of
// memory and traffic are those of the training graph's dtypes (a bf16 graph is made by
// passes/mixed_precision.h: `train`, `partition` and `profile --dtype bf16` build the same one).
enum class Precision { kFP32, kBF16 };
const char* PrecisionName(Precision p);
absl::StatusOr<Precision> ParsePrecision(std::string_view s);  // "fp32" | "bf16"

struct DeviceProfile {
  std::string name;
  int64_t memory_bytes = 0;
  int64_t reserved_bytes = 0;
  double gemm_flops_fp32 = 0;   // FLOP/s
  double gemm_flops_bf16 = 0;   // FLOP/s
  double vector_flops = 0;      // FLOP/s
  double memory_bandwidth = 0;  // bytes/s
  double link_bandwidth = 0;    // bytes/s, one direction
  double link_latency_s = 5e-6;
  double data_parallel_bandwidth = 0;  // bytes/s, one direction; 0: link_bandwidth
  double op_overhead_s = 4e-6;
  double compute_efficiency = 0.8;
  double memory_efficiency = 0.8;
  std::string source = "built-in";  // "built-in" or the JSON file's path
  std::string backend = "cuda";     // "cpu" | "cuda": the backend whose kernels run on it

  int64_t usable_bytes() const { return memory_bytes - reserved_bytes; }
  double data_parallel_link() const { return data_parallel_bandwidth > 0 ? data_parallel_bandwidth : link_bandwidth; }
  double gemm_flops(Precision p) const {
    return p == Precision::kBF16 && gemm_flops_bf16 > 0 ? gemm_flops_bf16 : gemm_flops_fp32;
  }
};

std::vector<std::string> BuiltinDeviceNames();
// NotFound naming the known devices when `name` is not one of them.
absl::StatusOr<DeviceProfile> BuiltinDevice(std::string_view name);
// Parses a device JSON document; `what` names it in errors.
absl::StatusOr<DeviceProfile> DeviceFromJson(const nlohmann::json& j, const std::string& what);
absl::StatusOr<DeviceProfile> LoadDeviceFile(const std::string& path);
// The built-in profile of a GPU from what its driver reports (cudaDeviceProp's name and total memory), e.g.
// "NVIDIA H100 80GB HBM3" -> "h100-80gb", an A100 by its memory -> "a100-80gb" or "a100-40gb"; "" for a GPU
// without one (the caller picks a default or asks for --device).
std::string BuiltinDeviceForGpu(std::string_view gpu_name, int64_t total_memory_bytes);
// A built-in name, or a path to a JSON file (anything ending in .json or containing '/').
absl::StatusOr<DeviceProfile> ResolveDevice(const std::string& name_or_path);
nlohmann::ordered_json DeviceToJson(const DeviceProfile& d);

// "80GiB", "80 GB", "1.5TiB", "123" (bytes). InvalidArgument on anything else.
absl::StatusOr<int64_t> ParseByteSize(std::string_view s);
// Human-readable, binary units: "12.3 GiB", "512 B".
std::string FormatBytes(int64_t bytes);

// Parses the JSON file at `path`: NotFound "<path>: <missing>" when it cannot be opened, InvalidArgument
// "<path>: <invalid>: <parser's reason>" when it is not JSON.
absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, const std::string& missing,
                                            const std::string& invalid = "not valid JSON");

}  // namespace onnxpipe::partitioner
