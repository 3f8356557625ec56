// GEMMs of the CUDA backend through cuBLASLt: the graph's MatMul and Linear (Gemm) nodes and their gradients.
//
// Semantics are row-major, as in the IR and ONNX (MatMul; Gemm with transA/transB):
//   D (M, N) = epilogue(alpha * op(A) (M, K) * op(B) (K, N) + beta * C (M, N)),   op(X) = X or X^T
// A is stored (M, K), or (K, M) when trans_a; B is stored (K, N), or (N, K) when trans_b; C and D are one buffer
// (M, N), so beta = 1 accumulates in place. Matrices are dense (leading dimension = stored column count).
// Strided batch: `batch` problems, problem i's matrix at base + i * stride elements; stride 0 for A or B shares
// one matrix across the batch ((B, H, S, S)-style batched matmuls flatten B*H into `batch`).
//
// Types (input = A and B; output = C/D, bias, bias_grad and aux), all accumulating in fp32:
//   bf16 -> bf16;  bf16 -> f32 (weight gradients accumulated in fp32 with beta = 1);
//   f32  -> f32, exact fp32 unless allow_tf32 (TF32 tensor cores: 10-bit mantissa products); ignored for bf16.
//
// Epilogues (fused by cuBLASLt; batch must be 1: flatten leading dims into M). GELU here is the TANH
// APPROXIMATION 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the only form cuBLASLt fuses; a graph with
// erf-GELU must not use these epilogues.
//   kBias            D = alpha op(A) op(B) + beta C + bias             bias (N)
//   kBiasGeluTanh    aux = alpha op(A) op(B) + bias; D = gelu(aux)    bias (N); aux (M, N) written; beta = 0
//   kDGeluTanh       D = (alpha op(A) op(B)) * gelu'(aux)             aux (M, N) read (kBiasGeluTanh's); beta = 0
//   kDGeluTanhBGrad  kDGeluTanh, and bias_grad (N) = column sums of D (sum over the M rows)
//   kBGradA          plain GEMM, and bias_grad (M) = sum_k op(A)[m, k]; alpha = 1
//                    (Linear backward dW (out, in) = dY^T X with transA: db = column sums of dY)
//   kBGradB          plain GEMM, and bias_grad (N) = sum_k op(B)[k, n]; alpha = 1
// bias_grad is overwritten, never accumulated. aux epilogues need N % 8 == 0 (cuBLASLt's aux leading dimension).
//
// Tactics: each problem (shape, types, transposes, epilogue, pointer alignment, workspace, device, cuBLASLt
// version) gets an algorithm once. Without a tactic cache file: the heuristic's first algorithm. With one: the
// heuristic's top candidates are timed on the caller's stream once, the fastest kept in memory and written to the
// file (atomically) for later runs. Choosing may synchronise the stream, so Prepare (or Run) every problem during
// warm-up, before CUDA graph capture: a problem first seen while its stream is capturing is FailedPrecondition.
//
// Workspace: the caller (the memory planner) owns it and passes pointer + size on every call; GemmWorkspaceBytes
// says how much to plan. Algorithms needing more than the given size are not used.
//
// Threading: a GemmContext (one cuBLASLt handle plus the tactic caches) is used by one host thread at a time; make
// one per stream or thread. Contexts of one process may share a tactic cache file: each save merges with the file.
// Its destructor releases the handle; it must not outlive the CUDA context.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/cuda/gemm_tactics.h"
#include "frontend/ir/dtype.h"

namespace onnxpipe::cuda {

enum class GemmEpilogue : uint8_t { kNone, kBias, kBiasGeluTanh, kDGeluTanh, kDGeluTanhBGrad, kBGradA, kBGradB };
std::string_view GemmEpilogueName(GemmEpilogue e);

// One GEMM problem without its pointers: what a tactic is chosen for. Built once per graph node.
struct GemmDesc {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between consecutive problems; read when batch > 1
  ir::DType input_type = ir::DType::kBF16;            // A and B
  ir::DType output_type = ir::DType::kBF16;           // C/D, bias, bias_grad, aux
  bool allow_tf32 = false;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  float alpha = 1, beta = 0;
};

// Shapes, strides, type combination and epilogue constraints: InvalidArgument or Unimplemented naming the problem.
absl::Status ValidateGemm(const GemmDesc& desc);

// Device buffers of one call (types as in GemmDesc).
struct GemmBuffers {
  const void* a = nullptr;     // (batch, M, K), or (batch, K, M) when trans_a
  const void* b = nullptr;     // (batch, K, N), or (batch, N, K) when trans_b
  void* c = nullptr;           // (batch, M, N): C read when beta != 0, D written
  const void* bias = nullptr;  // (N): kBias, kBiasGeluTanh
  void* aux = nullptr;         // (M, N): written by kBiasGeluTanh, read by kDGeluTanh*
  void* bias_grad = nullptr;   // (M) for kBGradA; (N) for kBGradB, kDGeluTanhBGrad
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Workspace bytes to plan per concurrently running GEMM on a device of this compute capability
// (32 MiB from Hopper on, 4 MiB before, as cuBLAS recommends).
int64_t GemmWorkspaceBytes(int compute_major);

struct GemmContextOptions {
  std::string tactic_cache_path;  // empty: no timing, the heuristic's first algorithm
  int candidates = 8;             // heuristic candidates timed per new problem
  int timing_iterations = 5;      // timed runs per candidate, after one warm-up run
};

class GemmContext {
 public:
  // Creates a cuBLASLt handle for the current device and reads the tactic cache file when one is set. A missing
  // file is an empty cache; an unreadable or corrupt one is reported on stderr, kept in cache_load_status() and
  // ignored: its problems are timed again and the file rewritten.
  static absl::StatusOr<std::unique_ptr<GemmContext>> Create(const GemmContextOptions& options = {});
  ~GemmContext();
  GemmContext(const GemmContext&) = delete;
  GemmContext& operator=(const GemmContext&) = delete;

  // Chooses (or finds) the tactic for `desc` with buffers aligned like `buffers`, without running the GEMM
  // itself. Timing candidates writes D, aux and bias_grad (never C when beta != 0: a temporary D is used).
  absl::StatusOr<GemmTactic> Prepare(const GemmDesc& desc, const GemmBuffers& buffers, cudaStream_t stream);
  // Prepare, then enqueue the GEMM on `stream`.
  absl::Status Run(const GemmDesc& desc, const GemmBuffers& buffers, cudaStream_t stream);

  const absl::Status& cache_load_status() const;
  // Problems this context timed (0 when every tactic came from the file or the heuristic).
  int timed_problems() const;

 private:
  struct Impl;
  explicit GemmContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace onnxpipe::cuda
