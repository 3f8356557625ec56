#include "executor/cuda/cuda_kernels.h"

#include "frontend/ir/status.h"

namespace onnxpipe::cuda {

absl::StatusOr<ir::Tensor> KernelContext::Output(const ir::Node& node, int index, ir::DType dtype,
                                                 const std::vector<int64_t>& dims) const {
  if (outputs != nullptr) return outputs->Allocate(node, index, dtype, dims);
  return backend->Zeros(dtype, dims, exec.stream);
}

KernelTable RegisterAllKernels() {
  KernelTable table;
  RegisterGeluKernels(table);
  return table;
}

}  // namespace onnxpipe::cuda
