// Transpose, Slice, SliceGrad, Expand, Concat, Split and ConcatGrad (any dtype, bit for bit) in the
// CUDA backend's kernel table: strided copies (strided_copy.h), one per output or concatenated
// piece. Slice's operands (starts, ends, axes, steps) and Expand's shape are constants read on the
// host (a small synchronising copy when they live on the device). Invalid attributes or operands
// run on the host, where the CPU kernel reports them.
#include <algorithm>
#include <numeric>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/strided_copy.h"
#include "frontend/ir/shape.h"

namespace onnxpipe::cuda {
namespace {

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

KernelResult Copied(const KernelContext& ctx, const StridedCopy& c, const ir::Tensor& src, const ir::Tensor& dst) {
  CUDA_RETURN_IF_ERROR(LaunchStridedCopy(c, static_cast<int>(ir::DTypeSize(src.dtype())), src.device_raw(),
                                         dst.device_raw(), ctx.stream));
  return std::vector<ir::Tensor>{dst};
}

KernelResult Transpose(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  const int64_t rank = x.rank();
  std::vector<int64_t> perm(rank);
  if (node.attrs.Has("perm")) {
    perm = node.attrs.Get<std::vector<int64_t>>("perm");
  } else {
    for (int64_t i = 0; i < rank; ++i) perm[i] = rank - 1 - i;
  }
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(rank);
  std::iota(iota.begin(), iota.end(), 0);
  if (sorted != iota || rank > kMaxCopyRank) return std::nullopt;
  const std::vector<int64_t> xs = ContiguousStrides(x.dims());
  StridedCopy c;
  c.rank = static_cast<int>(rank);
  std::vector<int64_t> dims(rank);
  for (int64_t i = 0; i < rank; ++i) {
    dims[i] = c.dims[i] = x.dims()[perm[i]];
    c.src_strides[i] = xs[perm[i]];
  }
  const std::vector<int64_t> os = ContiguousStrides(dims);
  std::copy(os.begin(), os.end(), c.dst_strides);
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, x.dtype(), dims);
  if (!out.ok()) return out.status();
  return Copied(ctx, c, x, *out);
}

// The region Slice(x of `dims`, starts, ends, axes, steps) selects, with ONNX's clamping (as the
// CPU's Slice and SliceGrad compute it): extents, element strides into x and the first element.
struct Region {
  std::vector<int64_t> dims, strides;
  int64_t offset = 0;
};

// Slice operands `first`.. as host integer vectors; nullopt when one is not an integer vector.
std::optional<std::vector<std::vector<int64_t>>> SliceOperands(const KernelContext& ctx,
                                                               const std::vector<ir::Tensor>& in, size_t first) {
  std::vector<std::vector<int64_t>> v;
  for (size_t i = first; i < first + 4; ++i) {
    if (!HasInput(in, i)) {
      v.emplace_back();
      continue;
    }
    if (!in[i].has_data() || !ir::IsInteger(in[i].dtype()) || in[i].rank() > 1) return std::nullopt;
    absl::StatusOr<ir::Tensor> h = in[i].on_host() ? in[i] : ctx.backend->ToHost(in[i], ctx.exec.stream);
    if (!h.ok()) return std::nullopt;
    v.push_back(h->ToInt64Vector());
  }
  return v;
}

std::optional<Region> SliceRegion(const std::vector<int64_t>& xd, const std::vector<std::vector<int64_t>>& ops,
                                  bool has_axes, bool has_steps) {
  const std::vector<int64_t>& starts = ops[0];
  const std::vector<int64_t>& ends = ops[1];
  std::vector<int64_t> axes = ops[2], steps = ops[3];
  const int64_t rank = static_cast<int64_t>(xd.size());
  if (!has_axes) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (!has_steps) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return std::nullopt;
  const std::vector<int64_t> xs = ContiguousStrides(xd);
  Region r{xd, xs, 0};
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank || seen[a] || steps[i] == 0) return std::nullopt;
    seen[a] = true;
    const int64_t dim = xd[a], step = steps[i];
    const auto [start, len] = ir::ClampSliceAxis(dim, starts[i], ends[i], step);
    r.dims[a] = len;
    r.strides[a] = xs[a] * step;
    if (len > 0) r.offset += start * xs[a];
  }
  return r;
}

