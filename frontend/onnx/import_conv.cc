// Conv whose windows tile the input without overlap (strides equal to the kernel, no padding, no
// dilation, one group), lowered at import to a MatMul: a vision transformer's patch embedding
// (ViT, DeiT, CLIP, SigLIP, Swin: a k x k kernel at stride k), and a 1 x 1 (or kernel-1) conv. With
// n spatial dims of sizes H_i, kernel k_i and o_i = floor(H_i / k_i) windows:
//   X (B, C, H_1..H_n) -> [Slice to o_i * k_i] -> Reshape (B, C, o_1, k_1, .., o_n, k_n)
//     -> Transpose (B, o_1..o_n, C, k_1..k_n) -> Reshape (B, o_1..o_n, C * prod k)
//     -> MatMul with W (O, C, k_1..k_n) reshaped to (O, C * prod k) and transposed -> + bias
//     -> Transpose (B, O, o_1..o_n),
// which is the specification's sum over each window; its gradient is that of the ops. AveragePool and
// MaxPool over such windows are the ReduceMean / ReduceMax of the split (B, C, o_1, k_1, ..) over the
// k axes. The spatial dims must be known at import. Any other Conv or pool (overlapping windows,
// padding, dilation, groups, a partial window under ceil_mode, MaxPool's Indices) is refused with an
// error naming the node and the attribute.
#include <algorithm>
#include <string>
#include <vector>

#include "frontend/onnx/importer.h"

namespace onnxpipe::onnx_frontend {
namespace {

using ir::OpKind;

ir::ValueId Ints(ImportContext& ctx, const std::vector<int64_t>& v) {
  return ctx.HelperConstant(ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v));
}

ir::Attrs Perm(std::vector<int64_t> perm) {
  ir::Attrs a;
  a.Set("perm", std::move(perm));
  return a;
}

// The attributes every windowed op shares, checked for windows that tile the input: strides equal to the kernel,
// no dilation, no padding (auto_pad NOTSET or VALID, or any for a kernel of ones).
absl::Status CheckTiling(ImportContext& ctx, const std::vector<int64_t>& kernel, const char* what) {
  const size_t n = kernel.size();
  ASSIGN_OR_RETURN(const std::vector<int64_t> kernel_attr,
                   ctx.attrs().Get<std::vector<int64_t>>("kernel_shape", kernel));
  ASSIGN_OR_RETURN(const std::vector<int64_t> strides,
                   ctx.attrs().Get<std::vector<int64_t>>("strides", std::vector<int64_t>(n, 1)));
  ASSIGN_OR_RETURN(const std::vector<int64_t> dilations,
                   ctx.attrs().Get<std::vector<int64_t>>("dilations", std::vector<int64_t>(n, 1)));
  ASSIGN_OR_RETURN(const std::vector<int64_t> pads,
                   ctx.attrs().Get<std::vector<int64_t>>("pads", std::vector<int64_t>(2 * n, 0)));
  ASSIGN_OR_RETURN(const std::string auto_pad, ctx.attrs().Get<std::string>("auto_pad", "NOTSET"));
  auto refuse = [&](const char* why) -> absl::Status {
    return ctx.Error() << why << "; onnxpipe imports only " << what
                       << " whose windows tile the input (strides equal to the kernel, no padding or dilation)";
  };
  if (kernel_attr != kernel) return ctx.Error() << "kernel_shape does not match the kernel's dims";
  if (strides != kernel) return refuse("has strides other than its kernel (overlapping or skipped windows)");
  if (std::any_of(dilations.begin(), dilations.end(), [](int64_t d) { return d != 1; })) return refuse("is dilated");
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) return refuse("pads its input");
  if (auto_pad != "NOTSET" && auto_pad != "VALID" &&
      !std::all_of(kernel.begin(), kernel.end(), [](int64_t k) { return k == 1; })) {
    return refuse("pads its input (auto_pad)");
  }
  return absl::OkStatus();
}

// X (B, C, H_1..H_n) as (B, C, o_1, k_1, .., o_n, k_n) with o_i = floor(H_i / k_i), the rows and columns outside
// every window sliced off first; `windows` gets the o_i. Takes X's shape by value: emitting nodes moves the graph's
// values.
absl::StatusOr<ir::ValueId> SplitWindows(ImportContext& ctx, const ir::Shape xshape, const std::vector<int64_t>& kernel,
                                         std::vector<int64_t>& windows) {
  const int n = static_cast<int>(kernel.size());
  if (!xshape[1].is_concrete()) return ctx.Error() << "needs X's channel dim known at import";
  windows.assign(n, 0);
  std::vector<int64_t> trim_axes, trim_ends;
  for (int i = 0; i < n; ++i) {
    const ir::Dim& h = xshape[2 + i];
    if (!h.is_concrete()) return ctx.Error() << "needs X's spatial dims known at import; dim " << 2 + i << " is not";
    windows[i] = h.value() / kernel[i];
    if (windows[i] == 0) return ctx.Error() << "X's dim " << 2 + i << " (" << h.value() << ") is under the kernel";
    if (windows[i] * kernel[i] != h.value()) {
      trim_axes.push_back(2 + i);
      trim_ends.push_back(windows[i] * kernel[i]);
    }
  }
  ir::ValueId v = ctx.input(0);
  if (!trim_axes.empty()) {
    v = ctx.EmitHelper(OpKind::kSlice, {v, Ints(ctx, std::vector<int64_t>(trim_axes.size(), 0)), Ints(ctx, trim_ends),
                                        Ints(ctx, trim_axes)});
  }
  std::vector<int64_t> split = {0, xshape[1].value()};  // 0: the batch dim as it is
  for (int i = 0; i < n; ++i) {
    split.push_back(windows[i]);
    split.push_back(kernel[i]);
  }
  return ctx.EmitHelper(OpKind::kReshape, {v, Ints(ctx, split)});
}

