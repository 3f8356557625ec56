// Host-side argument checks of the softmax and cross-entropy launchers (softmax.h).
#include "executor/cuda/softmax.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckRows(const char* fn, int64_t rows, const char* len_name, int64_t len, int64_t min_len) {
  if (rows < 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": rows is ", rows, ", expected 0 <= rows < 2^31"));
  }
  if (len < min_len) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": ", len_name, " is ", len, ", expected >= ", min_len));
  }
  return absl::OkStatus();
}

absl::Status Require(const char* fn, bool ok, const char* what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat(fn, ": ", what));
}

}  // namespace

template <typename T>
absl::Status SoftmaxForward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRows("SoftmaxForward", rows, "n", n, 0));
  RETURN_IF_ERROR(Require("SoftmaxForward", rows * n == 0 || (x != nullptr && y != nullptr),
                          "x and y (rows, n) must be device pointers, got null"));
  CUDA_RETURN_IF_ERROR(LaunchSoftmaxForward(x, y, rows, n, log, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status SoftmaxBackward(const T* dy, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                             cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRows("SoftmaxBackward", rows, "n", n, 0));
  RETURN_IF_ERROR(Require("SoftmaxBackward", rows * n == 0 || (dy != nullptr && y != nullptr && dx != nullptr),
                          "dy, y and dx (rows, n) must be device pointers, got null"));
  CUDA_RETURN_IF_ERROR(LaunchSoftmaxBackward(dy, y, dx, rows, n, log, stream));
  return absl::OkStatus();
}

template <typename T, typename L>
absl::Status CrossEntropy(const CrossEntropyArgs<T, L>& a, cudaStream_t stream) {
  constexpr const char* kFn = "CrossEntropy";
  RETURN_IF_ERROR(CheckRows(kFn, a.rows, "classes", a.classes, 1));
  RETURN_IF_ERROR(Require(kFn, a.logits != nullptr && a.labels != nullptr,
                          "logits (rows, classes) and labels (rows) must be device pointers, got null"));
  RETURN_IF_ERROR(Require(kFn, a.loss != nullptr,
                          "loss must be a device pointer: () for mean/sum, (rows) for reduction none"));
  RETURN_IF_ERROR(Require(kFn, a.workspace != nullptr,
                          "workspace must hold CrossEntropyWorkspaceBytes(rows) bytes, got null"));
  if (!(a.label_smoothing >= 0.f && a.label_smoothing <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": label_smoothing is ", a.label_smoothing, ", expected a value in [0, 1]"));
  }
  CUDA_RETURN_IF_ERROR(LaunchCrossEntropy(a, stream));
  return absl::OkStatus();
}

template <typename T, typename L>
absl::Status CrossEntropyGrad(const CrossEntropyArgs<T, L>& a, cudaStream_t stream) {
  constexpr const char* kFn = "CrossEntropyGrad";
  RETURN_IF_ERROR(CheckRows(kFn, a.rows, "classes", a.classes, 1));
  RETURN_IF_ERROR(Require(kFn, a.logits != nullptr && a.labels != nullptr && a.dlogits != nullptr,
                          "logits (rows, classes), labels (rows) and dlogits (rows, classes) must be device pointers, "
                          "got null"));
  RETURN_IF_ERROR(Require(kFn, a.stats != nullptr, "stats (rows, 2), the forward's, must be a device pointer, got null"));
  RETURN_IF_ERROR(Require(kFn, a.dloss != nullptr,
                          "dloss must be a device pointer: () for mean/sum, (rows) for reduction none"));
  RETURN_IF_ERROR(Require(kFn, a.workspace != nullptr,
                          "workspace must hold CrossEntropyWorkspaceBytes(rows) bytes, got null"));
  if (!(a.label_smoothing >= 0.f && a.label_smoothing <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFn, ": label_smoothing is ", a.label_smoothing, ", expected a value in [0, 1]"));
  }
  CUDA_RETURN_IF_ERROR(LaunchCrossEntropyGrad(a, stream));
  return absl::OkStatus();
}

#define ONNXPIPE_SOFTMAX_INSTANTIATE(T)                                                                    \
  template absl::Status SoftmaxForward<T>(const T*, T*, int64_t, int64_t, bool, cudaStream_t);           \
  template absl::Status SoftmaxBackward<T>(const T*, const T*, T*, int64_t, int64_t, bool, cudaStream_t); \
  template absl::Status CrossEntropy<T, int64_t>(const CrossEntropyArgs<T, int64_t>&, cudaStream_t);     \
  template absl::Status CrossEntropy<T, int32_t>(const CrossEntropyArgs<T, int32_t>&, cudaStream_t);     \
  template absl::Status CrossEntropyGrad<T, int64_t>(const CrossEntropyArgs<T, int64_t>&, cudaStream_t); \
  template absl::Status CrossEntropyGrad<T, int32_t>(const CrossEntropyArgs<T, int32_t>&, cudaStream_t);
ONNXPIPE_SOFTMAX_INSTANTIATE(float)
ONNXPIPE_SOFTMAX_INSTANTIATE(__nv_bfloat16)
#undef ONNXPIPE_SOFTMAX_INSTANTIATE

}  // namespace onnxpipe::cuda
