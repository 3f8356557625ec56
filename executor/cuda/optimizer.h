// Fused multi-tensor optimizer steps over fp32 master weights on the GPU, with the semantics of
// the CPU backend's optimizer ops (frontend/ir/op.h: SGDUpdate, AdamWUpdate, SumSquares,
// SumScalars, ClipScale; executor/cpu/optimizer_kernels.cc): the host combines the scalar hyper-parameters in
// double and rounds them to fp32, and every tensor op of the update is one fp32 rounding in the
// CPU kernel's order (no fused multiply-add), so a step equals the CPU's bit for bit up to libm.
//
// Unlike the CPU ops (which return new tensors), the steps update param and state in place. Each
// launch covers many tensors; a tensor may have any element count.
//   SGD:   d = g*scale + wd*p; buf = momentum*buf + d; d = nesterov ? d + momentum*buf : buf;
//          p = p - lr*d   (buf only when momentum != 0).
//   AdamW: p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//          p -= lr/(1-b1^step) * m / (sqrt(v)/sqrt(1-b2^step) + eps).
// `scale` is an optional device fp32 scalar multiplied into every gradient (the clipping factor);
// `param_bf16`, when set, receives the updated parameter rounded to bf16 (the compute copy).
// CUDA graphs: a captured step bakes its arguments in, so the per-step scalars (lr, step) can
// instead live in device memory (`device_scalars`, a Make*Scalars result copied there before each
// replay); SGD still takes its flags (momentum/weight decay on, nesterov) from the host struct.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#ifndef __CUDACC__
#include "absl/status/status.h"
#endif

