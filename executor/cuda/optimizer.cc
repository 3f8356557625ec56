// Host side of the optimizer family: the fp32 step scalars (rounded from double as the CPU
// kernels round them) and the checked Status wrappers.
#include "executor/cuda/optimizer.h"

#include <cmath>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckTensors(const char* what, const std::vector<OptimizerTensor>& tensors, bool needs_state0,
                          bool needs_state1) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensor& t = tensors[i];
    if (t.n < 0) return INVALID_ARGUMENT() << what << ": tensor " << i << " has negative element count " << t.n;
    if (t.n == 0) continue;
    if (t.param == nullptr || t.grad == nullptr) {
      return INVALID_ARGUMENT() << what << ": tensor " << i << " lacks its param or grad pointer";
    }
    if ((needs_state0 && t.state0 == nullptr) || (needs_state1 && t.state1 == nullptr)) {
      return INVALID_ARGUMENT() << what << ": tensor " << i << " lacks its optimizer state ("
                                << (needs_state1 ? "m and v" : "momentum buffer") << ")";
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const OptimizerTensor& t = tensors[i];
    if ((t.sum_squares != nullptr) != (tensors[0].sum_squares != nullptr)) {
      return INVALID_ARGUMENT() << what << ": tensor " << i << (t.sum_squares != nullptr ? " asks" : " does not ask")
                                << " for its gradient's sum of squares, unlike tensor 0 (all or none)";
    }
    if (t.sum_squares != nullptr && t.sum_partials == nullptr && t.n > 0) {
      return INVALID_ARGUMENT() << what << ": tensor " << i
                                << " asks for its sum of squares without partials workspace";
    }
  }
  return absl::OkStatus();
}

}  // namespace

SgdScalars MakeSgdScalars(double lr, double momentum, double weight_decay, bool nesterov) {
  SgdScalars s;
  s.neg_lr = static_cast<float>(-lr);
  s.weight_decay = static_cast<float>(weight_decay);
  s.momentum = static_cast<float>(momentum);
  s.use_weight_decay = weight_decay != 0;
  s.use_momentum = momentum != 0;
  s.nesterov = nesterov;
  return s;
}

absl::Status SgdStep(const std::vector<OptimizerTensor>& tensors, double lr, double momentum, double weight_decay,
                     bool nesterov, const float* scale, cudaStream_t stream) {
  if (nesterov && momentum == 0) return INVALID_ARGUMENT() << "SgdStep: nesterov needs a non-zero momentum";
  RETURN_IF_ERROR(CheckTensors("SgdStep", tensors, /*needs_state0=*/momentum != 0, /*needs_state1=*/false));
  CUDA_RETURN_IF_ERROR(LaunchSgdStep(tensors.data(), static_cast<int>(tensors.size()),
                                     MakeSgdScalars(lr, momentum, weight_decay, nesterov), nullptr, scale, stream));
  return absl::OkStatus();
}

absl::Status AdamWStep(const std::vector<OptimizerTensor>& tensors, double lr, int64_t step, double beta1, double beta2,
                       double eps, double weight_decay, const float* scale, cudaStream_t stream) {
  if (step < 1) return INVALID_ARGUMENT() << "AdamWStep: step must be >= 1 (1-based update count), got " << step;
  RETURN_IF_ERROR(CheckTensors("AdamWStep", tensors, /*needs_state0=*/true, /*needs_state1=*/true));
  CUDA_RETURN_IF_ERROR(LaunchAdamWStep(tensors.data(), static_cast<int>(tensors.size()),
                                       MakeAdamWScalars(lr, step, beta1, beta2, eps, weight_decay), nullptr, scale,
                                       stream));
  return absl::OkStatus();
}

absl::Status SgdStepWithDeviceScalars(const std::vector<OptimizerTensor>& tensors, const SgdScalars& flags,
                                      const SgdScalars* device_scalars, const float* scale, cudaStream_t stream) {
  if (device_scalars == nullptr) return INVALID_ARGUMENT() << "SgdStepWithDeviceScalars: null device scalars";
  if (flags.nesterov && !flags.use_momentum) {
    return INVALID_ARGUMENT() << "SgdStepWithDeviceScalars: nesterov needs a non-zero momentum";
  }
  RETURN_IF_ERROR(CheckTensors("SgdStepWithDeviceScalars", tensors, flags.use_momentum, /*needs_state1=*/false));
  CUDA_RETURN_IF_ERROR(
      LaunchSgdStep(tensors.data(), static_cast<int>(tensors.size()), flags, device_scalars, scale, stream));
  return absl::OkStatus();
}

