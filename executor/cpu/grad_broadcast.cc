// Backward kernels of broadcasting and reshaping: Sum (gradient accumulation), ReduceToShapeOf,
// ExpandLike, ReshapeLike, ZerosLike. `like` operands are read for their dims only.
#include "executor/cpu/grad_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

absl::Status CheckSameDType(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t count) {
  for (size_t i = 1; i < count && i < in.size(); ++i) {
    if (!in[i].defined()) return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is absent";
    if (in[i].dtype() != in[0].dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has dtype "
                                << ir::DTypeName(in[i].dtype()) << ", expected " << ir::DTypeName(in[0].dtype());
    }
  }
  return absl::OkStatus();
}

// Sum: broadcast inputs added left to right (a fixed order: results do not depend on threads).
Outputs SumKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(CheckSameDType(node, in, in.size()));
  std::vector<std::vector<int64_t>> shapes;
  for (const ir::Tensor& t : in) shapes.push_back(t.dims());
  ASSIGN_OR_RETURN(std::vector<int64_t> out_dims, BroadcastDims(node, shapes));
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, StridedCopyOutput(node, ctx, 0, in[0], out_dims,
                                                       BroadcastStrides(in[0].dims(), out_dims.size()), 0));
    T* po = out.mutable_data<T>();
    for (size_t i = 1; i < in.size(); ++i) {
      const T* pi = in[i].data<T>();
      StridedLoop loop(out_dims, {BroadcastStrides(in[i].dims(), out_dims.size())});
      loop.Run([&](int64_t o, const int64_t* off, int64_t len, const int64_t* step) {
        for (int64_t j = 0; j < len; ++j) po[o + j] += pi[off[0] + j * step[0]];
      });
    }
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kSum, SumKernel);

Outputs ReduceToShapeOfKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  // Nothing to reduce: a copy (ReduceToShapeOf is no view op for the planner).
  if (in[0].dims() == in[1].dims()) {
    ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, in[0], in[0].dims()));
    return std::vector<ir::Tensor>{out};
  }
  ASSIGN_OR_RETURN(ir::Tensor out, ReduceToDims(node, ctx, 0, in[0], in[1].dims()));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kReduceToShapeOf, ReduceToShapeOfKernel);

// ExpandLike: x with size-1 dims inserted at `axes`, broadcast to like's dims, optionally divided
// by the broadcast factor (ReduceMean's gradient).
Outputs ExpandLikeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  const std::vector<int64_t>& target = in[1].dims();
  std::vector<int64_t> xd = x.dims();
  const std::vector<int64_t> raw = node.attrs.Get<std::vector<int64_t>>("axes");
  if (!raw.empty()) {
    const int64_t out_rank = x.rank() + static_cast<int64_t>(raw.size());
    ASSIGN_OR_RETURN(std::vector<int64_t> axes, NormalizeAxes(node, raw, out_rank));
    std::sort(axes.begin(), axes.end());
    for (int64_t ax : axes) xd.insert(xd.begin() + ax, 1);
  }
  auto bd = BroadcastDims(node, {xd, target});
  if (!bd.ok() || *bd != target) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << DimsToString(xd) << " does not broadcast to "
                              << DimsToString(target);
  }
  const bool mean = node.attrs.Get<int64_t>("mean", 0) != 0;
  int64_t nt = 1;
  for (int64_t d : target) nt *= d;
  const double scale = mean && nt > 0 ? static_cast<double>(x.num_elements()) / static_cast<double>(nt) : 1.0;
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), target));
    if (out.num_elements() == 0) return std::vector<ir::Tensor>{out};
    const T* px = x.data<T>();
    T* po = out.mutable_data<T>();
    const T s = static_cast<T>(scale);
    StridedLoop loop(target, {BroadcastStrides(xd, target.size())});
    loop.Run([&](int64_t o, const int64_t* off, int64_t len, const int64_t* step) {
      for (int64_t j = 0; j < len; ++j) po[o + j] = px[off[0] + j * step[0]] * s;
    });
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kExpandLike, ExpandLikeKernel);

Outputs ReshapeLikeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  int64_t n = 1;
  for (int64_t d : in[1].dims()) n *= d;
  if (n != in[0].num_elements()) {
    return INVALID_ARGUMENT() << Describe(node) << ": cannot reshape " << DimsToString(in[0].dims())
                              << " to " << DimsToString(in[1].dims());
  }
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, in[0], in[1].dims()));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kReshapeLike, ReshapeLikeKernel);

Outputs ZerosLikeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kZerosLike, ZerosLikeKernel);

}  // namespace
}  // namespace onnxpipe::cpu
