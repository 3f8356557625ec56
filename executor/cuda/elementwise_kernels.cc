// Elementwise ops, broadcasts and reductions in the CUDA backend's kernel table (elementwise.h,
// reduce.h): Add Sub Mul Min Max (f32 bf16 i64 i32), Div Pow ReluGrad (f32 bf16), Equal Less Greater GreaterOrEqual
// LessOrEqual (f32 bf16 i64 i32, to bool), And Not (bool), with numpy broadcasting and both operands of one dtype; Sum
// (f32 bf16, any number of broadcast operands); Where (f32 bf16 i64 i32); Cast (between f32 bf16 i64 i32 bool); unary
// math (f32 bf16; Neg Relu Abs also i64 i32); ReduceSum/ReduceMean (f32 bf16, double accumulation like the CPU;
// ReduceSum also i64 i32, in int64); ReduceToShapeOf and ExpandLike (f32 bf16). bf16 computes in fp32 and rounds each
// output once, as the CPU's fp32 kernel on widened inputs with the result rounded. Other dtypes (f64, f16, the one-byte
// integers) and a Pow with an exponent of another dtype run on the host.
#include <algorithm>

#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/reduce.h"

namespace onnxpipe::cuda {
namespace {

bool IsOneOf(ir::DType t, std::initializer_list<ir::DType> set) {
  for (ir::DType s : set)
    if (t == s) return true;
  return false;
}

// The broadcast shape of `shapes` when the kernels can index it (at most kMaxBroadcastRank dims
// once merged); nullopt otherwise (the CPU kernel then runs, or names the clash).
std::optional<std::vector<int64_t>> Broadcast(const std::vector<std::vector<int64_t>>& shapes) {
  absl::StatusOr<std::vector<int64_t>> dims = BroadcastShape(shapes);
  if (!dims.ok() || !MakeBroadcastIndex(shapes).ok()) return std::nullopt;
  return *dims;
}

KernelResult Single(const absl::Status& st, const ir::Tensor& out) {
  if (!st.ok()) return st;
  return std::vector<ir::Tensor>{out};
}

bool IsCompare(BinaryOp op) {
  return op == BinaryOp::kEqual || op == BinaryOp::kLess || op == BinaryOp::kGreater ||
         op == BinaryOp::kGreaterOrEqual || op == BinaryOp::kLessOrEqual || op == BinaryOp::kAnd;
}

// The dtypes the kernel table runs `op` in: And on bool; Div, Pow and ReluGrad on the float dtypes
// (the CPU's integer division checks divisors on the host, its integer Pow squares); the rest also
// on i64 i32.
bool BinaryCovers(BinaryOp op, ir::DType t) {
  if (op == BinaryOp::kAnd) return t == ir::DType::kBool;
  if (op == BinaryOp::kDiv || op == BinaryOp::kPow || op == BinaryOp::kReluGrad) return IsKernelFloat(t);
  return IsKernelFloat(t) || IsOneOf(t, {ir::DType::kI64, ir::DType::kI32});
}

// out = a op b (bool for the comparisons), both operands of one dtype.
KernelResult BinaryKernel(BinaryOp op, const KernelContext& ctx, const ir::Node& node,
                          const std::vector<ir::Tensor>& in) {
  const ir::DType t = in[0].dtype();
  if (in[1].dtype() != t || !BinaryCovers(op, t)) return std::nullopt;
  if (op == BinaryOp::kReluGrad && in[0].dims() != in[1].dims()) return std::nullopt;  // the CPU's error
  const std::optional<std::vector<int64_t>> dims = Broadcast({in[0].dims(), in[1].dims()});
  if (!dims) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, IsCompare(op) ? ir::DType::kBool : t, *dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  return Single(
      Binary(op, t, in[0].device_raw(), in[0].dims(), in[1].device_raw(), in[1].dims(), out->device_raw(), ctx.stream),
      *out);
}

// Sum(X0, X1, ...): X0 + X1 + ... in input order (the CPU's order). Operands of out's shape (up to
// kMaxDenseSumInputs) add in one pass in fp32, rounded once; otherwise out = 0 + X0, then out += Xi
// by broadcasting additions: in bf16 each of them rounds, so there two operands at most (0 + X0 is
// exact); more broadcast bf16 operands run on the host.
KernelResult SumKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::DType t = in[0].dtype();
  std::vector<std::vector<int64_t>> shapes;
  for (const ir::Tensor& x : in) {
    if (!x.has_data() || x.dtype() != t || !IsKernelFloat(t)) return std::nullopt;
    shapes.push_back(x.dims());
  }
  absl::StatusOr<std::vector<int64_t>> dims = BroadcastShape(shapes);
  if (!dims.ok()) return std::nullopt;
  for (const std::vector<int64_t>& s : shapes)  // each addition indexes (out, Xi)
    if (!Broadcast({*dims, s})) return std::nullopt;
  const bool dense = in.size() <= static_cast<size_t>(kMaxDenseSumInputs) &&
                     std::all_of(shapes.begin(), shapes.end(), [&](const auto& s) { return s == *dims; });
  if (!dense && t != ir::DType::kF32 && in.size() > 2) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = dense ? ctx.FullOutput(node, 0, t, *dims) : ctx.Output(node, 0, t, *dims);
  if (!out.ok()) return out.status();
  const int64_t n = out->num_elements();
  if (n == 0) return std::vector<ir::Tensor>{*out};
  if (dense) {
    std::vector<const void*> xs;
    for (const ir::Tensor& x : in) xs.push_back(x.device_raw());
    return Single(DenseSum(t, xs, out->device_raw(), n, ctx.stream), *out);
  }
  for (const ir::Tensor& x : in) {
    const absl::Status st =
        Binary(BinaryOp::kAdd, t, out->device_raw(), *dims, x.device_raw(), x.dims(), out->device_raw(), ctx.stream);
    if (!st.ok()) return st;
  }
  return std::vector<ir::Tensor>{*out};
}

KernelResult WhereKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::DType t = in[1].dtype();
  if (in[0].dtype() != ir::DType::kBool || in[2].dtype() != t ||
      !IsOneOf(t, {ir::DType::kF32, ir::DType::kBF16, ir::DType::kI64, ir::DType::kI32}))
    return std::nullopt;
  const std::optional<std::vector<int64_t>> dims = Broadcast({in[0].dims(), in[1].dims(), in[2].dims()});
  if (!dims) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, t, *dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  return Single(Where(t, static_cast<const uint8_t*>(in[0].device_raw()), in[0].dims(), in[1].device_raw(),
                      in[1].dims(), in[2].device_raw(), in[2].dims(), out->device_raw(), ctx.stream),
                *out);
}

