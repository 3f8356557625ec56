// Transpose, Slice and SliceGrad (any dtype, bit for bit) in the CUDA backend's kernel table: one
// strided copy each (strided_copy.h). Slice's operands (starts, ends, axes, steps) are constants
// read on the host (a small synchronising copy when they live on the device). Invalid attributes
// or operands run on the host, where the CPU kernel reports them.
#include <algorithm>
#include <numeric>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
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

}  // namespace

void RegisterLayoutKernels(KernelTable& table) {
  table[ir::OpKind::kTranspose].run = Transpose;
  table[ir::OpKind::kSlice] = {Slice, nullptr, /*host_inputs=*/0b11110u};
  table[ir::OpKind::kSliceGrad] = {SliceGrad, nullptr, /*host_inputs=*/0b111100u};
}

}  // namespace onnxpipe::cuda
