// Reshape, Flatten, Squeeze, Unsqueeze, ReshapeLike and Identity (any dtype) in the CUDA backend's kernel
// table. The output dims (and every error) are the CPU kernel's own: it runs on a shape-only
// stand-in of the data (ir::Tensor::DimsOnly) with Reshape's shape values on the host. The
// result is a view of the device input when the plan says the output shares its buffer (or
// without a plan, as the CPU's ViewOutput does), else a device copy into the planned slot.
#include "executor/cuda/cuda_kernels.h"

namespace onnxpipe::cuda {

void RegisterShapeKernels(KernelTable& table) {
  const std::shared_ptr<const backend::Backend> cpu = backend::MakeCpuBackend();
  const CudaKernelFn view = [cpu](const KernelContext& ctx, const ir::Node& node,
                                  const std::vector<ir::Tensor>& in) -> KernelResult {
    if (!in[0].has_data()) return std::nullopt;
    std::vector<ir::Tensor> stand_in = in;
    stand_in[0] = ir::Tensor::DimsOnly(in[0].dtype(), in[0].dims());
    for (size_t i = 1; i < in.size(); ++i) {
      if (!in[i].has_data() || in[i].on_host()) continue;
      if (node.op == ir::OpKind::kReshape) {  // the shape operand's values: a small synchronising copy
        absl::StatusOr<ir::Tensor> h = ctx.backend->ToHost(in[i], ctx.exec.stream);
        if (!h.ok()) return h.status();
        stand_in[i] = *std::move(h);
      } else {  // `like` operands are read for their dims only
        stand_in[i] = ir::Tensor::DimsOnly(in[i].dtype(), in[i].dims());
      }
    }
    backend::ExecContext host = ctx.exec;
    host.device_offset = nullptr;  // device memory; shape ops draw no random numbers
    host.stream = nullptr;
    absl::StatusOr<std::vector<ir::Tensor>> shaped = cpu->Run(node, stand_in, host, nullptr);
    if (!shaped.ok()) return shaped.status();
    const std::vector<int64_t>& dims = (*shaped)[0].dims();
    if (ctx.outputs == nullptr || ctx.outputs->SharesInputBuffer(node, 0)) {
      return std::vector<ir::Tensor>{in[0].Reshaped(dims)};
    }
    absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, in[0].dtype(), dims);
    if (!out.ok()) return out.status();
    if (const absl::Status st = ctx.backend->Copy(in[0].Reshaped(dims), *out, ctx.exec.stream); !st.ok()) return st;
    return std::vector<ir::Tensor>{*out};
  };
  table[ir::OpKind::kReshape] = {view, nullptr, /*host_inputs=*/1u << 1};
  for (ir::OpKind op : {ir::OpKind::kFlatten, ir::OpKind::kSqueeze, ir::OpKind::kUnsqueeze, ir::OpKind::kReshapeLike,
                        ir::OpKind::kIdentity})
    table[op].run = view;
}

}  // namespace onnxpipe::cuda
