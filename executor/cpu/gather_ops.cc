// GatherElements and GatherND, forward and backward: the index ops of transformers' mask code
// (and of RoBERTa's position ids). The forward kernels move raw elements, so one byte-size
// instantiation serves every dtype; indices are i64 or i32, negative ones count from the end, and
// every index is checked before anything is read or written (an out-of-range index is an error,
// never an access out of bounds). Forward and backward share the index -> offset computation.
#include <cstring>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

absl::Status ExpectIndices(const ir::Node& node, const ir::Tensor& indices) {
  if (indices.dtype() != ir::DType::kI64 && indices.dtype() != ir::DType::kI32) {
    return UnsupportedDType(node, "input 1 (indices)", indices.dtype(), {ir::DType::kI64, ir::DType::kI32});
  }
  return absl::OkStatus();
}

// The index `v` (element `i` of indices) into an extent `n`, wrapped; an error when outside [-n, n).
absl::StatusOr<int64_t> WrapIndex(const ir::Node& node, int64_t v, int64_t i, int64_t n, int64_t axis) {
  if (v < -n || v >= n) {
    return INVALID_ARGUMENT() << Describe(node) << ": index " << v << " (element " << i
                              << " of indices) is out of range for axis " << axis << " of size " << n;
  }
  return v < 0 ? v + n : v;
}

// GatherElements: out[i_0, .., i_axis, ..] = data[i_0, .., indices[i], ..]; out has indices' shape,
// whose other dims must not exceed data's. Returns the data offset of every output element.
absl::StatusOr<std::vector<int64_t>> GatherElementsOffsets(const ir::Node& node, const std::vector<int64_t>& data_dims,
                                                           const ir::Tensor& indices) {
  RETURN_IF_ERROR(ExpectIndices(node, indices));
  const int64_t r = static_cast<int64_t>(data_dims.size());
  if (r == 0 || indices.rank() != r) {
    return INVALID_ARGUMENT() << Describe(node) << ": data " << DimsToString(data_dims) << " and indices "
                              << DimsToString(indices.dims()) << " must have the same rank >= 1";
  }
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), r));
  for (int64_t d = 0; d < r; ++d) {
    if (d != axis && indices.dims()[d] > data_dims[d]) {
      return INVALID_ARGUMENT() << Describe(node) << ": indices " << DimsToString(indices.dims())
                                << " exceed data " << DimsToString(data_dims) << " along axis " << d;
    }
  }
  const int64_t n = indices.num_elements();
  std::vector<int64_t> src(n);
  const std::vector<int64_t> data_strides = ContiguousStrides(data_dims);
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(int64_t a, WrapIndex(node, indices.GetAsInt(i), i, data_dims[axis], axis));
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += (d == axis ? a : idx[d]) * data_strides[d];
    src[i] = off;
    for (int64_t d = r - 1; d >= 0 && ++idx[d] == indices.dims()[d]; --d) idx[d] = 0;
  }
  return src;
}

// GatherND with batch_dims b: indices (I_0..I_{q-2}, k); for each batch position (the first b dims,
// shared by data and indices) and each index tuple, the slice data[batch, tuple, ...] of
// `slice` = prod(data dims after b + k) elements starting at data offset src[t].
struct GatherNDPlan {
  std::vector<int64_t> src;
  int64_t slice = 0;
  std::vector<int64_t> out_dims;
};

