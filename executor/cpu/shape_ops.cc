// Data-movement kernels: Transpose, Reshape, Flatten, Squeeze, Unsqueeze, Concat, Split, Slice,
// Shape, Expand. They only move elements, so they work for every dtype. Reshape-like ops return a
// tensor sharing the input's storage; the others copy through StridedLoop.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "executor/cpu/kernel_util.h"
#include "frontend/ir/shape.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs TransposeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  const int64_t rank = x.rank();
  std::vector<int64_t> perm = node.attrs.Get<std::vector<int64_t>>("perm", {});
  if (!node.attrs.Has("perm")) {
    perm.resize(rank);
    for (int64_t i = 0; i < rank; ++i) perm[i] = rank - 1 - i;
  }
  std::vector<bool> seen(rank, false);
  if (static_cast<int64_t>(perm.size()) != rank) {
    return INVALID_ARGUMENT() << Describe(node) << ": perm has " << perm.size()
                              << " entries for an input of rank " << rank;
  }
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[p]) {
      return INVALID_ARGUMENT() << Describe(node) << ": perm " << DimsToString(perm)
                                << " is not a permutation of 0.." << rank - 1;
    }
    seen[p] = true;
  }
  const std::vector<int64_t> in_strides = ContiguousStrides(x.dims());
  std::vector<int64_t> dims(rank), strides(rank);
  for (int64_t i = 0; i < rank; ++i) {
    dims[i] = x.dims()[perm[i]];
    strides[i] = in_strides[perm[i]];
  }
  ASSIGN_OR_RETURN(ir::Tensor out, StridedCopyOutput(node, ctx, 0, x, dims, strides, 0));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kTranspose, TransposeKernel);

absl::StatusOr<std::vector<int64_t>> IntVector(const ir::Node& node, const ir::Tensor& t,
                                               std::string_view what) {
  if (t.dtype() != ir::DType::kI64 && t.dtype() != ir::DType::kI32) {
    return UnsupportedDType(node, what, t.dtype(), {ir::DType::kI64, ir::DType::kI32});
  }
  if (t.rank() > 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << what << " must be a 1-D tensor, got shape "
                              << DimsToString(t.dims());
  }
  return t.ToInt64Vector();
}

Outputs ReshapeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntVector(node, in[1], "input 1 (shape)"));
  const bool allowzero = node.attrs.Get<int64_t>("allowzero", 0) != 0;
  std::vector<int64_t> dims(shape.size());
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v = shape[i];
    if (v == 0 && !allowzero) {
      if (i >= x.dims().size()) {
        return INVALID_ARGUMENT() << Describe(node) << ": shape " << DimsToString(shape)
                                  << " copies dim " << i << " (0) but the input has rank " << x.rank();
      }
      v = x.dims()[i];
    } else if (v == -1) {
      if (infer >= 0) {
        return INVALID_ARGUMENT() << Describe(node) << ": shape " << DimsToString(shape)
                                  << " has more than one -1";
      }
      infer = static_cast<int>(i);
      dims[i] = -1;
      continue;
    } else if (v < 0) {
      return INVALID_ARGUMENT() << Describe(node) << ": shape " << DimsToString(shape)
                                << " has a negative entry other than -1";
    }
    dims[i] = v;
    if (v != 0 && known > (int64_t{1} << 62) / v) {
      return INVALID_ARGUMENT() << Describe(node) << ": shape " << DimsToString(shape) << " is too large";
    }
    known *= v;
  }
  const int64_t n = x.num_elements();
  if (infer >= 0) {
    if (known == 0 || n % known != 0) {
      return INVALID_ARGUMENT() << Describe(node) << ": cannot infer the -1 of shape " << DimsToString(shape)
                                << " for an input of shape " << DimsToString(x.dims());
    }
    dims[infer] = n / known;
  } else if (known != n) {
    return INVALID_ARGUMENT() << Describe(node) << ": cannot reshape an input of shape "
                              << DimsToString(x.dims()) << " (" << n << " elements) to "
                              << DimsToString(dims);
  }
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, dims));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kReshape, ReshapeKernel);