absl::Status AdamWStepWithDeviceScalars(const std::vector<OptimizerTensor>& tensors, const AdamWScalars* device_scalars,
                                        const float* scale, cudaStream_t stream) {
  if (device_scalars == nullptr) return INVALID_ARGUMENT() << "AdamWStepWithDeviceScalars: null device scalars";
  RETURN_IF_ERROR(CheckTensors("AdamWStepWithDeviceScalars", tensors, /*needs_state0=*/true, /*needs_state1=*/true));
  CUDA_RETURN_IF_ERROR(
      LaunchAdamWStep(tensors.data(), static_cast<int>(tensors.size()), AdamWScalars{}, device_scalars, scale, stream));
  return absl::OkStatus();
}

static_assert(sizeof(SgdScalars) <= kStepScalarsBytes && sizeof(AdamWScalars) <= kStepScalarsBytes);

absl::Status SgdStepOnDevice(const std::vector<OptimizerTensor>& tensors, const double* lr, double momentum,
                             double weight_decay, bool nesterov, const float* scale, void* scalars,
                             cudaStream_t stream) {
  if (lr == nullptr || scalars == nullptr) return INVALID_ARGUMENT() << "SgdStepOnDevice: null lr or scalars";
  const SgdScalars flags = MakeSgdScalars(0, momentum, weight_decay, nesterov);
  auto* s = static_cast<SgdScalars*>(scalars);
  CUDA_RETURN_IF_ERROR(LaunchSgdScalars(lr, flags, s, stream));
  return SgdStepWithDeviceScalars(tensors, flags, s, scale, stream);
}

absl::Status AdamWStepOnDevice(const std::vector<OptimizerTensor>& tensors, const double* lr, const int64_t* step,
                               double beta1, double beta2, double eps, double weight_decay, const float* scale,
                               void* scalars, cudaStream_t stream) {
  if (lr == nullptr || step == nullptr || scalars == nullptr) {
    return INVALID_ARGUMENT() << "AdamWStepOnDevice: null lr, step or scalars";
  }
  auto* s = static_cast<AdamWScalars*>(scalars);
  CUDA_RETURN_IF_ERROR(LaunchAdamWScalars(lr, step, beta1, beta2, eps, weight_decay, s, stream));
  return AdamWStepWithDeviceScalars(tensors, s, scale, stream);
}

namespace {

absl::Status CheckSumSquares(const char* fn, const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                             void* workspace, size_t workspace_bytes) {
  if (grads.size() != sizes.size()) {
    return INVALID_ARGUMENT() << fn << ": " << grads.size() << " gradients but " << sizes.size() << " sizes";
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    if (sizes[i] < 0) return INVALID_ARGUMENT() << fn << ": gradient " << i << " has negative size " << sizes[i];
    if (sizes[i] > 0 && grads[i] == nullptr) return INVALID_ARGUMENT() << fn << ": gradient " << i << " is null";
  }
  const size_t need = SumSquaresWorkspaceBytes(sizes);
  if (workspace == nullptr || workspace_bytes < need) {
    return INVALID_ARGUMENT() << fn << ": workspace of " << workspace_bytes << " bytes, needs " << need;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SumSquaresBySegment(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes,
                                 const std::vector<int>& segment_ends, const std::vector<void*>& outs, bool f64_out,
                                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSumSquares("SumSquaresBySegment", grads, sizes, workspace, workspace_bytes));
  if (segment_ends.size() != outs.size()) {
    return INVALID_ARGUMENT() << "SumSquaresBySegment: " << segment_ends.size() << " segments but " << outs.size()
                              << " outputs";
  }
  for (size_t j = 0; j < segment_ends.size(); ++j) {
    const int before = j == 0 ? 0 : segment_ends[j - 1];
    if (segment_ends[j] < before || segment_ends[j] > static_cast<int>(grads.size()) || outs[j] == nullptr) {
      return INVALID_ARGUMENT() << "SumSquaresBySegment: segment " << j << " ends at " << segment_ends[j]
                                << " (after " << before << ", of " << grads.size() << " gradients) or has no output";
    }
  }
  CUDA_RETURN_IF_ERROR(LaunchSumSquares(grads.data(), sizes.data(), static_cast<int>(grads.size()),
                                        segment_ends.data(), outs.data(), static_cast<int>(outs.size()), f64_out,
                                        nullptr, 0, 0, workspace, stream));
  return absl::OkStatus();
}

absl::Status GradNorm(const std::vector<const float*>& grads, const std::vector<int64_t>& sizes, float* sum_squares,
                      float* clip_scale, double max_norm, double eps, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSumSquares("GradNorm", grads, sizes, workspace, workspace_bytes));
  if (sum_squares == nullptr) return INVALID_ARGUMENT() << "GradNorm: null sum_squares output";
  if (clip_scale != nullptr && !(max_norm > 0)) {
    return INVALID_ARGUMENT() << "GradNorm: max_norm must be positive, got " << max_norm;
  }
  const int end = static_cast<int>(grads.size());
  void* out = sum_squares;
  CUDA_RETURN_IF_ERROR(LaunchSumSquares(grads.data(), sizes.data(), end, &end, &out, 1, /*f64_out=*/false, clip_scale,
                                        static_cast<float>(max_norm), static_cast<float>(eps), workspace, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