ONNX_IMPORTER(Conv) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(2, 3));
  const ir::Value& x = InferredValue(ctx, ctx.input(0));
  const ir::Value& w = InferredValue(ctx, ctx.input(1));
  if (!x.shape_known || x.shape.size() < 3) return ctx.Error() << "needs X's rank (at least 3) known at import";
  if (!w.shape_known || w.shape.size() != x.shape.size() || !ir::IsConcrete(w.shape)) {
    return ctx.Error() << "needs W's shape known at import, of X's rank";
  }
  const int n = static_cast<int>(x.shape.size()) - 2;
  const std::vector<int64_t> wdims = ir::ToInts(w.shape);
  const std::vector<int64_t> kernel(wdims.begin() + 2, wdims.end());
  RETURN_IF_ERROR(CheckTiling(ctx, kernel, "Convs (one group: a patch embedding or a 1 x 1 conv)"));
  ASSIGN_OR_RETURN(const int64_t group, ctx.attrs().Get<int64_t>("group", 1));
  if (group != 1) return ctx.Error() << "has groups; onnxpipe imports only Convs of one group";
  const int64_t channels = wdims[1], out_channels = wdims[0];
  if (!x.shape[1].is_concrete() || x.shape[1].value() != channels) {
    return ctx.Error() << "X has " << x.shape[1].ToString() << " channels; W expects " << channels;
  }
  std::vector<int64_t> windows;
  ASSIGN_OR_RETURN(ir::ValueId v, SplitWindows(ctx, x.shape, kernel, windows));
  std::vector<int64_t> perm = {0}, kernel_axes;
  for (int i = 0; i < n; ++i) {
    perm.push_back(2 + 2 * i);
    kernel_axes.push_back(3 + 2 * i);
  }
  perm.push_back(1);
  perm.insert(perm.end(), kernel_axes.begin(), kernel_axes.end());
  v = ctx.EmitHelper(OpKind::kTranspose, {v}, Perm(perm));
  std::vector<int64_t> rows = {0};
  rows.insert(rows.end(), windows.begin(), windows.end());
  rows.push_back(-1);
  v = ctx.EmitHelper(OpKind::kReshape, {v, Ints(ctx, rows)});
  const ir::ValueId w2 = ctx.EmitHelper(OpKind::kReshape, {ctx.input(1), Ints(ctx, {out_channels, -1})});
  v = ctx.EmitHelper(OpKind::kMatMul, {v, ctx.EmitHelper(OpKind::kTranspose, {w2}, Perm({1, 0}))});
  if (ctx.has_input(2)) v = ctx.EmitHelper(OpKind::kAdd, {v, ctx.input(2)});
  std::vector<int64_t> back = {0, n + 1};
  for (int i = 0; i < n; ++i) back.push_back(1 + i);
  return ctx.Emit(OpKind::kTranspose, {v}, Perm(back));
}

// AveragePool and MaxPool with windows that tile the input: the mean or max over each window's axes.
absl::Status ImportTilingPool(ImportContext& ctx, OpKind reduce, const char* what) {
  RETURN_IF_ERROR(ctx.CheckNumInputs(1, 1));
  if (ctx.num_outputs() > 1) return ctx.Error() << "has an Indices output, which onnxpipe does not import";
  const ir::Value& x = InferredValue(ctx, ctx.input(0));
  if (!x.shape_known || x.shape.size() < 3) return ctx.Error() << "needs X's rank (at least 3) known at import";
  ASSIGN_OR_RETURN(const std::vector<int64_t> kernel, ctx.attrs().Required<std::vector<int64_t>>("kernel_shape"));
  if (kernel.size() + 2 != x.shape.size()) return ctx.Error() << "kernel_shape does not match X's spatial dims";
  RETURN_IF_ERROR(CheckTiling(ctx, kernel, what));
  ASSIGN_OR_RETURN(const int64_t ceil_mode, ctx.attrs().Get<int64_t>("ceil_mode", 0));
  std::vector<int64_t> windows, axes;
  for (size_t i = 0; i < kernel.size(); ++i) {
    const ir::Dim& h = x.shape[2 + i];
    if (ceil_mode != 0 && h.is_concrete() && h.value() % kernel[i] != 0) {
      return ctx.Error() << "ceil_mode 1 with dim " << 2 + i << " (" << h.value() << ") not a multiple of the kernel "
                         << "(a partial window) is not supported";
    }
    axes.push_back(3 + 2 * static_cast<int64_t>(i));
  }
  ASSIGN_OR_RETURN(const ir::ValueId v, SplitWindows(ctx, x.shape, kernel, windows));
  ir::Attrs attrs;
  attrs.Set("axes", axes);
  attrs.Set("keepdims", int64_t{0});
  return ctx.Emit(reduce, {v}, std::move(attrs));
}
ONNX_IMPORTER(AveragePool) { return ImportTilingPool(ctx, OpKind::kReduceMean, "AveragePools"); }
ONNX_IMPORTER(MaxPool) { return ImportTilingPool(ctx, OpKind::kReduceMax, "MaxPools"); }

}  // namespace

void RegisterConvImporter(ImporterRegistry& r) {
  REGISTER_ONNX_IMPORTER(r, Conv);
  REGISTER_ONNX_IMPORTER(r, AveragePool);
  REGISTER_ONNX_IMPORTER(r, MaxPool);
}

}  // namespace onnxpipe::onnx_frontend
