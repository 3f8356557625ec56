// Gather (any dtype; the embedding lookup), GatherGrad (f32 or bf16, the output dY's dtype, summed in fp32 and
// rounded once), GatherElements, GatherND and their gradients (gather_elements.h) in the CUDA backend's kernel table;
// indices on the device, or constants on the host (copied into the workspace). An index out of range is only seen on
// the device: the kernel raises a flag, the flag is read back (one small synchronising copy) and the op then runs on
// the host, where the CPU kernel reports the index exactly as it does on the CPU.
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/embedding.h"
#include "executor/cuda/gather_elements.h"

namespace onnxpipe::cuda {
namespace {

// Workspace: the flag's slot, then (for constant indices held on the host) the indices, then
// GatherGrad's sort scratch; each part 256-byte aligned.
constexpr int64_t kFlagBytes = 256;
int64_t Aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

bool IsIndex(ir::DType t) { return t == ir::DType::kI64 || t == ir::DType::kI32; }

// Bytes the indices take in the workspace: none when they are on the device.
int64_t HostIndexBytes(const ir::Tensor& idx) { return idx.on_host() ? Aligned(idx.num_bytes()) : 0; }

// The indices on the device: their own buffer, or a copy into `slot` of the workspace.
absl::StatusOr<const void*> DeviceIndices(const KernelContext& ctx, const ir::Tensor& idx, void* slot) {
  if (!idx.on_host()) return idx.device_raw();
  // Pageable source: the call returns once the bytes are staged.
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(slot, idx.raw(), idx.num_bytes(), cudaMemcpyHostToDevice, ctx.stream));
  return static_cast<const void*>(slot);
}

// Workspace for `node`'s indices (input 1) should they be held on the host: reserved whatever
// their placement, since only the run tells (they are small).
int64_t IndexBytes(const ir::Graph& g, const ir::Node& node) {
  const auto d = InputDims(g, node, 1);
  if (!d) return 0;
  int64_t n = 1;
  for (int64_t x : *d) n *= x;
  return Aligned(n * ir::DTypeSize(g.value(node.inputs[1]).dtype));
}

// True when the kernels flagged an index out of range.
absl::StatusOr<bool> FlagRaised(const KernelContext& ctx, const uint32_t* flag) {
  uint32_t host = 0;
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host, flag, sizeof(host), cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
  return host != 0;
}

KernelResult GatherKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& data = in[0];
  const ir::Tensor& idx = in[1];
  if (!IsIndex(idx.dtype()) || data.rank() == 0) return std::nullopt;
  absl::StatusOr<GatherShape> s = MakeGatherShape(data.dims(), node.attrs.Get<int64_t>("axis", 0), idx.num_elements());
  if (!s.ok()) return std::nullopt;
  int64_t axis = node.attrs.Get<int64_t>("axis", 0);
  if (axis < 0) axis += data.rank();
  std::vector<int64_t> dims(data.dims().begin(), data.dims().begin() + axis);
  dims.insert(dims.end(), idx.dims().begin(), idx.dims().end());
  dims.insert(dims.end(), data.dims().begin() + axis + 1, data.dims().end());
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, data.dtype(), dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  absl::StatusOr<void*> ws = ctx.Workspace(node, kFlagBytes + HostIndexBytes(idx));
  if (!ws.ok()) return ws.status();
  auto* flag = static_cast<uint32_t*>(*ws);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, sizeof(uint32_t), ctx.stream));
  absl::StatusOr<const void*> indices = DeviceIndices(ctx, idx, static_cast<uint8_t*>(*ws) + kFlagBytes);
  if (!indices.ok()) return indices.status();
  if (absl::Status st =
          cuda::Gather(*s, data.dtype(), data.device_raw(), idx.dtype(), *indices, out->device_raw(), flag, ctx.stream);
      !st.ok()) {
    return st;
  }
  absl::StatusOr<bool> bad = FlagRaised(ctx, flag);
  if (!bad.ok()) return bad.status();
  if (*bad) return std::nullopt;
  return std::vector<ir::Tensor>{*out};
}

