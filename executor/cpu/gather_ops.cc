// GatherElements and GatherND: the index ops of transformers' mask code (and of RoBERTa's
// position ids). Both move raw elements, so one byte-size instantiation serves every dtype;
// indices are i64 or i32, negative ones count from the end, and every index is checked before
// anything is read (an out-of-range index is an error, never a read out of bounds).
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
// whose other dims must not exceed data's.
Outputs GatherElementsKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& data = in[0];
  const ir::Tensor& indices = in[1];
  RETURN_IF_ERROR(ExpectIndices(node, indices));
  const int64_t r = data.rank();
  if (r == 0 || indices.rank() != r) {
    return INVALID_ARGUMENT() << Describe(node) << ": data " << DimsToString(data.dims()) << " and indices "
                              << DimsToString(indices.dims()) << " must have the same rank >= 1";
  }
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), r));
  for (int64_t d = 0; d < r; ++d) {
    if (d != axis && indices.dims()[d] > data.dims()[d]) {
      return INVALID_ARGUMENT() << Describe(node) << ": indices " << DimsToString(indices.dims())
                                << " exceed data " << DimsToString(data.dims()) << " along axis " << d;
    }
  }
  const int64_t n = indices.num_elements();
  std::vector<int64_t> src(n);  // the data offset of every output element
  const std::vector<int64_t> data_strides = ContiguousStrides(data.dims());
  std::vector<int64_t> idx(r, 0);
  for (int64_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(int64_t a, WrapIndex(node, indices.GetAsInt(i), i, data.dims()[axis], axis));
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += (d == axis ? a : idx[d]) * data_strides[d];
    src[i] = off;
    for (int64_t d = r - 1; d >= 0 && ++idx[d] == indices.dims()[d]; --d) idx[d] = 0;
  }
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, data.dtype(), indices.dims()));
  DispatchBySize(data.dtype(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* x = data.data<U>();
    U* o = out.mutable_data<U>();
    for (int64_t i = 0; i < n; ++i) o[i] = x[src[i]];
    return 0;
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kGatherElements, GatherElementsKernel);

// GatherND with batch_dims b: indices (I_0..I_{q-2}, k); for each batch position (the first b dims,
// shared by data and indices) and each index tuple, the slice data[batch, tuple, ...] of
// prod(data dims after b + k) elements.
Outputs GatherNDKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& data = in[0];
  const ir::Tensor& indices = in[1];
  RETURN_IF_ERROR(ExpectIndices(node, indices));
  const int64_t r = data.rank(), q = indices.rank();
  const int64_t b = node.attrs.Get<int64_t>("batch_dims", 0);
  if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q)) {
    return INVALID_ARGUMENT() << Describe(node) << ": batch_dims " << b << " with data "
                              << DimsToString(data.dims()) << " and indices " << DimsToString(indices.dims())
                              << "; expected ranks >= 1 and 0 <= batch_dims < min(ranks)";
  }
  const int64_t k = indices.dims()[q - 1];
  if (k < 1 || k > r - b) {
    return INVALID_ARGUMENT() << Describe(node) << ": index tuples of length " << k << " do not fit data "
                              << DimsToString(data.dims()) << " with batch_dims " << b;
  }
  int64_t batches = 1;
  for (int64_t d = 0; d < b; ++d) {
    if (data.dims()[d] != indices.dims()[d]) {
      return INVALID_ARGUMENT() << Describe(node) << ": batch dim " << d << " is " << data.dims()[d]
                                << " in data but " << indices.dims()[d] << " in indices";
    }
    batches *= data.dims()[d];
  }
  const std::vector<int64_t> data_strides = ContiguousStrides(data.dims());
  const int64_t batch_stride = b == 0 ? data.num_elements() : data_strides[b - 1];
  const int64_t slice = data_strides[b + k - 1];  // elements after the indexed dims
  const int64_t tuples = batches == 0 ? 0 : indices.num_elements() / k / batches;  // per batch position
  std::vector<int64_t> src(batches * tuples);
  for (int64_t t = 0; t < batches * tuples; ++t) {
    int64_t off = (t / tuples) * batch_stride;
    for (int64_t j = 0; j < k; ++j) {
      ASSIGN_OR_RETURN(int64_t v, WrapIndex(node, indices.GetAsInt(t * k + j), t * k + j, data.dims()[b + j], b + j));
      off += v * data_strides[b + j];
    }
    src[t] = off;
  }
  std::vector<int64_t> dims(indices.dims().begin(), indices.dims().end() - 1);
  dims.insert(dims.end(), data.dims().begin() + b + k, data.dims().end());
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, data.dtype(), dims));
  const int64_t esize = ir::DTypeSize(data.dtype());
  const auto* x = static_cast<const uint8_t*>(data.raw());
  auto* o = static_cast<uint8_t*>(out.raw());
  for (int64_t t = 0; t < static_cast<int64_t>(src.size()); ++t) {
    std::memcpy(o + t * slice * esize, x + src[t] * esize, slice * esize);
  }
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kGatherND, GatherNDKernel);

}  // namespace
}  // namespace onnxpipe::cpu