KernelResult CastKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const std::optional<ir::DType> to = ir::ParseDType(node.attrs.Get<std::string>("to", ""));
  const std::initializer_list<ir::DType> covered = {ir::DType::kF32, ir::DType::kBF16, ir::DType::kI64, ir::DType::kI32,
                                                    ir::DType::kBool};
  if (!to || !IsOneOf(*to, covered) || !IsOneOf(in[0].dtype(), covered)) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, *to, in[0].dims());
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  if (*to == in[0].dtype()) return Single(ctx.backend->Copy(in[0], *out, ctx.exec.stream), *out);
  return Single(Cast(in[0].dtype(), in[0].device_raw(), *to, out->device_raw(), in[0].num_elements(), ctx.stream),
                *out);
}

// y = op(x): Not on bool, Neg Relu Abs also on i64 i32 (wrapping, as the CPU), the rest on the float dtypes.
KernelResult UnaryKernel(UnaryOp op, const KernelContext& ctx, const ir::Node& node,
                         const std::vector<ir::Tensor>& in) {
  const ir::DType t = in[0].dtype();
  const bool integer_ok = op == UnaryOp::kNeg || op == UnaryOp::kRelu || op == UnaryOp::kAbs;
  const bool covered = op == UnaryOp::kNot
                           ? t == ir::DType::kBool
                           : IsKernelFloat(t) || (integer_ok && IsOneOf(t, {ir::DType::kI64, ir::DType::kI32}));
  if (!covered) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.FullOutput(node, 0, t, in[0].dims());
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  return Single(Unary(op, t, in[0].device_raw(), out->device_raw(), in[0].num_elements(), ctx.stream), *out);
}

// ReduceSum / ReduceMean with attrs axes, keepdims, noop_with_empty_axes (the CPU's reduce.cc).
KernelResult ReduceKernel(ReduceKind kind, const KernelContext& ctx, const ir::Node& node,
                          const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  const bool integers = x.dtype() == ir::DType::kI64 || x.dtype() == ir::DType::kI32;
  if (!IsKernelFloat(x.dtype()) && !(integers && kind == ReduceKind::kSum)) return std::nullopt;
  const std::vector<int64_t> axes = node.attrs.Get<std::vector<int64_t>>("axes", {});
  const bool keepdims = node.attrs.Get<int64_t>("keepdims", 1) != 0;
  if (axes.empty() && node.attrs.Get<int64_t>("noop_with_empty_axes", 0) != 0) {
    absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, x.dtype(), x.dims());
    if (!out.ok()) return out.status();
    return Single(ctx.backend->Copy(x, *out, ctx.exec.stream), *out);
  }
  absl::StatusOr<ReducePlan> plan = MakeReducePlan(x.dims(), axes);
  if (!plan.ok()) return std::nullopt;  // the CPU kernel names the bad axis
  std::vector<bool> reduced(x.rank(), axes.empty());
  for (int64_t a : axes) reduced[a < 0 ? a + x.rank() : a] = true;
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (!reduced[d])
      dims.push_back(x.dims()[d]);
    else if (keepdims)
      dims.push_back(1);
  }
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, x.dtype(), dims);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  const int64_t ws_bytes = ReduceWorkspaceBytes(*plan, x.dtype());
  absl::StatusOr<void*> ws = ctx.Workspace(node, ws_bytes);
  if (!ws.ok()) return ws.status();
  return Single(Reduce(kind, *plan, x.dtype(), x.device_raw(), x.dtype(), out->device_raw(), ctx.stream, *ws, ws_bytes),
                *out);
}