// GatherGrad(dY, indices, like) attr axis: zeros like `like` with dY's rows added at indices.
KernelResult GatherGradKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& dy = in[0];
  const ir::Tensor& idx = in[1];
  const std::vector<int64_t>& dd = in[2].dims();
  if (!IsKernelFloat(dy.dtype()) || !IsIndex(idx.dtype()) || dd.empty()) return std::nullopt;
  absl::StatusOr<GatherShape> s = MakeGatherShape(dd, node.attrs.Get<int64_t>("axis", 0), idx.num_elements());
  if (!s.ok()) return std::nullopt;
  int64_t axis = node.attrs.Get<int64_t>("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(dd.size());
  std::vector<int64_t> expect(dd.begin(), dd.begin() + axis);
  expect.insert(expect.end(), idx.dims().begin(), idx.dims().end());
  expect.insert(expect.end(), dd.begin() + axis + 1, dd.end());
  if (dy.dims() != expect) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, dy.dtype(), dd);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0 || idx.num_elements() == 0) return std::vector<ir::Tensor>{*out};
  const int64_t sort_bytes = static_cast<int64_t>(GatherGradWorkspaceBytes(*s));
  const int64_t index_bytes = HostIndexBytes(idx);
  absl::StatusOr<void*> ws = ctx.Workspace(node, kFlagBytes + index_bytes + sort_bytes);
  if (!ws.ok()) return ws.status();
  auto* flag = static_cast<uint32_t*>(*ws);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, sizeof(uint32_t), ctx.stream));
  absl::StatusOr<const void*> indices = DeviceIndices(ctx, idx, static_cast<uint8_t*>(*ws) + kFlagBytes);
  if (!indices.ok()) return indices.status();
  if (absl::Status st = cuda::GatherGrad(
          *s, dy.dtype(), dy.device_raw(), idx.dtype(), *indices, dy.dtype(), out->device_raw(),
          /*accumulate=*/false, static_cast<uint8_t*>(*ws) + kFlagBytes + index_bytes, sort_bytes, flag, ctx.stream);
      !st.ok()) {
    return st;
  }
  absl::StatusOr<bool> bad = FlagRaised(ctx, flag);
  if (!bad.ok()) return bad.status();
  if (*bad) return std::nullopt;
  return std::vector<ir::Tensor>{*out};
}

int64_t GatherGradWorkspace(const ir::Graph& g, const ir::Node& node) {
  const auto idx = InputDims(g, node, 1), like = InputDims(g, node, 2);
  if (!idx || !like || like->empty()) return kFlagBytes;
  int64_t n = 1;
  for (int64_t d : *idx) n *= d;
  absl::StatusOr<GatherShape> s = MakeGatherShape(*like, node.attrs.Get<int64_t>("axis", 0), n);
  return kFlagBytes + IndexBytes(g, node) + (s.ok() ? static_cast<int64_t>(GatherGradWorkspaceBytes(*s)) : 0);
}

// GatherElements(data, indices) attr axis, and GatherElementsGrad(dY, indices, like): zeros like
// `like` with dY added where the forward read. Out-of-range indices: the flag, then the host.
KernelResult GatherElementsKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in,
                                  bool grad) {
  const ir::Tensor& src = in[0];
  const ir::Tensor& idx = in[1];
  if (!IsIndex(idx.dtype()) || (grad && !IsKernelFloat(src.dtype()))) return std::nullopt;
  const std::vector<int64_t>& data_dims = grad ? in[2].dims() : src.dims();
  absl::StatusOr<GatherElementsShape> s =
      MakeGatherElementsShape(data_dims, idx.dims(), node.attrs.Get<int64_t>("axis", 0));
  if (!s.ok() || (grad && src.dims() != idx.dims())) return std::nullopt;  // the CPU kernel names the problem
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, src.dtype(), grad ? data_dims : idx.dims());
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  absl::StatusOr<void*> ws = ctx.Workspace(node, kFlagBytes + HostIndexBytes(idx));
  if (!ws.ok()) return ws.status();
  auto* flag = static_cast<uint32_t*>(*ws);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, sizeof(uint32_t), ctx.stream));
  absl::StatusOr<const void*> indices = DeviceIndices(ctx, idx, static_cast<uint8_t*>(*ws) + kFlagBytes);
  if (!indices.ok()) return indices.status();
  const absl::Status st = grad ? GatherElementsGrad(*s, src.dtype(), src.device_raw(), idx.dtype(), *indices,
                                                    out->device_raw(), flag, ctx.stream)
                               : GatherElements(*s, src.dtype(), src.device_raw(), idx.dtype(), *indices,
                                                out->device_raw(), flag, ctx.stream);
  if (!st.ok()) return st;
  absl::StatusOr<bool> bad = FlagRaised(ctx, flag);
  if (!bad.ok()) return bad.status();
  if (*bad) return std::nullopt;
  return std::vector<ir::Tensor>{*out};
}