// Y = Slice(X, starts, ends, axes?, steps?).
KernelResult Slice(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (x.rank() > kMaxCopyRank) return std::nullopt;
  const auto ops = SliceOperands(ctx, in, 1);
  if (!ops) return std::nullopt;
  const std::optional<Region> r = SliceRegion(x.dims(), *ops, HasInput(in, 3), HasInput(in, 4));
  if (!r) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, x.dtype(), r->dims);
  if (!out.ok()) return out.status();
  StridedCopy c;
  c.rank = static_cast<int>(x.rank());
  c.src_offset = r->offset;
  const std::vector<int64_t> os = ContiguousStrides(r->dims);
  for (int i = 0; i < c.rank; ++i) c.dims[i] = r->dims[i], c.src_strides[i] = r->strides[i], c.dst_strides[i] = os[i];
  return Copied(ctx, c, x, *out);
}

// dX = SliceGrad(dY, like, starts, ends, axes?, steps?): zeros like `like`, dY written into the region.
KernelResult SliceGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& dy = in[0];
  const std::vector<int64_t>& xd = in[1].dims();
  if (static_cast<int>(xd.size()) > kMaxCopyRank) return std::nullopt;
  const auto ops = SliceOperands(ctx, in, 2);
  if (!ops) return std::nullopt;
  const std::optional<Region> r = SliceRegion(xd, *ops, HasInput(in, 4), HasInput(in, 5));
  if (!r || r->dims != dy.dims()) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, dy.dtype(), xd);  // zero-filled
  if (!out.ok()) return out.status();
  StridedCopy c;
  c.rank = static_cast<int>(xd.size());
  c.dst_offset = r->offset;
  const std::vector<int64_t> ds = ContiguousStrides(dy.dims());
  for (int i = 0; i < c.rank; ++i) c.dims[i] = r->dims[i], c.src_strides[i] = ds[i], c.dst_strides[i] = r->strides[i];
  return Copied(ctx, c, dy, *out);
}

// Copies the `dims` region of src starting at element src_offset with src_strides into dst's dense
// layout `dst_dims` at element dst_offset (nothing for an empty region).
absl::Status CopyRegion(const KernelContext& ctx, const ir::Tensor& src, const std::vector<int64_t>& dims,
                        const std::vector<int64_t>& src_strides, int64_t src_offset, const ir::Tensor& dst,
                        const std::vector<int64_t>& dst_dims, int64_t dst_offset) {
  if (ir::ElementCount(dims) == 0) return absl::OkStatus();
  StridedCopy c;
  c.rank = static_cast<int>(dims.size());
  c.src_offset = src_offset, c.dst_offset = dst_offset;
  const std::vector<int64_t> ds = ContiguousStrides(dst_dims);
  for (int i = 0; i < c.rank; ++i) c.dims[i] = dims[i], c.src_strides[i] = src_strides[i], c.dst_strides[i] = ds[i];
  CUDA_RETURN_IF_ERROR(LaunchStridedCopy(c, static_cast<int>(ir::DTypeSize(src.dtype())), src.device_raw(),
                                         dst.device_raw(), ctx.stream));
  return absl::OkStatus();
}

// Pieces of `x` along `axis` of the given extents as outputs 0.. (those the node has).
KernelResult SplitPieces(const KernelContext& ctx, const ir::Node& node, const ir::Tensor& x, int64_t axis,
                         const std::vector<int64_t>& sizes) {
  const std::vector<int64_t> xs = ContiguousStrides(x.dims());
  std::vector<ir::Tensor> outs(sizes.size());
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int64_t> dims = x.dims();
    dims[axis] = sizes[i];
    if (WantsOutput(node, i)) {
      absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, static_cast<int>(i), x.dtype(), dims);
      if (!out.ok()) return out.status();
      if (absl::Status st = CopyRegion(ctx, x, dims, xs, start * xs[axis], *out, dims, 0); !st.ok()) return st;
      outs[i] = *out;
    }
    start += sizes[i];
  }
  return outs;
}

// The node's attr axis normalised for `rank`; nullopt when out of range.
std::optional<int64_t> Axis(const ir::Node& node, int64_t rank, int64_t fallback) {
  int64_t axis = node.attrs.Get<int64_t>("axis", fallback);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  return axis;
}

// Y = Concat(X0, X1, ...) attr axis: every input of one dtype and rank, equal off the axis.
KernelResult Concat(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x0 = in[0];
  if (!node.attrs.Has("axis") || x0.rank() > kMaxCopyRank) return std::nullopt;
  const std::optional<int64_t> axis = Axis(node, x0.rank(), 0);
  if (!axis) return std::nullopt;
  std::vector<int64_t> dims = x0.dims();
  dims[*axis] = 0;
  for (const ir::Tensor& x : in) {
    if (!x.has_data() || x.dtype() != x0.dtype() || x.rank() != x0.rank()) return std::nullopt;
    for (int64_t d = 0; d < x0.rank(); ++d)
      if (d != *axis && x.dims()[d] != x0.dims()[d]) return std::nullopt;
    dims[*axis] += x.dims()[*axis];
  }
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, x0.dtype(), dims);
  if (!out.ok()) return out.status();
  const std::vector<int64_t> os = ContiguousStrides(dims);
  int64_t start = 0;
  for (const ir::Tensor& x : in) {
    const absl::Status st = CopyRegion(ctx, x, x.dims(), ContiguousStrides(x.dims()), 0, *out, dims, start * os[*axis]);
    if (!st.ok()) return st;
    start += x.dims()[*axis];
  }
  return std::vector<ir::Tensor>{*out};
}

