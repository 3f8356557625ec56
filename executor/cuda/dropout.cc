// Host side of the dropout family: the CPU backend's stream parameters for a node and the checked
// Status wrappers.
#include "executor/cuda/dropout.h"

#include "executor/cpu/philox.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status CheckArgs(const char* what, const DropoutParams& p, ir::DType dtype, int64_t n,
                       std::initializer_list<const void*> ptrs) {
  if (!(p.ratio >= 0.0 && p.ratio <= 1.0)) {
    return INVALID_ARGUMENT() << what << ": ratio is " << p.ratio << ", expected [0, 1]";
  }
  if (dtype != ir::DType::kF32 && dtype != ir::DType::kBF16 && dtype != ir::DType::kF16) {
    return INVALID_ARGUMENT() << what << ": dtype " << ir::DTypeName(dtype) << " is not f32, bf16 or f16";
  }
  if (n < 0) return INVALID_ARGUMENT() << what << ": negative element count " << n;
  for (const void* ptr : ptrs) {
    if (n > 0 && ptr == nullptr) return INVALID_ARGUMENT() << what << ": null device pointer for " << n << " elements";
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DropoutParams> DropoutParamsFor(const ir::Node& node, bool training, uint64_t seed, uint64_t offset,
                                               int64_t row_offset, int64_t rows, int64_t numel) {
  DropoutParams p;
  p.training = training;
  const bool own = node.op == ir::OpKind::kDropout || node.op == ir::OpKind::kDropoutGrad;
  const char* attr = own ? "ratio" : "dropout";
  p.ratio = node.attrs.Get<double>(attr, own ? 0.5 : 0.0);
  if (!(p.ratio >= 0.0 && p.ratio <= 1.0)) {
    return INVALID_ARGUMENT() << "node '" << node.name << "': " << attr << " is " << p.ratio << ", expected [0, 1]";
  }
  const std::string key = node.attrs.Get<std::string>("rng_key", node.name);
  p.node_key = cpu::Fnv1a64(key.data(), key.size());
  p.seed = seed;
  p.offset = offset;
  if (rows > 0 && row_offset != 0) {
    if (numel % rows != 0) {
      return INVALID_ARGUMENT() << "node '" << node.name << "': its random stream is indexed by batch row, but "
                                << numel << " elements do not split into the micro-batch's " << rows << " rows";
    }
    p.counter_base = static_cast<uint64_t>(row_offset * (numel / rows));
  }
  return p;
}

absl::Status DropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask, int64_t n,
                            cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs("DropoutForward", p, dtype, n, {x, y}));
  CUDA_RETURN_IF_ERROR(LaunchDropoutForward(p, dtype, x, y, mask, n, stream));
  return absl::OkStatus();
}

absl::Status DropoutBackward(const DropoutParams& p, ir::DType dtype, const void* dy, const uint8_t* mask, void* dx,
                             int64_t n, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckArgs("DropoutBackward", p, dtype, n, {dy, dx}));
  CUDA_RETURN_IF_ERROR(LaunchDropoutBackward(p, dtype, dy, mask, dx, n, stream));
  return absl::OkStatus();
}

}  // namespace onnxpipe::cuda
