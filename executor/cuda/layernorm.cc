// Host-side argument checks of the LayerNorm/RMSNorm launchers (layernorm.h).
#include "executor/cuda/layernorm.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckShape(const char* fn, int64_t rows, int64_t d, float epsilon) {
  if (rows < 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": rows is ", rows, ", expected 0 <= rows < 2^31"));
  }
  if (d < 1 || d > kNormMaxD) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": d is ", d, ", expected 1 <= d <= ", kNormMaxD));
  }
  if (!std::isfinite(epsilon) || epsilon < 0) {
    return absl::InvalidArgumentError(absl::StrCat(fn, ": epsilon is ", epsilon, ", expected a finite value >= 0"));
  }
  return absl::OkStatus();
}

absl::Status Require(const char* fn, bool ok, const char* what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat(fn, ": ", what));
}

}  // namespace

template <typename T>
absl::Status NormForward(const NormForwardArgs<T>& a, cudaStream_t stream) {
  constexpr const char* kFn = "NormForward";
  RETURN_IF_ERROR(CheckShape(kFn, a.rows, a.d, a.epsilon));
  RETURN_IF_ERROR(Require(kFn, a.x != nullptr && a.gamma != nullptr && a.y != nullptr,
                          "x (rows, d), gamma (d) and y (rows, d) must be device pointers, got null"));
  RETURN_IF_ERROR(Require(kFn, a.residual != nullptr || (a.sum == nullptr && a.dropout == nullptr),
                          "sum and dropout need a residual: they are the fused add's output and its dropout"));
  if (a.kind == NormKind::kRmsNorm) {
    RETURN_IF_ERROR(Require(kFn, a.beta == nullptr && a.mean == nullptr, "RMSNorm takes no beta and writes no mean"));
  }
  CUDA_RETURN_IF_ERROR(LaunchNormForward(a, stream));
  return absl::OkStatus();
}

template <typename T>
absl::Status NormBackward(const NormBackwardArgs<T>& a, cudaStream_t stream) {
  constexpr const char* kFn = "NormBackward";
  RETURN_IF_ERROR(CheckShape(kFn, a.rows, a.d, a.epsilon));
  RETURN_IF_ERROR(Require(kFn, a.dy != nullptr && a.x != nullptr && a.gamma != nullptr && a.dx != nullptr,
                          "dy (rows, d), x (rows, d), gamma (d) and dx (rows, d) must be device pointers, got null"));
  if (a.kind == NormKind::kLayerNorm) {
    RETURN_IF_ERROR(Require(kFn, (a.mean == nullptr) == (a.rstd == nullptr),
                            "LayerNorm's saved statistics are mean and rstd together, or neither"));
  } else {
    RETURN_IF_ERROR(
        Require(kFn, a.mean == nullptr && a.dbeta == nullptr, "RMSNorm takes no saved mean and has no dbeta"));
  }
  RETURN_IF_ERROR(Require(kFn,
                          (a.dgamma == nullptr && a.dbeta == nullptr && a.dx_sums == nullptr) || a.workspace != nullptr,
                          "dgamma/dbeta/dx_sums need a workspace of NormBackwardWorkspaceBytes(rows, d) bytes"));
  RETURN_IF_ERROR(Require(kFn, !a.sums_of_dropped || a.dx_dropped != nullptr, "sums of dx_dropped need dx_dropped"));
  RETURN_IF_ERROR(Require(kFn, a.dx_dropped == nullptr || (a.dropout != nullptr && a.kind == NormKind::kLayerNorm),
                          "dx_dropped needs the dropout's parameters (LayerNorm only)"));
  CUDA_RETURN_IF_ERROR(LaunchNormBackward(a, stream));
  return absl::OkStatus();
}

template absl::Status NormForward<float>(const NormForwardArgs<float>&, cudaStream_t);
template absl::Status NormForward<__nv_bfloat16>(const NormForwardArgs<__nv_bfloat16>&, cudaStream_t);
template absl::Status NormBackward<float>(const NormBackwardArgs<float>&, cudaStream_t);
template absl::Status NormBackward<__nv_bfloat16>(const NormBackwardArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace onnxpipe::cuda
