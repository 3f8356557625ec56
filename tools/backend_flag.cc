#include "tools/backend_flag.h"

#include <cstdio>

#include "executor/backend/checked_backend.h"
#include "frontend/ir/status.h"
#ifdef ONNXPIPE_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif

namespace onnxpipe::tools {

absl::StatusOr<std::shared_ptr<const backend::Backend>> BackendFromFlags(const std::string& name, int64_t device,
                                                                         bool tf32) {
  if (device < 0) return INVALID_ARGUMENT() << "--device must be >= 0, got " << device;
  if (tf32 && name != "cuda") return INVALID_ARGUMENT() << "--tf32 applies to --backend cuda, not '" << name << "'";
  if (name == "cpu") return backend::MakeCpuBackend();
  if (name == "checked") return backend::MakeCheckedBackend();
  if (name == "cuda") {
#ifdef ONNXPIPE_HAVE_CUDA
    ASSIGN_OR_RETURN(std::shared_ptr<cuda::CudaBackend> be, cuda::CudaBackend::Create(static_cast<int>(device), {.allow_tf32 = tf32}));
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