Outputs FlattenKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  int64_t axis = node.attrs.Get<int64_t>("axis", 1);
  if (axis < -x.rank() || axis > x.rank()) {
    return INVALID_ARGUMENT() << Describe(node) << ": axis " << axis << " is out of range for rank "
                              << x.rank() << " (expected [" << -x.rank() << ", " << x.rank() << "])";
  }
  if (axis < 0) axis += x.rank();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.rank(); ++i) (i < axis ? outer : inner) *= x.dims()[i];
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, {outer, inner}));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kFlatten, FlattenKernel);

Outputs SqueezeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  std::vector<bool> drop(x.rank(), false);
  if (node.attrs.Has("axes")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> axes,
                     NormalizeAxes(node, node.attrs.Get<std::vector<int64_t>>("axes"), x.rank()));
    for (int64_t a : axes) {
      if (x.dims()[a] != 1) {
        return INVALID_ARGUMENT() << Describe(node) << ": cannot squeeze axis " << a << " of size "
                                  << x.dims()[a] << " (input shape " << DimsToString(x.dims()) << ")";
      }
      drop[a] = true;
    }
  } else {
    for (int64_t i = 0; i < x.rank(); ++i) drop[i] = x.dims()[i] == 1;
  }
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.rank(); ++i) {
    if (!drop[i]) dims.push_back(x.dims()[i]);
  }
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, dims));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kSqueeze, SqueezeKernel);

Outputs UnsqueezeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  if (!node.attrs.Has("axes")) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute axes is required";
  }
  const std::vector<int64_t> raw = node.attrs.Get<std::vector<int64_t>>("axes");
  const int64_t out_rank = x.rank() + static_cast<int64_t>(raw.size());
  ASSIGN_OR_RETURN(std::vector<int64_t> axes, NormalizeAxes(node, raw, out_rank));
  std::vector<bool> inserted(out_rank, false);
  for (int64_t a : axes) inserted[a] = true;
  std::vector<int64_t> dims;
  size_t next = 0;
  for (int64_t i = 0; i < out_rank; ++i) dims.push_back(inserted[i] ? 1 : x.dims()[next++]);
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, dims));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kUnsqueeze, UnsqueezeKernel);

Outputs ConcatKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is missing";
    if (in[i].dtype() != in[0].dtype() || in[i].rank() != in[0].rank()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is "
                                << ir::DTypeName(in[i].dtype()) << DimsToString(in[i].dims())
                                << ", expected dtype " << ir::DTypeName(in[0].dtype()) << " and rank "
                                << in[0].rank() << " like input 0";
    }
  }
  if (!node.attrs.Has("axis")) return INVALID_ARGUMENT() << Describe(node) << ": attribute axis is required";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis"), in[0].rank()));
  std::vector<int64_t> dims = in[0].dims();
  dims[axis] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    for (int64_t d = 0; d < in[0].rank(); ++d) {
      if (d != axis && in[i].dims()[d] != in[0].dims()[d]) {
        return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has shape "
                                  << DimsToString(in[i].dims()) << ", which differs from input 0's "
                                  << DimsToString(in[0].dims()) << " outside axis " << axis;
      }
    }
    dims[axis] += in[i].dims()[axis];
  }
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), dims));
  const int64_t esize = ir::DTypeSize(in[0].dtype());
  int64_t outer = 1, inner = esize;
  for (int64_t d = 0; d < axis; ++d) outer *= dims[d];
  for (int64_t d = axis + 1; d < in[0].rank(); ++d) inner *= dims[d];
  const int64_t out_row = dims[axis] * inner;  // bytes per outer index in the output
  auto* o = static_cast<uint8_t*>(out.raw());
  ParallelFor(outer, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(out_row, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t pos = r * out_row;
      for (const ir::Tensor& t : in) {
        const int64_t bytes = t.dims()[axis] * inner;
        if (bytes) std::memcpy(o + pos, static_cast<const uint8_t*>(t.raw()) + r * bytes, bytes);
        pos += bytes;
      }
    }
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kConcat, ConcatKernel);

