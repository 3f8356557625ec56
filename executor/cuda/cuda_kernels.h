// The CUDA backend's kernel table: for an op, a function that evaluates one node on device tensors
// on the context's stream, or reports (returns std::nullopt) that it has no kernel for these
// inputs' dtypes, so the backend runs the op on the host instead.
//
// Outputs come from KernelContext::Output (the planned slot under a planned executor, else a
// fresh device buffer), never from cudaMalloc; scratch comes from KernelContext::Workspace, whose
// size under a plan is what the entry's workspace function reported to the memory planner. Kernels are registered per
// family by one function each (RegisterGeluKernels, ...), which RegisterAllKernels calls: explicit, so no registration
// can be dropped by the linker.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/dropout.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::cuda {

struct KernelContext {
  const backend::Backend* backend = nullptr;
  cudaStream_t stream = nullptr;
  backend::ExecContext exec;
  ir::OutputAllocator* outputs = nullptr;  // null: fresh buffers
  bool allow_tf32 = false;                 // CudaOptions::allow_tf32
  // Unplanned scratch, released (stream-ordered, after the kernel) by the backend once the kernel
  // function returns.
  std::vector<void*>* temporaries = nullptr;
  // Output `index` of `node` on the device: the planned slot, or a fresh zero-filled buffer.
  absl::StatusOr<ir::Tensor> Output(const ir::Node& node, int index, ir::DType dtype,
                                    const std::vector<int64_t>& dims) const;
  // As Output, not zero-filled when planned (OutputAllocator::AllocateUninitialized): for kernels
  // that write every element of the output.
  absl::StatusOr<ir::Tensor> FullOutput(const ir::Node& node, int index, ir::DType dtype,
                                        const std::vector<int64_t>& dims) const;
  // `bytes` of device scratch for `node`, valid for the work issued on `stream` by this kernel:
  // the plan's workspace (OutputAllocator::Workspace) when planned, else a temporary buffer from
  // the stream-ordered allocator. Null for 0 bytes.
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) const;
};

// nullopt: no kernel for these inputs (the backend runs the CPU kernel on the host).
using KernelResult = std::optional<absl::StatusOr<std::vector<ir::Tensor>>>;
using CudaKernelFn =
    std::function<KernelResult(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& inputs)>;
// Scratch bytes the kernel takes from KernelContext::Workspace for `node` in `g`, from the
// graph's (bound, concrete) shapes; under a plan that reserved less, Workspace is an error naming
// the node, never an overrun.
using CudaWorkspaceFn = std::function<int64_t(const ir::Graph& g, const ir::Node& node)>;

// Several independent nodes of the entry's op at once (Backend::RunGroup), node i with inputs[i]:
// each node's outputs; nullopt when they cannot go together (the backend runs them one by one).
using GroupResult = std::optional<absl::StatusOr<std::vector<std::vector<ir::Tensor>>>>;
using CudaGroupFn = std::function<GroupResult(const KernelContext& ctx, const std::vector<const ir::Node*>& nodes,
                                              const std::vector<std::vector<ir::Tensor>>& inputs)>;

struct KernelEntry {
  CudaKernelFn run;
  CudaWorkspaceFn workspace;  // null: no scratch
  // Bit i set: input i may be a host tensor (a constant read as an attribute, e.g. Reshape's
  // shape); other inputs must be on the device or the op runs on the host.
  uint32_t host_inputs = 0;
  CudaGroupFn group = {};  // null: a group runs node by node
  // The kernel waits for the device (an index check read back) or copies from pageable host memory:
  // it cannot be captured into a graph (Backend::Capturable), it runs between graphs.
  bool host_bound = false;
};
using KernelTable = std::map<ir::OpKind, KernelEntry>;

// Optional input i is present (a `like` input counts, data or not).
inline bool HasInput(const std::vector<ir::Tensor>& in, size_t i) { return i < in.size() && in[i].defined(); }
// The node has output i (optional outputs nobody asked for are skipped).
inline bool WantsOutput(const ir::Node& node, size_t i) {
  return i < node.outputs.size() && node.outputs[i] != ir::kNoValue;
}
// Every present input among `indices` has dtype `dtype`.
bool AllOfDType(const std::vector<ir::Tensor>& in, std::initializer_list<size_t> indices, ir::DType dtype);

// The float dtypes the kernel families run: f32, and bf16 (computed in fp32, each output rounded
// once, as the CPU's fp32 kernel on widened inputs with its result rounded).
constexpr ir::DType kKernelFloats[] = {ir::DType::kF32, ir::DType::kBF16};
inline bool IsKernelFloat(ir::DType t) { return t == ir::DType::kF32 || t == ir::DType::kBF16; }
// Calls f(ElementTag<T>{}) with T = float for f32 and __nv_bfloat16 for bf16 (kKernelFloats);
// nullopt (the host runs the op) for any other dtype.
template <typename T>
struct ElementTag {
  using type = T;
};
template <typename F>
KernelResult WithFloatElement(ir::DType t, F&& f) {
  if (t == ir::DType::kF32) return f(ElementTag<float>{});
  if (t == ir::DType::kBF16) return f(ElementTag<__nv_bfloat16>{});
  return std::nullopt;
}
// A device tensor's buffer as T*; null for an absent tensor.
template <typename T>
T* DevicePtr(const ir::Tensor& t) {
  return t.defined() ? static_cast<T*>(t.device_raw()) : nullptr;
}

// The node's dropout (a Dropout's or DropoutGrad's `ratio`, or the fused attribute `dropout` of
// op.h; its random stream as the CPU kernel's, the step read from device memory when ctx has it
// there) over `numel` elements; nullopt where the CPU kernel would refuse it (it reports the error).
std::optional<DropoutParams> FusedDropout(const KernelContext& ctx, const ir::Node& node, int64_t numel);

// The concrete dims of `node`'s input `i` in `g`; nullopt when absent or not concrete.
std::optional<std::vector<int64_t>> InputDims(const ir::Graph& g, const ir::Node& node, size_t i);

void RegisterGeluKernels(KernelTable& table);
void RegisterGemmKernels(KernelTable& table, const CudaOptions& options = {});
void RegisterNormKernels(KernelTable& table);
void RegisterSoftmaxKernels(KernelTable& table);
void RegisterElementwiseKernels(KernelTable& table);
void RegisterShapeKernels(KernelTable& table);
void RegisterEmbeddingKernels(KernelTable& table);
void RegisterDropoutKernels(KernelTable& table);
void RegisterOptimizerKernels(KernelTable& table);
void RegisterLayoutKernels(KernelTable& table);
void RegisterRotaryKernels(KernelTable& table);
void RegisterGatedActivationKernels(KernelTable& table);
// Attention/AttentionGrad evaluations per implementation (CudaBackend::AttentionRuns).
struct AttentionRunCounts {
  std::atomic<int64_t> cudnn{0}, flash{0};
};
// `options.attention` picks the implementation; the cuDNN graphs live on GPU `device` and are
// owned by the registered entries (one cache per table, so per backend). `counts` may be null.
void RegisterAttentionKernels(KernelTable& table, const CudaOptions& options = {}, int device = 0,
                              std::shared_ptr<AttentionRunCounts> counts = nullptr);
KernelTable RegisterAllKernels(const CudaOptions& options = {}, int device = 0,
                               std::shared_ptr<AttentionRunCounts> attention_counts = nullptr);

}  // namespace onnxpipe::cuda
