// The CUDA backend's kernel table: for an op, a function that evaluates one node on device tensors
// on the context's stream, or reports (returns std::nullopt) that it has no kernel for these
// inputs' dtypes, so the backend runs the op on the host instead.
//
// Outputs come from KernelContext::Output (the planned slot under a planned executor, else a
// fresh device buffer), never from cudaMalloc. Kernels are registered per family by one function
// each (RegisterGeluKernels, ...), which RegisterAllKernels calls: explicit, so no registration
// can be dropped by the linker.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::cuda {

struct KernelContext {
  const backend::Backend* backend = nullptr;
  cudaStream_t stream = nullptr;
  backend::ExecContext exec;
  ir::OutputAllocator* outputs = nullptr;  // null: fresh buffers
  // Output `index` of `node` on the device: the planned slot, or a fresh zero-filled buffer.
  absl::StatusOr<ir::Tensor> Output(const ir::Node& node, int index, ir::DType dtype,
                                    const std::vector<int64_t>& dims) const;
};

using CudaKernelFn = std::function<std::optional<absl::StatusOr<std::vector<ir::Tensor>>>(
    const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& inputs)>;
using KernelTable = std::map<ir::OpKind, CudaKernelFn>;

void RegisterGeluKernels(KernelTable& table);
KernelTable RegisterAllKernels();

}  // namespace onnxpipe::cuda