// GatherND(data, indices) attr batch_dims, and GatherNDGrad(dY, indices, like): zeros like `like`
// with dY's slices added where the forward read. Out-of-range indices: the flag, then the host.
KernelResult GatherNDKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in,
                            bool grad) {
  const ir::Tensor& src = in[0];
  const ir::Tensor& idx = in[1];
  if (!IsIndex(idx.dtype()) || (grad && !IsKernelFloat(src.dtype()))) return std::nullopt;
  const std::vector<int64_t>& data_dims = grad ? in[2].dims() : src.dims();
  std::vector<int64_t> out_dims;
  absl::StatusOr<GatherNDShape> s =
      MakeGatherNDShape(data_dims, idx.dims(), node.attrs.Get<int64_t>("batch_dims", 0), &out_dims);
  if (!s.ok() || (grad && src.dims() != out_dims)) return std::nullopt;  // the CPU kernel names the problem
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, src.dtype(), grad ? data_dims : out_dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  absl::StatusOr<void*> ws = ctx.Workspace(node, kFlagBytes + HostIndexBytes(idx));
  if (!ws.ok()) return ws.status();
  auto* flag = static_cast<uint32_t*>(*ws);
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(flag, 0, sizeof(uint32_t), ctx.stream));
  absl::StatusOr<const void*> indices = DeviceIndices(ctx, idx, static_cast<uint8_t*>(*ws) + kFlagBytes);
  if (!indices.ok()) return indices.status();
  const absl::Status st =
      grad ? GatherNDGrad(*s, out->num_elements(), src.dtype(), src.device_raw(), idx.dtype(), *indices,
                          out->device_raw(), flag, ctx.stream)
           : GatherND(*s, src.dtype(), src.device_raw(), idx.dtype(), *indices, out->device_raw(), flag, ctx.stream);
  if (!st.ok()) return st;
  absl::StatusOr<bool> bad = FlagRaised(ctx, flag);
  if (!bad.ok()) return bad.status();
  if (*bad) return std::nullopt;
  return std::vector<ir::Tensor>{*out};
}

}  // namespace

void RegisterEmbeddingKernels(KernelTable& table) {
  table[ir::OpKind::kGather] = {
      GatherKernel, [](const ir::Graph& g, const ir::Node& node) { return kFlagBytes + IndexBytes(g, node); },
      /*host_inputs=*/1u << 1, /*group=*/{}, /*host_bound=*/true};
  table[ir::OpKind::kGatherGrad] = {GatherGradKernel, GatherGradWorkspace, /*host_inputs=*/1u << 1, /*group=*/{},
                                    /*host_bound=*/true};
  const auto flag_and_indices = [](const ir::Graph& g, const ir::Node& node) {
    return kFlagBytes + IndexBytes(g, node);
  };
  table[ir::OpKind::kGatherElements] = {
      [](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return GatherElementsKernel(ctx, node, in, /*grad=*/false);
      },
      flag_and_indices, /*host_inputs=*/1u << 1, /*group=*/{}, /*host_bound=*/true};
  table[ir::OpKind::kGatherElementsGrad] = {
      [](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return GatherElementsKernel(ctx, node, in, /*grad=*/true);
      },
      flag_and_indices, /*host_inputs=*/1u << 1, /*group=*/{}, /*host_bound=*/true};
  table[ir::OpKind::kGatherND] = {
      [](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return GatherNDKernel(ctx, node, in, /*grad=*/false);
      },
      flag_and_indices, /*host_inputs=*/1u << 1, /*group=*/{}, /*host_bound=*/true};
  table[ir::OpKind::kGatherNDGrad] = {
      [](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
        return GatherNDKernel(ctx, node, in, /*grad=*/true);
      },
      flag_and_indices, /*host_inputs=*/1u << 1, /*group=*/{}, /*host_bound=*/true};
}

}  // namespace onnxpipe::cuda