// Y0, Y1, ... = Split(X) attrs axis, split (sizes) or equal parts (the last one smaller with
// num_outputs), as the CPU kernel.
KernelResult Split(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (x.rank() > kMaxCopyRank) return std::nullopt;
  const std::optional<int64_t> axis = Axis(node, x.rank(), 0);
  if (!axis) return std::nullopt;
  const int64_t n_out = static_cast<int64_t>(node.outputs.size()), dim = x.dims()[*axis];
  std::vector<int64_t> sizes;
  if (node.attrs.Has("split")) {
    sizes = node.attrs.Get<std::vector<int64_t>>("split");
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) return std::nullopt;
      total += s;
    }
    if (static_cast<int64_t>(sizes.size()) != n_out || total != dim) return std::nullopt;
  } else {
    if (n_out == 0 || (dim % n_out != 0 && !node.attrs.Has("num_outputs"))) return std::nullopt;
    const int64_t chunk = (dim + n_out - 1) / n_out;
    for (int64_t i = 0; i < n_out; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  return SplitPieces(ctx, node, x, *axis, sizes);
}

// dX0, dX1, ... = ConcatGrad(dY, like_0, like_1, ...) attr axis: dY's pieces of the likes' extents.
KernelResult ConcatGrad(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& dy = in[0];
  if (dy.rank() > kMaxCopyRank) return std::nullopt;
  const std::optional<int64_t> axis = Axis(node, dy.rank(), 0);
  if (!axis) return std::nullopt;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (size_t i = 1; i < in.size(); ++i) {
    const std::vector<int64_t>& ld = in[i].dims();
    if (static_cast<int64_t>(ld.size()) != dy.rank()) return std::nullopt;
    for (int64_t d = 0; d < dy.rank(); ++d)
      if (d != *axis && ld[d] != dy.dims()[d]) return std::nullopt;
    sizes.push_back(ld[*axis]);
    total += ld[*axis];
  }
  if (total != dy.dims()[*axis]) return std::nullopt;
  return SplitPieces(ctx, node, dy, *axis, sizes);
}

// Y = Expand(X, shape): X broadcast (numpy rules) with `shape`, its size-1 dims read with stride 0.
KernelResult Expand(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (!in[1].has_data() || !ir::IsInteger(in[1].dtype()) || in[1].rank() > 1) return std::nullopt;
  absl::StatusOr<ir::Tensor> h = in[1].on_host() ? in[1] : ctx.backend->ToHost(in[1], ctx.exec.stream);
  if (!h.ok()) return h.status();
  const std::vector<int64_t> shape = h->ToInt64Vector();
  for (int64_t d : shape)
    if (d < 0) return std::nullopt;
  absl::StatusOr<std::vector<int64_t>> dims = BroadcastShape({x.dims(), shape});
  if (!dims.ok() || dims->size() > static_cast<size_t>(kMaxCopyRank)) return std::nullopt;
  const size_t rank = dims->size(), lead = rank - x.dims().size();
  const std::vector<int64_t> xs = ContiguousStrides(x.dims());
  std::vector<int64_t> strides(rank, 0);
  for (size_t d = lead; d < rank; ++d) strides[d] = x.dims()[d - lead] == 1 ? 0 : xs[d - lead];
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, x.dtype(), *dims);
  if (!out.ok()) return out.status();
  if (absl::Status st = CopyRegion(ctx, x, *dims, strides, 0, *out, *dims, 0); !st.ok()) return st;
  return std::vector<ir::Tensor>{*out};
}

}  // namespace

void RegisterLayoutKernels(KernelTable& table) {
  table[ir::OpKind::kConcat].run = Concat;
  table[ir::OpKind::kSplit].run = Split;
  table[ir::OpKind::kConcatGrad].run = ConcatGrad;
  table[ir::OpKind::kExpand] = {Expand, nullptr, /*host_inputs=*/1u << 1};
  table[ir::OpKind::kTranspose].run = Transpose;
  table[ir::OpKind::kSlice] = {Slice, nullptr, /*host_inputs=*/0b11110u};
  table[ir::OpKind::kSliceGrad] = {SliceGrad, nullptr, /*host_inputs=*/0b111100u};
}

}  // namespace onnxpipe::cuda