// ReduceKernel's slice partials.
int64_t ReduceWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<std::vector<int64_t>> x = InputDims(g, node, 0);
  const std::vector<int64_t> axes = node.attrs.Get<std::vector<int64_t>>("axes", {});
  if (!x || (axes.empty() && node.attrs.Get<int64_t>("noop_with_empty_axes", 0) != 0)) return 0;
  const absl::StatusOr<ReducePlan> plan = MakeReducePlan(*x, axes);
  return plan.ok() ? ReduceWorkspaceBytes(*plan, g.value(node.inputs[0]).dtype) : 0;
}

// ReduceToShapeOf(X, like): X summed to like's shape; a copy when the shapes agree.
KernelResult ReduceToShapeOfKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (!IsKernelFloat(x.dtype())) return std::nullopt;
  absl::StatusOr<ReducePlan> plan = MakeReduceToShapePlan(x.dims(), in[1].dims());
  if (!plan.ok()) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, x.dtype(), in[1].dims());
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  if (x.dims() == in[1].dims()) return Single(ctx.backend->Copy(x, *out, ctx.exec.stream), *out);
  const int64_t ws_bytes = ReduceWorkspaceBytes(*plan, x.dtype());
  absl::StatusOr<void*> ws = ctx.Workspace(node, ws_bytes);
  if (!ws.ok()) return ws.status();
  return Single(Reduce(ReduceKind::kSum, *plan, x.dtype(), x.device_raw(), x.dtype(), out->device_raw(), ctx.stream,
                       *ws, ws_bytes),
                *out);
}

// ReduceToShapeOfKernel's split-columns partials.
int64_t ReduceToShapeOfWorkspace(const ir::Graph& g, const ir::Node& node) {
  const std::optional<std::vector<int64_t>> x = InputDims(g, node, 0), like = InputDims(g, node, 1);
  if (!x || !like || *x == *like) return 0;
  const absl::StatusOr<ReducePlan> plan = MakeReduceToShapePlan(*x, *like);
  return plan.ok() ? ReduceWorkspaceBytes(*plan, g.value(node.inputs[0]).dtype) : 0;
}

// CumSum(X) attrs axis, exclusive, reverse (the importer made the axis input an attribute).
KernelResult CumSumKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (!(IsKernelFloat(x.dtype()) || IsOneOf(x.dtype(), {ir::DType::kI64, ir::DType::kI32})) || x.rank() == 0) {
    return std::nullopt;
  }
  int64_t axis = node.attrs.Get<int64_t>("axis", 0);
  if (axis < 0) axis += x.rank();
  if (axis < 0 || axis >= x.rank()) return std::nullopt;  // the CPU kernel names the bad axis
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dims()[d];
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, x.dtype(), x.dims());
  if (!out.ok()) return out.status();
  return Single(
      CumSum(x.dtype(), x.device_raw(), out->device_raw(), outer, x.dims()[axis], inner,
             node.attrs.Get<int64_t>("exclusive", 0) != 0, node.attrs.Get<int64_t>("reverse", 0) != 0, ctx.stream),
      *out);
}

// ExpandLike(X, like) attrs axes, mean: out = (0 + X broadcast) * s with s = numel(X) / numel(like)
// rounded to fp32 when mean (the CPU's px * s); 0 + X is exact, so a bf16 out rounds once.
KernelResult ExpandLikeKernel(const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[0];
  if (!IsKernelFloat(x.dtype())) return std::nullopt;
  const std::vector<int64_t>& target = in[1].dims();
  std::vector<int64_t> xd = x.dims();
  std::vector<int64_t> axes = node.attrs.Get<std::vector<int64_t>>("axes", {});
  const int64_t out_rank = x.rank() + static_cast<int64_t>(axes.size());
  for (int64_t& a : axes) {
    if (a < 0) a += out_rank;
    if (a < 0 || a >= out_rank) return std::nullopt;
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end()) return std::nullopt;
  for (int64_t a : axes) xd.insert(xd.begin() + a, 1);
  const std::optional<std::vector<int64_t>> bd = Broadcast({xd, target});
  if (!bd || *bd != target) return std::nullopt;
  absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, x.dtype(), target);
  if (!out.ok()) return out.status();
  if (out->num_elements() == 0) return std::vector<ir::Tensor>{*out};
  absl::Status st =
      Binary(BinaryOp::kAdd, x.dtype(), out->device_raw(), target, x.device_raw(), xd, out->device_raw(), ctx.stream);
  if (!st.ok() || node.attrs.Get<int64_t>("mean", 0) == 0) return Single(st, *out);
  const float s = static_cast<float>(static_cast<double>(x.num_elements()) / static_cast<double>(out->num_elements()));
  return Single(Scale(x.dtype(), out->device_raw(), s, out->device_raw(), out->num_elements(), ctx.stream), *out);
}

}  // namespace

