// Softmax / LogSoftmax over the last axis and fused softmax + cross-entropy on the GPU. T is float
// or __nv_bfloat16; maxima, sums and losses are fp32 whatever T is. One thread block per row;
// 16-byte loads when the row length and the pointers allow.
//
// Softmax (the CPU Softmax/LogSoftmax and SoftmaxGrad/LogSoftmaxGrad with axis = -1), rows of n:
//   y = exp(x - max) / sum(exp(x - max))          log: y = x - max - log(sum(exp(x - max)))
//   dx = y * (dy - sum(dy * y))                   log: dx = dy - exp(y) * sum(dy)
//
// Cross-entropy (the CPU SoftmaxCrossEntropyLoss followed by SoftmaxCrossEntropyLossGrad, for
// scores (rows, classes) with the class axis last, i.e. the ONNX (N, C) case): with
// lp = log_softmax(logits), class weights w (1 when absent), W = sum(w), label l, smoothing e,
//   loss_row = (1 - e) w_l (-lp_l) + e / C * sum_c w_c (-lp_c),   0 for rows labelled ignore_index,
//   loss = sum of loss_row (kSum), that sum / sum of w_l over non-ignored rows (kMean), or the
//   loss_row themselves (kNone);
//   dlogits[row, c] = coef * ((1 - e) w_l (p_c - [c == l]) + e / C (W p_c - w_c)), p = exp(lp),
//   coef = dloss (kSum), dloss / sum of w_l (kMean), dloss[row] (kNone), 0 on ignored rows.
// The logits are f32 or bf16 (read as they are, computed in fp32; dlogits in the logits' type);
// class weights, losses and statistics are fp32.
// CrossEntropy: one pass over the logits computes max, log-sum-exp and the row loss, and the row's
// statistics (m, s) = (max, log(sum(exp(x - max)))) when `stats` is set (the IR's Stats output, from
// which lp = (x - m) - s); with dlogits set, a second pass (from L2 for realistic row lengths) writes
// them. CrossEntropyGrad: dlogits from the logits and the forward's statistics in one pass (the
// backward keeps no log_prob). Sums over rows are fixed-order (bitwise reproducible).
// A label outside [0, classes) that is not ignore_index cannot be reported from the device: its
// row's loss is NaN (so is a reduced loss) and its dlogits row is zero.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

// Launchers for arguments the Status wrappers accept; instantiated for float and __nv_bfloat16.
template <typename T>
cudaError_t LaunchSoftmaxForward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream);
template <typename T>
cudaError_t LaunchSoftmaxBackward(const T* dy, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                                  cudaStream_t stream);

enum class LossReduction { kMean, kSum, kNone };

// L (label type) is int64_t or int32_t.
template <typename T, typename L>
struct CrossEntropyArgs {
  int64_t rows = 0;
  int64_t classes = 0;
  const T* logits = nullptr;      // (rows, classes)
  const L* labels = nullptr;      // (rows)
  const float* weights = nullptr; // (classes) optional class weights
  bool has_ignore_index = false;
  int64_t ignore_index = 0;
  float label_smoothing = 0.f;    // in [0, 1]
  LossReduction reduction = LossReduction::kMean;
  const float* dloss = nullptr;   // () for kMean/kSum, (rows) for kNone; null means 1
  float* loss = nullptr;          // () for kMean/kSum, (rows) for kNone; CrossEntropy only
  T* dlogits = nullptr;           // (rows, classes) optional (CrossEntropy), required (CrossEntropyGrad); may alias logits
  float* stats = nullptr;         // (rows, 2) CrossEntropy writes (m, s) per row when set; CrossEntropyGrad reads them
  float* workspace = nullptr;     // CrossEntropyWorkspaceBytes(rows) bytes
};

int64_t CrossEntropyWorkspaceBytes(int64_t rows);

template <typename T, typename L>
cudaError_t LaunchCrossEntropy(const CrossEntropyArgs<T, L>& args, cudaStream_t stream);
template <typename T, typename L>
cudaError_t LaunchCrossEntropyGrad(const CrossEntropyArgs<T, L>& args, cudaStream_t stream);

#ifndef __CUDACC__
// Check the arguments (InvalidArgument naming what was wrong and what was expected), then launch.
template <typename T>
absl::Status SoftmaxForward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream);
template <typename T>
absl::Status SoftmaxBackward(const T* dy, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                             cudaStream_t stream);
template <typename T, typename L>
absl::Status CrossEntropy(const CrossEntropyArgs<T, L>& args, cudaStream_t stream);
template <typename T, typename L>
absl::Status CrossEntropyGrad(const CrossEntropyArgs<T, L>& args, cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
