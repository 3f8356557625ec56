#include "tools/backend_flag.h"

#include <cstdio>
#include <map>

#include "executor/backend/checked_backend.h"
#include "frontend/ir/status.h"
#include "partitioner/device.h"
#ifdef ONNXPIPE_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_status.h"
#endif

namespace onnxpipe::tools {

void DeclareCudaAttentionFlag(FlagSet& fs, std::string* out) {
  fs.String("cuda-attention", out,
            "--backend cuda: the fused attention of Attention nodes. auto: cuDNN's SDPA for bf16/fp16 nodes whose "
            "shapes and mask it takes (none, causal, bool key padding, full additive bias), where onnxpipe was "
            "built with cuDNN, else onnxpipe's flash kernels; cudnn: cuDNN for every node, an error naming a node "
            "it cannot run; flash: the flash kernels only. Dropout masks: flash's are the CPU backend's element "
            "for element, cuDNN's its own (the same distribution)");
}

void DeclareGemmTacticsFlag(FlagSet& fs, std::string* out) {
  fs.String("gemm-tactics", out,
            "--backend cuda: a GEMM tactic cache (JSON, created when missing): each GEMM shape not in it has "
            "cuBLASLt's candidate algorithms timed on its first run and the fastest written to the file, which "
            "later runs reuse untimed (keys hold the GPU and cuBLASLt version). Default: cuBLASLt's heuristic "
            "choice, untimed");
}

absl::StatusOr<std::shared_ptr<const backend::Backend>> BackendFromFlags(const std::string& name, int64_t device,
                                                                         const BackendOptions& options) {
  if (device < 0) return INVALID_ARGUMENT() << "--device must be >= 0, got " << device;
  const std::string& attention = options.cuda_attention;
  if (attention != "auto" && attention != "cudnn" && attention != "flash") {
    return INVALID_ARGUMENT() << "--cuda-attention expects auto, cudnn or flash, got '" << attention << "'";
  }
  if (options.tf32 && name != "cuda") {
    return INVALID_ARGUMENT() << "--tf32 applies to --backend cuda, not '" << name << "'";
  }
  if (!options.gemm_tactics.empty() && name != "cuda") {
    return INVALID_ARGUMENT() << "--gemm-tactics applies to --backend cuda, not '" << name << "'";
  }
  if (attention != "auto" && name != "cuda") {
    return INVALID_ARGUMENT() << "--cuda-attention applies to --backend cuda, not '" << name << "'";
  }
  if (name == "cpu") return backend::MakeCpuBackend();
  if (name == "checked") return backend::MakeCheckedBackend();
  if (name == "cuda") {
#ifdef ONNXPIPE_HAVE_CUDA
    cuda::CudaOptions cuda_options{.allow_tf32 = options.tf32, .gemm_tactics = options.gemm_tactics};
    if (attention == "cudnn") cuda_options.attention = cuda::AttentionImpl::kCudnn;
    if (attention == "flash") cuda_options.attention = cuda::AttentionImpl::kFlash;
    ASSIGN_OR_RETURN(std::shared_ptr<cuda::CudaBackend> be,
                     cuda::CudaBackend::Create(static_cast<int>(device), cuda_options));
    return std::shared_ptr<const backend::Backend>(std::move(be));
#else
    return FAILED_PRECONDITION() << "--backend cuda: this onnxpipe was built without the CUDA backend (no nvcc at "
                                    "build time, or -DONNXPIPE_CUDA=OFF)";
#endif
  }
  return INVALID_ARGUMENT() << "--backend expects cpu, cuda or checked, got '" << name << "'";
}

std::string BackendFallbackSummary(const backend::Backend& be) {
#ifdef ONNXPIPE_HAVE_CUDA
  if (const auto* c = dynamic_cast<const cuda::CudaBackend*>(&be)) {
    std::string ops;
    for (const auto& [op, n] : c->HostFallbacks()) ops += (ops.empty() ? "" : ", ") + op + " x" + std::to_string(n);
    return ops.empty() ? "" : "cuda: ran on the host (no CUDA kernel yet): " + ops;
  }
#endif
  return "";
}

std::string BackendAttentionSummary(const backend::Backend& be) {
#ifdef ONNXPIPE_HAVE_CUDA
  if (const auto* c = dynamic_cast<const cuda::CudaBackend*>(&be)) {
    const std::map<std::string, int64_t> runs = c->AttentionRuns();
    const int64_t cudnn = runs.at("cudnn"), flash = runs.at("flash");
    if (cudnn + flash == 0) return "";
    return "cuda attention: cudnn ran " + std::to_string(cudnn) + ", flash ran " + std::to_string(flash);
  }
#endif
  return "";
}

std::string BackendBuiltinDevice(const backend::Backend& be) {
#ifdef ONNXPIPE_HAVE_CUDA
  if (dynamic_cast<const cuda::CudaBackend*>(&be) != nullptr) {
    const absl::StatusOr<cuda::DeviceInfo> info = cuda::GetDeviceInfo(be.placement().index);
    return info.ok() ? partitioner::BuiltinDeviceForGpu(info->name, info->total_memory) : "";
  }
#endif
  return "cpu";
}

std::string BackendDeviceProfile(const backend::Backend& be) {
  const std::string builtin = BackendBuiltinDevice(be);
  return builtin.empty() ? "h200" : builtin;
}

absl::StatusOr<std::string> LocalGpuDevice(int64_t index) {
#ifdef ONNXPIPE_HAVE_CUDA
  absl::StatusOr<cuda::DeviceInfo> info = cuda::GetDeviceInfo(static_cast<int>(index));
  if (!info.ok()) return Annotate(info.status(), "--device auto: no CUDA GPU " + std::to_string(index) + " here");
  const std::string builtin = partitioner::BuiltinDeviceForGpu(info->name, info->total_memory);
  if (builtin.empty()) {
    return NOT_FOUND() << "--device auto: GPU " << index << " (" << info->name
                       << ") has no built-in device profile; pass --device FILE.json (onnxpipe profile --backend cuda "
                          "--device-out FILE.json writes one)";
  }
  return builtin;
#else
  return FAILED_PRECONDITION() << "--device auto: this onnxpipe was built without the CUDA backend, so it cannot "
                                  "read this machine's GPU; name the device (e.g. --device h100-80gb)";
#endif
}

std::string BackendMemorySummary(const backend::Backend& be) {
#ifdef ONNXPIPE_HAVE_CUDA
  if (const auto* c = dynamic_cast<const cuda::CudaBackend*>(&be)) {
    const cuda::CudaBackend::MemoryStats m = c->Memory();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "cuda memory: peak %.3f GiB in onnxpipe's buffers (arenas, parameters, optimizer state); "
                  "GPU in use %.3f of %.3f GiB (with the CUDA context and libraries)",
                  m.peak_allocated / 1073741824.0, m.device_used / 1073741824.0, m.device_total / 1073741824.0);
    return line;
  }
#endif
  return "";
}

}  // namespace onnxpipe::tools