Outputs SplitKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), x.rank()));
  const int64_t n_out = static_cast<int64_t>(node.outputs.size());
  const int64_t dim = x.dims()[axis];
  std::vector<int64_t> sizes;
  if (node.attrs.Has("split")) {
    sizes = node.attrs.Get<std::vector<int64_t>>("split");
    int64_t total = 0;
    for (int64_t s : sizes) {
      if (s < 0) return INVALID_ARGUMENT() << Describe(node) << ": split has a negative size";
      total += s;
    }
    if (static_cast<int64_t>(sizes.size()) != n_out || total != dim) {
      return INVALID_ARGUMENT() << Describe(node) << ": split " << DimsToString(sizes) << " must have "
                                << n_out << " entries summing to dim " << axis << " = " << dim;
    }
  } else {
    // Equal parts; with num_outputs (opset 18) the last part may be smaller.
    const int64_t chunk = (dim + n_out - 1) / n_out;
    if (dim % n_out != 0 && !node.attrs.Has("num_outputs")) {
      return INVALID_ARGUMENT() << Describe(node) << ": dim " << axis << " = " << dim
                                << " does not split evenly into " << n_out << " outputs";
    }
    for (int64_t i = 0; i < n_out; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  const std::vector<int64_t> strides = ContiguousStrides(x.dims());
  std::vector<ir::Tensor> outs;
  int64_t start = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int64_t> dims = x.dims();
    dims[axis] = sizes[i];
    ir::Tensor piece;
    if (WantsOutput(node, i)) {
      ASSIGN_OR_RETURN(piece, StridedCopyOutput(node, ctx, static_cast<int>(i), x, dims, strides,
                                                start * strides[axis]));
    }
    outs.push_back(std::move(piece));
    start += sizes[i];
  }
  return outs;
}
REGISTER_CPU_KERNEL(kSplit, SplitKernel);

Outputs SliceKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  const int64_t rank = x.rank();
  ASSIGN_OR_RETURN(std::vector<int64_t> starts, IntVector(node, in[1], "input 1 (starts)"));
  ASSIGN_OR_RETURN(std::vector<int64_t> ends, IntVector(node, in[2], "input 2 (ends)"));
  std::vector<int64_t> axes(starts.size()), steps(starts.size(), 1);
  std::iota(axes.begin(), axes.end(), 0);
  if (HasInput(in, 3)) {
    ASSIGN_OR_RETURN(axes, IntVector(node, in[3], "input 3 (axes)"));
  }
  if (HasInput(in, 4)) {
    ASSIGN_OR_RETURN(steps, IntVector(node, in[4], "input 4 (steps)"));
  }
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size()) {
    return INVALID_ARGUMENT() << Describe(node) << ": starts, ends, axes and steps have "
                              << starts.size() << ", " << ends.size() << ", " << axes.size() << ", "
                              << steps.size() << " entries, expected equal counts";
  }
  ASSIGN_OR_RETURN(axes, NormalizeAxes(node, axes, rank));
  const std::vector<int64_t> in_strides = ContiguousStrides(x.dims());
  std::vector<int64_t> dims = x.dims(), strides = in_strides;
  int64_t offset = 0;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = axes[i], dim = x.dims()[a], step = steps[i];
    if (step == 0) return INVALID_ARGUMENT() << Describe(node) << ": step for axis " << a << " is 0";
    const auto [start, len] = ir::ClampSliceAxis(dim, starts[i], ends[i], step);
    dims[a] = len;
    strides[a] = in_strides[a] * step;
    if (len > 0) offset += start * in_strides[a];
  }
  ASSIGN_OR_RETURN(ir::Tensor out, StridedCopyOutput(node, ctx, 0, x, dims, strides, offset));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kSlice, SliceKernel);

Outputs ShapeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const int64_t rank = in[0].rank();
  int64_t start = node.attrs.Get<int64_t>("start", 0);
  int64_t end = node.attrs.Get<int64_t>("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, ir::DType::kI64, {end - start}));
  for (int64_t i = start; i < end; ++i) out.mutable_data<int64_t>()[i - start] = in[0].dims()[i];
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kShape, ShapeKernel);

Outputs ExpandKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntVector(node, in[1], "input 1 (shape)"));
  for (int64_t d : shape) {
    if (d < 0) return INVALID_ARGUMENT() << Describe(node) << ": shape " << DimsToString(shape) << " has a negative dim";
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(node, {x.dims(), shape}));
  RETURN_IF_ERROR(CheckedNumElements(node, dims, x.dtype()).status());
  ASSIGN_OR_RETURN(ir::Tensor out, StridedCopyOutput(node, ctx, 0, x, dims,
                                                     BroadcastStrides(x.dims(), dims.size()), 0));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kExpand, ExpandKernel);

}  // namespace
}  // namespace onnxpipe::cpu
