// The CUDA backend (backend::Backend on one GPU): device memory from cudaMalloc, copies and fills
// on CUDA streams (one per pipeline stage), events between streams, and a kernel table keyed by op
// (cuda_kernels.h) filled by the kernel families of this folder.
//
// Ops without a CUDA kernel for their dtypes run on the host: their inputs are copied to the host,
// the CPU backend's kernel runs (with the same random stream, so a dropout mask is the CPU's), and
// the outputs are copied into their planned device slots. That keeps every model trainable while
// kernels land family by family; HostFallbacks() says which ops took that path, and the training
// command prints it. It is slow by design and never silent.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"

struct CUstream_st;  // cudaStream_t's pointee, so that this header needs no CUDA headers

namespace onnxpipe::cuda {

// Which fused attention runs Attention and AttentionGrad (attention_kernels.cc).
enum class AttentionImpl {
  // cuDNN's SDPA (attention.h) for a bf16/fp16 node whose config it accepts (key-padding, causal or
  // full-bias masks; decided once per config when the plan sizes the workspace), where onnxpipe
  // was built with cuDNN; the flash kernels otherwise.
  kAuto,
  // cuDNN's SDPA for every Attention/AttentionGrad node; one it cannot run is an error naming it.
  kCudnn,
  // The flash kernels only (flash_attention.h): dropout masks are the CPU backend's, element for
  // element (the CPU-parity tests use this).
  kFlash,
};

struct CudaOptions {
  bool allow_tf32 = false;  // fp32 GEMMs on TF32 tensor cores (PyTorch's allow_tf32); else exact fp32
  // A GEMM tactic cache file (gemm_tactics.h): each new GEMM problem's heuristic candidates are timed and the
  // fastest kept there, a problem the file holds runs its tactic untimed; empty: the heuristic's first algorithm.
  std::string gemm_tactics{};
  AttentionImpl attention = AttentionImpl::kAuto;
};

class CudaBackend : public backend::Backend {
 public:
  // The backend of GPU `device`: an error naming the device when there is no usable GPU.
  static absl::StatusOr<std::shared_ptr<CudaBackend>> Create(int device, CudaOptions options = {});
  struct MemoryStats {
    int64_t allocated = 0, peak_allocated = 0;    // bytes in the backend's buffers (Allocate): now, at most
    int64_t device_used = -1, device_total = -1;  // the GPU's, every process and library included (-1: unknown)
  };
  virtual MemoryStats Memory() const = 0;
  // Op name -> evaluations that ran on the host so far.
  virtual std::map<std::string, int64_t> HostFallbacks() const = 0;
  // Attention and AttentionGrad evaluations so far per fused implementation: "cudnn", "flash"
  // (host fallbacks are in HostFallbacks).
  virtual std::map<std::string, int64_t> AttentionRuns() const = 0;
};

// The CUDA stream behind one of CudaBackend's streams (for libraries that issue on it, as NCCL); null for any other.
CUstream_st* NativeStream(backend::Stream* stream);

}  // namespace onnxpipe::cuda