namespace onnxpipe::cuda {

struct OptimizerTensor {
  float* param = nullptr;       // (n) fp32 master weights, updated in place
  const float* grad = nullptr;  // (n) fp32 gradient
  float* state0 = nullptr;      // (n) SGD momentum buffer (momentum != 0) | AdamW m
  float* state1 = nullptr;      // (n) AdamW v; unused by SGD
  void* param_bf16 = nullptr;   // (n) bf16 copy of the updated param, optional
  // The values before the step when they are not in param / state0 / state1 (an optimizer node's
  // inputs, its outputs in other buffers): read there, written to the above. Null: in place.
  const float* param_in = nullptr;
  const float* state0_in = nullptr;
  const float* state1_in = nullptr;
  // Optional (every tensor of a step or none): *sum_squares = the sum of grad^2 (unscaled) in double, formed as the
  // step reads the gradient, in LaunchSumSquares' order (the same bits as its one-tensor segment where every pointer
  // is 16-byte aligned); sum_partials is workspace for NormChunks(n) doubles.
  double* sum_squares = nullptr;
  double* sum_partials = nullptr;
  int64_t n = 0;
};
// The partial sums a tensor of n elements takes in a sum of squares (sum_partials, LaunchSumSquares' workspace).
int64_t NormChunks(int64_t n);

// fp32 scalars of a step, rounded from double exactly as the CPU kernels round them.
struct SgdScalars {
  float neg_lr, weight_decay, momentum;
  bool use_weight_decay, use_momentum, nesterov;
};
struct AdamWScalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
};
SgdScalars MakeSgdScalars(double lr, double momentum, double weight_decay, bool nesterov);
// torch.optim.AdamW's Python-side scalars, in double, then rounded once (on the host, or on the
// device from a device lr and step).
__host__ __device__ inline AdamWScalars MakeAdamWScalars(double lr, int64_t step, double beta1, double beta2, double eps,
                                                         double weight_decay) {
  const double bias_correction1 = 1 - pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - pow(beta2, static_cast<double>(step));
  AdamWScalars s;
  s.decay = static_cast<float>(1 - lr * weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}
// Device bytes the step scalars take when made on the device (SgdStepOnDevice, AdamWStepOnDevice).
constexpr size_t kStepScalarsBytes = 64;

// device_scalars may be null (use s).
cudaError_t LaunchSgdStep(const OptimizerTensor* tensors, int num_tensors, const SgdScalars& s,
                          const SgdScalars* device_scalars, const float* scale, cudaStream_t stream);
cudaError_t LaunchAdamWStep(const OptimizerTensor* tensors, int num_tensors, const AdamWScalars& s,
                            const AdamWScalars* device_scalars, const float* scale, cudaStream_t stream);
// *out = the step scalars from the device lr (f64) and step (i64), with the other fields from `flags`/
// the hyper-parameters: one thread, stream-ordered before the step that reads them.
cudaError_t LaunchSgdScalars(const double* lr, const SgdScalars& flags, SgdScalars* out, cudaStream_t stream);
cudaError_t LaunchAdamWScalars(const double* lr, const int64_t* step, double beta1, double beta2, double eps,
                               double weight_decay, AdamWScalars* out, cudaStream_t stream);
// *out = min(1, max_norm / (*norm + eps)) in fp32, NaN passing through (ClipScale).
cudaError_t LaunchClipScale(const float* norm, float max_norm, float eps, float* out, cudaStream_t stream);

// Sums of squares (SumSquares): segment j covers the tensors [segment_ends[j - 1], segment_ends[j]) and
// *outs[j] = the sum of g^2 over their elements, accumulated in double in a fixed order (per chunk, then
// the segment's chunks by a fixed tree) and written as double (f64_out) or rounded to fp32. With one
// fp32 segment and clip_scale set, *clip_scale = min(1, max_norm / (sqrtf(sum) + eps)) in fp32 (Sqrt then
// ClipScale; NaN passes through). The workspace holds one double per chunk of every tensor.
size_t SumSquaresWorkspaceBytes(const std::vector<int64_t>& sizes);
cudaError_t LaunchSumSquares(const float* const* grads, const int64_t* sizes, int num_tensors, const int* segment_ends,
                             void* const* outs, int num_segments, bool f64_out, float* clip_scale, float max_norm,
                             float eps, void* workspace, cudaStream_t stream);
// SumScalars: *out = ((0 + *terms[0]) + *terms[1]) + ... in double, in order, written as double (f64_out)
// or rounded to fp32; `carry` is one device double (the running total between launches of many terms).
cudaError_t LaunchSumScalars(const double* const* terms, int num_terms, void* out, bool f64_out, double* carry,
                             cudaStream_t stream);

#ifndef __CUDACC__
// lr: the step's learning rate; step: the 1-based update count including this one.
absl::Status SgdStep(const std::vector<OptimizerTensor>& tensors, double lr, double momentum, double weight_decay,
                     bool nesterov, const float* scale, cudaStream_t stream);
absl::Status AdamWStep(const std::vector<OptimizerTensor>& tensors, double lr, int64_t step, double beta1, double beta2,
                       double eps, double weight_decay, const float* scale, cudaStream_t stream);
// The CUDA-graph forms: the values are read from device_scalars when the kernels run; SGD's
// flags (and so which state each tensor needs) come from `flags`.
absl::Status SgdStepWithDeviceScalars(const std::vector<OptimizerTensor>& tensors, const SgdScalars& flags,
                                      const SgdScalars* device_scalars, const float* scale, cudaStream_t stream);
absl::Status AdamWStepWithDeviceScalars(const std::vector<OptimizerTensor>& tensors, const AdamWScalars* device_scalars,
                                        const float* scale, cudaStream_t stream);
// As SgdStep and AdamWStep with lr (and step) read from device memory when the kernels run, so a
// captured step replays with each step's values: the scalars are made on the device into
// `scalars` (kStepScalarsBytes, 16-byte aligned device memory), then the step reads them.
absl::Status SgdStepOnDevice(const std::vector<OptimizerTensor>& tensors, const double* lr, double momentum,
                             double weight_decay, bool nesterov, const float* scale, void* scalars,
                             cudaStream_t stream);
absl::Status AdamWStepOnDevice(const std::vector<OptimizerTensor>& tensors, const double* lr, const int64_t* step,
                               double beta1, double beta2, double eps, double weight_decay, const float* scale,
                               void* scalars, cudaStream_t stream);
// LaunchSumSquares with its arguments checked; max_norm > 0 is required when clip_scale is set (eps as
// ClipScale's, default 1e-6).
absl::Status SumSquaresBySegment(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                                 const std::vector<int>& segment_ends, const std::vector<void*>& outs, bool f64_out,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream);
// The global norm's sum of squares of every gradient as one fp32 segment, and optionally the clip factor.
absl::Status GradNorm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes, float* sum_squares,
                      float* clip_scale, double max_norm, double eps, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);
#endif

}  // namespace onnxpipe::cuda