absl::StatusOr<GatherNDPlan> PlanGatherND(const ir::Node& node, const std::vector<int64_t>& data_dims,
                                          const ir::Tensor& indices) {
  RETURN_IF_ERROR(ExpectIndices(node, indices));
  const int64_t r = static_cast<int64_t>(data_dims.size()), q = indices.rank();
  const int64_t b = node.attrs.Get<int64_t>("batch_dims", 0);
  if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q)) {
    return INVALID_ARGUMENT() << Describe(node) << ": batch_dims " << b << " with data " << DimsToString(data_dims)
                              << " and indices " << DimsToString(indices.dims())
                              << "; expected ranks >= 1 and 0 <= batch_dims < min(ranks)";
  }
  const int64_t k = indices.dims()[q - 1];
  if (k < 1 || k > r - b) {
    return INVALID_ARGUMENT() << Describe(node) << ": index tuples of length " << k << " do not fit data "
                              << DimsToString(data_dims) << " with batch_dims " << b;
  }
  int64_t batches = 1;
  for (int64_t d = 0; d < b; ++d) {
    if (data_dims[d] != indices.dims()[d]) {
      return INVALID_ARGUMENT() << Describe(node) << ": batch dim " << d << " is " << data_dims[d]
                                << " in data but " << indices.dims()[d] << " in indices";
    }
    batches *= data_dims[d];
  }
  const std::vector<int64_t> data_strides = ContiguousStrides(data_dims);
  int64_t batch_stride = 1;
  for (int64_t d = b; d < r; ++d) batch_stride *= data_dims[d];
  GatherNDPlan plan;
  plan.slice = data_strides[b + k - 1];  // elements after the indexed dims
  const int64_t tuples = batches == 0 ? 0 : indices.num_elements() / k / batches;  // per batch position
  plan.src.resize(batches * tuples);
  for (int64_t t = 0; t < batches * tuples; ++t) {
    int64_t off = (t / tuples) * batch_stride;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = t * k + j;
      ASSIGN_OR_RETURN(int64_t v, WrapIndex(node, indices.GetAsInt(e), e, data_dims[b + j], b + j));
      off += v * data_strides[b + j];
    }
    plan.src[t] = off;
  }
  plan.out_dims.assign(indices.dims().begin(), indices.dims().end() - 1);
  plan.out_dims.insert(plan.out_dims.end(), data_dims.begin() + b + k, data_dims.end());
  return plan;
}

Outputs GatherElementsKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& data = in[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> src, GatherElementsOffsets(node, data.dims(), in[1]));
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, data.dtype(), in[1].dims()));
  DispatchBySize(data.dtype(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* x = data.data<U>();
    U* o = out.mutable_data<U>();
    for (size_t i = 0; i < src.size(); ++i) o[i] = x[src[i]];
    return 0;
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kGatherElements, GatherElementsKernel);

Outputs GatherNDKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& data = in[0];
  ASSIGN_OR_RETURN(GatherNDPlan plan, PlanGatherND(node, data.dims(), in[1]));
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, data.dtype(), plan.out_dims));
  const int64_t bytes = plan.slice * ir::DTypeSize(data.dtype());
  if (bytes == 0) return std::vector<ir::Tensor>{out};
  const auto* x = static_cast<const uint8_t*>(data.raw());
  auto* o = static_cast<uint8_t*>(out.raw());
  for (size_t t = 0; t < plan.src.size(); ++t) {
    std::memcpy(o + t * bytes, x + plan.src[t] * ir::DTypeSize(data.dtype()), bytes);
  }
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kGatherND, GatherNDKernel);

// The gradients scatter-add dY into zeros shaped like the forward's data (`like`, input 2), one
// element after the other in index order: repeated indices always sum in the same order.
absl::Status ExpectGradShape(const ir::Node& node, const ir::Tensor& dy, const std::vector<int64_t>& expected) {
  if (dy.dims() != expected) {
    return INVALID_ARGUMENT() << Describe(node) << ": dY has shape " << DimsToString(dy.dims()) << ", expected "
                              << DimsToString(expected) << " (the forward's output)";
  }
  return absl::OkStatus();
}

// GatherElementsGrad(dY, indices, like) axis: out (like) zeros; out[src[i]] += dY[i].
Outputs GatherElementsGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> src, GatherElementsOffsets(node, in[2].dims(), in[1]));
  RETURN_IF_ERROR(ExpectGradShape(node, dy, in[1].dims()));
  return DispatchDType(FloatTypes{}, node, "input 0", dy.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), in[2].dims()));
    const T* g = dy.data<T>();
    T* o = out.mutable_data<T>();
    for (size_t i = 0; i < src.size(); ++i) o[src[i]] += g[i];
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kGatherElementsGrad, GatherElementsGradKernel);

// GatherNDGrad(dY, indices, like) batch_dims: out (like) zeros; out[src[t] + c] += dY[t, c].
Outputs GatherNDGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  ASSIGN_OR_RETURN(GatherNDPlan plan, PlanGatherND(node, in[2].dims(), in[1]));
  RETURN_IF_ERROR(ExpectGradShape(node, dy, plan.out_dims));
  return DispatchDType(FloatTypes{}, node, "input 0", dy.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), in[2].dims()));
    const T* g = dy.data<T>();
    T* o = out.mutable_data<T>();
    for (size_t t = 0; t < plan.src.size(); ++t) {
      for (int64_t c = 0; c < plan.slice; ++c) o[plan.src[t] + c] += g[t * plan.slice + c];
    }
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kGatherNDGrad, GatherNDGradKernel);

}  // namespace
}  // namespace onnxpipe::cpu