void RegisterElementwiseKernels(KernelTable& table) {
  const std::pair<ir::OpKind, BinaryOp> binary[] = {{ir::OpKind::kAdd, BinaryOp::kAdd},
                                                    {ir::OpKind::kSub, BinaryOp::kSub},
                                                    {ir::OpKind::kMul, BinaryOp::kMul},
                                                    {ir::OpKind::kDiv, BinaryOp::kDiv},
                                                    {ir::OpKind::kPow, BinaryOp::kPow},
                                                    {ir::OpKind::kMin, BinaryOp::kMin},
                                                    {ir::OpKind::kMax, BinaryOp::kMax},
                                                    {ir::OpKind::kEqual, BinaryOp::kEqual},
                                                    {ir::OpKind::kLess, BinaryOp::kLess},
                                                    {ir::OpKind::kGreater, BinaryOp::kGreater},
                                                    {ir::OpKind::kAnd, BinaryOp::kAnd},
                                                    {ir::OpKind::kReluGrad, BinaryOp::kReluGrad},
                                                    {ir::OpKind::kGreaterOrEqual, BinaryOp::kGreaterOrEqual},
                                                    {ir::OpKind::kLessOrEqual, BinaryOp::kLessOrEqual}};
  for (const auto& [kind, op] : binary) {
    table[kind].run = [op](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
      return BinaryKernel(op, ctx, node, in);
    };
  }
  const std::pair<ir::OpKind, UnaryOp> unary[] = {
      {ir::OpKind::kSqrt, UnaryOp::kSqrt},       {ir::OpKind::kExp, UnaryOp::kExp},
      {ir::OpKind::kLog, UnaryOp::kLog},         {ir::OpKind::kTanh, UnaryOp::kTanh},
      {ir::OpKind::kSigmoid, UnaryOp::kSigmoid}, {ir::OpKind::kReciprocal, UnaryOp::kReciprocal},
      {ir::OpKind::kNeg, UnaryOp::kNeg},         {ir::OpKind::kRelu, UnaryOp::kRelu},
      {ir::OpKind::kErf, UnaryOp::kErf},         {ir::OpKind::kAbs, UnaryOp::kAbs},
      {ir::OpKind::kSin, UnaryOp::kSin},         {ir::OpKind::kCos, UnaryOp::kCos},
      {ir::OpKind::kNot, UnaryOp::kNot}};
  for (const auto& [kind, op] : unary) {
    table[kind].run = [op](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
      return UnaryKernel(op, ctx, node, in);
    };
  }
  const std::pair<ir::OpKind, ReduceKind> reduce[] = {{ir::OpKind::kReduceSum, ReduceKind::kSum},
                                                      {ir::OpKind::kReduceMean, ReduceKind::kMean}};
  for (const auto& [kind, op] : reduce) {
    table[kind].run = [op](const KernelContext& ctx, const ir::Node& node, const std::vector<ir::Tensor>& in) {
      return ReduceKernel(op, ctx, node, in);
    };
    table[kind].workspace = ReduceWorkspace;
  }
  table[ir::OpKind::kSum].run = SumKernel;
  table[ir::OpKind::kWhere].run = WhereKernel;
  table[ir::OpKind::kCast].run = CastKernel;
  table[ir::OpKind::kReduceToShapeOf] = {ReduceToShapeOfKernel, ReduceToShapeOfWorkspace};
  table[ir::OpKind::kExpandLike].run = ExpandLikeKernel;
  table[ir::OpKind::kCumSum].run = CumSumKernel;
  // ZerosLike(like): the zero-filled output of like's dtype and dims (`like` is read for its dims only).
  table[ir::OpKind::kZerosLike].run = [](const KernelContext& ctx, const ir::Node& node,
                                         const std::vector<ir::Tensor>& in) -> KernelResult {
    absl::StatusOr<ir::Tensor> out = ctx.Output(node, 0, in[0].dtype(), in[0].dims());
    if (!out.ok()) return out.status();
    return std::vector<ir::Tensor>{*out};
  };
}

}  // namespace onnxpipe::cuda
