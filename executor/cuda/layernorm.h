// LayerNorm and RMSNorm over the last axis on the GPU, forward and backward, optionally fused with
// the residual add that precedes a pre-norm block. T is float or __nv_bfloat16; statistics,
// reductions and parameter gradients are fp32 whatever T is.
//
// A problem is (rows, d): x is viewed as rows contiguous vectors of d elements (the IR's
// LayerNorm with axis = -1 after flattening; any axis when the normalised dims are the trailing
// contiguous ones). With s = x' + residual (s = x without a residual; x' = x through the optional
// fused dropout, the Dropout a post-LN block applies to its sub-layer's output before the add):
//   LayerNorm: mean = sum(s) / d, var = sum((s - mean)^2) / d (biased), rstd = 1 / sqrt(var + eps),
//              y = (s - mean) * rstd * gamma + beta                    (the CPU op's Y, Mean, InvStdDev)
//   RMSNorm:   rstd = 1 / sqrt(sum(s^2) / d + eps), y = s * rstd * gamma   (mean is not used)
// Backward (the CPU LayerNormGrad): with xh = (s - mean) * rstd and g = dy * gamma (dy = dy + dy2
// rounded to T when a second addend is given: the Sum the graph fused into LayerNormGrad),
//   LayerNorm: ds = rstd * (g - mean(g) - xh * mean(g xh)),  RMSNorm: ds = rstd * (g - xh * mean(g xh)),
//   dx = ds + dresidual (the residual stream's incoming gradient, when given), and optionally
//   dx_dropped = dx through the forward's fused dropout (LayerNormGrad's dXDropped),
//   dgamma = sum over rows of dy * xh, dbeta = sum over rows of dy, and optionally the sums over rows
//   of dx or dx_dropped as stored (a bias gradient).
// With T = bf16 the stored s (rounded to bf16) is what is normalised, so the backward, which reads
// s, sees exactly the forward's input.
//
// Kernels: a thread block per row (the backward's blocks walk ranges of rows, several rows in flight
// at a time, and give a row 8 to 32 lanes of a warp when d <= 256), each thread holding up to 16
// elements in registers (16-byte loads when d and the pointers allow); dgamma/dbeta (and dx_sums) are reduced in
// two passes through a workspace (per-block partial sums, then a fixed-order column sum), so
// results are bitwise reproducible without atomics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cuda/dropout.h"

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

enum class NormKind { kLayerNorm, kRmsNorm };

// Largest supported d (any alignment).
inline constexpr int64_t kNormMaxD = 8192;

template <typename T>
struct NormForwardArgs {
  NormKind kind = NormKind::kLayerNorm;
  int64_t rows = 0;
  int64_t d = 0;
  float epsilon = 1e-5f;
  const T* x = nullptr;         // (rows, d)
  const T* residual = nullptr;  // (rows, d) optional: normalise s = x' + residual
  T* sum = nullptr;             // (rows, d) s, optional; may alias x or residual
  // Optional, with residual: x' = x kept and scaled, or zeroed, by this dropout (dropout.h: the CPU
  // backend's stream, element i of x at counter counter_base + i); x' = x without it.
  const DropoutParams* dropout = nullptr;
  const T* gamma = nullptr;  // (d)
  const T* beta = nullptr;   // (d) optional; LayerNorm only
  T* y = nullptr;            // (rows, d)
  float* mean = nullptr;     // (rows) optional; LayerNorm only
  float* rstd = nullptr;     // (rows) optional
};

template <typename T>
struct NormBackwardArgs {
  NormKind kind = NormKind::kLayerNorm;
  int64_t rows = 0;
  int64_t d = 0;
  float epsilon = 1e-5f;         // used only when the statistics are recomputed
  const T* dy = nullptr;         // (rows, d)
  const T* dy2 = nullptr;        // (rows, d) optional: the incoming gradient is dy + dy2, rounded to T
  const T* x = nullptr;          // (rows, d) the normalised input (the forward's s)
  const T* gamma = nullptr;      // (d)
  const float* mean = nullptr;   // (rows) the forward's; LayerNorm: given together with rstd
  const float* rstd = nullptr;   // (rows) the forward's; both absent: recomputed from x
  const T* dresidual = nullptr;  // (rows, d) optional, added to dx; may alias dx
  T* dx = nullptr;               // (rows, d)
  float* dgamma = nullptr;       // (d) optional, overwritten
  float* dbeta = nullptr;        // (d) optional, overwritten; LayerNorm only
  float* workspace = nullptr;    // NormBackwardWorkspaceBytes(rows, d) bytes when dgamma or dbeta
  // Optional, LayerNorm only: dx_dropped = dx as stored, kept and scaled, or zeroed, by this dropout (the
  // forward's fused one, element i at counter counter_base + i): the DropoutGrad of dx in the same pass.
  const DropoutParams* dropout = nullptr;
  T* dx_dropped = nullptr;  // (rows, d)
  // Optional: the column sums (d) of dx as stored, or of dx_dropped with sums_of_dropped (fp32,
  // overwritten; needs the workspace): LayerNormGrad's dXSums, the bias gradient of the Linear whose
  // output that gradient is, reduced as dgamma/dbeta are.
  float* dx_sums = nullptr;
  bool sums_of_dropped = false;
};

// Bytes of the backward's workspace; depends only on (rows, d).
int64_t NormBackwardWorkspaceBytes(int64_t rows, int64_t d);

// Launchers for arguments the Status wrappers accept; cudaErrorInvalidValue for what they cannot
// launch. Instantiated for float and __nv_bfloat16.
template <typename T>
cudaError_t LaunchNormForward(const NormForwardArgs<T>& args, cudaStream_t stream);
template <typename T>
cudaError_t LaunchNormBackward(const NormBackwardArgs<T>& args, cudaStream_t stream);

#ifndef __CUDACC__
// Check the arguments (InvalidArgument naming the field and what was expected), then launch.
template <typename T>
absl::Status NormForward(const NormForwardArgs<T>& args, cudaStream_t stream);
template <typename T>
absl::Status NormBackward(const NormBackwardArgs<T>& args, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
