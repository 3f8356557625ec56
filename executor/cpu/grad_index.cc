// Backward kernels of indexing ops: GatherGrad (scatter-add), SliceGrad (write into zeros) and
// ConcatGrad (split along the concat axis). GatherGrad is deterministic without atomics: the
// output's columns are split over the thread pool and each thread adds all gathered rows of its
// columns in index order, so repeated indices (the same token twice in a batch) always sum in the
// same order.
#include "executor/cpu/grad_util.h"
#include "frontend/ir/shape.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

// GatherGrad(dY, indices, like) axis: out (like) zeros; out[.., indices[j], ..] += dY[.., j, ..].
Outputs GatherGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const ir::Tensor& idx = in[1];
  const std::vector<int64_t>& dd = in[2].dims();
  const int64_t rank = static_cast<int64_t>(dd.size());
  if (rank == 0) return INVALID_ARGUMENT() << Describe(node) << ": data must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), rank));
  if (!ir::IsInteger(idx.dtype())) {
    return INVALID_ARGUMENT() << Describe(node) << ": indices have dtype " << ir::DTypeName(idx.dtype())
                              << ", expected an integer type";
  }
  std::vector<int64_t> expect(dd.begin(), dd.begin() + axis);
  expect.insert(expect.end(), idx.dims().begin(), idx.dims().end());
  expect.insert(expect.end(), dd.begin() + axis + 1, dd.end());
  if (dy.dims() != expect) {
    return INVALID_ARGUMENT() << Describe(node) << ": dY has shape " << DimsToString(dy.dims())
                              << ", expected " << DimsToString(expect) << " (Gather of "
                              << DimsToString(dd) << " by " << DimsToString(idx.dims()) << ")";
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dd[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= dd[d];
  const int64_t n_axis = dd[axis], n_idx = idx.num_elements();
  // Indices are checked up front and read again in the loop (no table of rows to allocate).
  auto row_of = [&](int64_t j) {
    const int64_t v = idx.GetAsInt(j);
    return v < 0 ? v + n_axis : v;
  };
  for (int64_t j = 0; j < n_idx; ++j) {
    const int64_t v = row_of(j);
    if (v < 0 || v >= n_axis) {
      return INVALID_ARGUMENT() << Describe(node) << ": index " << idx.GetAsInt(j) << " at position " << j
                                << " is out of range for axis " << axis << " of size " << n_axis;
    }
  }
  return DispatchDType(FloatTypes{}, node, "input 0", dy.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), dd));
    if (out.num_elements() == 0 || n_idx == 0) return std::vector<ir::Tensor>{out};
    const T* pg = dy.data<T>();
    T* po = out.mutable_data<T>();
    constexpr int64_t kBlock = 256;
    const int64_t blocks = (inner + kBlock - 1) / kBlock;
    ParallelFor(outer * blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / blocks, c0 = (t % blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
        for (int64_t j = 0; j < n_idx; ++j) {
          const T* src = pg + (o * n_idx + j) * inner;
          T* dst = po + (o * n_axis + row_of(j)) * inner;
          for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
        }
      }
    });
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kGatherGrad, GatherGradKernel);

absl::StatusOr<std::vector<int64_t>> Ints(const ir::Node& node, const ir::Tensor& t, const char* what) {
  if (!ir::IsInteger(t.dtype()) || t.rank() > 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << what << " must be a 1-D integer tensor, got "
                              << ir::DTypeName(t.dtype()) << DimsToString(t.dims());
  }
  return t.ToInt64Vector();
}

// SliceGrad(dY, like, starts, ends, axes?, steps?): the region is computed exactly as Slice does
// (ONNX clamping rules), then dY is written through the region's strides into zeros.
Outputs SliceGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const std::vector<int64_t>& xd = in[1].dims();
  const int64_t rank = static_cast<int64_t>(xd.size());
  ASSIGN_OR_RETURN(std::vector<int64_t> starts, Ints(node, in[2], "input 2 (starts)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> ends, Ints(node, in[3], "input 3 (ends)"));
  std::vector<int64_t> axes(starts.size()), steps(starts.size(), 1);
  for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
  if (HasInput(in, 4)) {
    ASSIGN_OR_RETURN(axes, Ints(node, in[4], "input 4 (axes)"));
  }
  if (HasInput(in, 5)) {
    ASSIGN_OR_RETURN(steps, Ints(node, in[5], "input 5 (steps)"));
  }
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    return INVALID_ARGUMENT() << Describe(node) << ": starts, ends, axes and steps differ in length";
  }
  ASSIGN_OR_RETURN(axes, NormalizeAxes(node, axes, rank));
  const std::vector<int64_t> xs = ContiguousStrides(xd);
  std::vector<int64_t> dims = xd, strides = xs;
  int64_t offset = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i], dim = xd[a], step = steps[i];
    if (step == 0) return INVALID_ARGUMENT() << Describe(node) << ": step for axis " << a << " is 0";
    const auto [start, len] = ir::ClampSliceAxis(dim, starts[i], ends[i], step);
    dims[a] = len;
    strides[a] = xs[a] * step;
    if (len > 0) offset += start * xs[a];
  }
  if (dy.dims() != dims) {
    return INVALID_ARGUMENT() << Describe(node) << ": dY has shape " << DimsToString(dy.dims())
                              << ", expected the slice's " << DimsToString(dims);
  }
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), xd));
  if (dy.num_elements() == 0) return std::vector<ir::Tensor>{out};
  DispatchBySize(dy.dtype(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const U* src = dy.data<U>();
    U* dst = out.mutable_data<U>();
    // Walk dY contiguously; operand 0 is the destination position in the output.
    StridedLoop loop(dims, {strides}, {offset});
    loop.Run([&](int64_t o, const int64_t* off, int64_t len, const int64_t* step) {
      for (int64_t j = 0; j < len; ++j) dst[off[0] + j * step[0]] = src[o + j];
    });
    return 0;
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kSliceGrad, SliceGradKernel);

// ConcatGrad(dY, like_0, ...) axis: piece i of dY along axis, extent like_i's; absent outputs are
// skipped.
Outputs ConcatGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), dy.rank()));
  const std::vector<int64_t> strides = ContiguousStrides(dy.dims());
  std::vector<ir::Tensor> outs(in.size() - 1);
  int64_t start = 0;
  for (size_t i = 1; i < in.size(); ++i) {
    const std::vector<int64_t>& ld = in[i].dims();
    bool ok = static_cast<int64_t>(ld.size()) == dy.rank();
    for (int64_t d = 0; ok && d < dy.rank(); ++d) ok = d == axis || ld[d] == dy.dims()[d];
    if (!ok) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " " << DimsToString(ld)
                                << " is not a piece of dY " << DimsToString(dy.dims()) << " along axis " << axis;
    }
    if (WantsOutput(node, i - 1)) {
      ASSIGN_OR_RETURN(outs[i - 1], StridedCopyOutput(node, ctx, static_cast<int>(i - 1), dy, ld,
                                                      strides, start * strides[axis]));
    }
    start += ld[axis];
  }
  if (start != dy.dims()[axis]) {
    return INVALID_ARGUMENT() << Describe(node) << ": the pieces cover " << start << " of dY's "
                              << dy.dims()[axis] << " along axis " << axis;
  }
  return outs;
}
REGISTER_CPU_KERNEL(kConcatGrad, ConcatGradKernel);

}  // namespace
}  // namespace onnxpipe::cpu
