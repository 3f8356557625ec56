#include "executor/cuda/cuda_kernels.h"

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {

absl::StatusOr<ir::Tensor> KernelContext::Output(const ir::Node& node, int index, ir::DType dtype,
                                                 const std::vector<int64_t>& dims) const {
  if (outputs != nullptr) return outputs->Allocate(node, index, dtype, dims);
  return backend->Zeros(dtype, dims, exec.stream);
}

absl::StatusOr<ir::Tensor> KernelContext::FullOutput(const ir::Node& node, int index, ir::DType dtype,
                                                     const std::vector<int64_t>& dims) const {
  if (outputs != nullptr) return outputs->AllocateUninitialized(node, index, dtype, dims);
  return backend->Zeros(dtype, dims, exec.stream);
}

absl::StatusOr<void*> KernelContext::Workspace(const ir::Node& node, int64_t bytes) const {
  if (bytes <= 0) return nullptr;
  if (outputs != nullptr) return outputs->Workspace(node, bytes);
  if (temporaries == nullptr) return FAILED_PRECONDITION() << "no workspace for " << ir::OpName(node.op);
  void* p = nullptr;
  // Stream-ordered: the backend frees it on the same stream after the kernel's work.
  CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, static_cast<size_t>(bytes), stream));
  temporaries->push_back(p);
  return p;
}

std::optional<DropoutParams> FusedDropout(const KernelContext& ctx, const ir::Node& node, int64_t numel) {
  absl::StatusOr<DropoutParams> p = DropoutParamsFor(node, ctx.exec.training, ctx.exec.seed, ctx.exec.offset,
                                                     ctx.exec.row_offset, ctx.exec.rows, numel);
  if (!p.ok()) return std::nullopt;
  p->device_offset = ctx.exec.device_offset;
  return *p;
}

bool AllOfDType(const std::vector<ir::Tensor>& in, std::initializer_list<size_t> indices, ir::DType dtype) {
  for (size_t i : indices)
    if (HasInput(in, i) && in[i].dtype() != dtype) return false;
  return true;
}

std::optional<std::vector<int64_t>> InputDims(const ir::Graph& g, const ir::Node& node, size_t i) {
  if (i >= node.inputs.size() || node.inputs[i] == ir::kNoValue) return std::nullopt;
  const ir::Value& v = g.value(node.inputs[i]);
  if (!v.shape_known || !ir::IsConcrete(v.shape)) return std::nullopt;
  return ir::ToInts(v.shape);
}

KernelTable RegisterAllKernels(const CudaOptions& options, int device,
                               std::shared_ptr<AttentionRunCounts> attention_counts) {
  KernelTable table;
  RegisterGeluKernels(table);
  RegisterGemmKernels(table, options);
  RegisterNormKernels(table);
  RegisterSoftmaxKernels(table);
  RegisterElementwiseKernels(table);
  RegisterShapeKernels(table);
  RegisterEmbeddingKernels(table);
  RegisterDropoutKernels(table);
  RegisterOptimizerKernels(table);
  RegisterLayoutKernels(table);
  RegisterRotaryKernels(table);
  RegisterGatedActivationKernels(table);
  RegisterAttentionKernels(table, options, device, std::move(attention_counts));
  return table;
}

}  // namespace onnxpipe::cuda
