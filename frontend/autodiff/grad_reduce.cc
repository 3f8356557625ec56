// Gradient rules of reductions: ReduceSum, ReduceMean (dY broadcast back, divided by the reduced
// element count for the mean: one ExpandLike, which works with symbolic dims) and ReduceMax
// (the gradient goes to the maxima; ties share it equally, as torch.amax does), and CumSum (the
// running sum of dY in the other direction, with the same exclusivity).
#include <algorithm>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

struct Reduction {
  std::vector<int64_t> axes;  // sorted, non-negative
  bool keepdims = true;
  bool noop = false;  // empty axes with noop_with_empty_axes: the op is an identity
};

absl::StatusOr<Reduction> ReadReduction(GradBuilder& b) {
  const ir::Attrs& at = b.node().attrs;
  const int64_t r = b.Rank(b.I(0));
  Reduction red;
  red.keepdims = at.Get<int64_t>("keepdims", 1) != 0;
  std::vector<int64_t> axes = at.Get<std::vector<int64_t>>("axes");
  if (axes.empty()) {
    if (at.Get<int64_t>("noop_with_empty_axes", 0) != 0) {
      red.noop = true;
      return red;
    }
    for (int64_t i = 0; i < r; ++i) red.axes.push_back(i);
    return red;
  }
  for (int64_t ax : axes) {
    auto n = NormalizeAxis(ax, r);
    if (!n.ok()) return b.Error(std::string(n.status().message()));
    red.axes.push_back(*n);
  }
  std::sort(red.axes.begin(), red.axes.end());
  red.axes.erase(std::unique(red.axes.begin(), red.axes.end()), red.axes.end());
  return red;
}

absl::Status ReduceSumMeanGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(Reduction red, ReadReduction(b));
  if (red.noop) {
    b.SetGI(0, b.GO(0));
    return absl::OkStatus();
  }
  const bool mean = b.node().op == OpKind::kReduceMean;
  b.SetGI(0, b.ExpandLike(b.GO(0), b.I(0), red.keepdims ? std::vector<int64_t>{} : red.axes, mean));
  return absl::OkStatus();
}

absl::Status ReduceMaxGrad(GradBuilder& b) {
  ASSIGN_OR_RETURN(Reduction red, ReadReduction(b));
  if (red.noop) {
    b.SetGI(0, b.GO(0));
    return absl::OkStatus();
  }
  ValueId x = b.I(0);
  const ValueType tx = b.TypeOf(x);
  const std::vector<int64_t> ins_axes = red.keepdims ? std::vector<int64_t>{} : red.axes;
  ValueId ymax = b.ExpandLike(b.O(0), x, ins_axes, /*mean=*/false);
  ValueId is_max = b.Emit(OpKind::kEqual, {x, ymax}, ValueType{ir::DType::kBool, tx.shape, tx.shape_known});
  ValueId w = b.Cast(is_max, tx.dtype);
  ValueType tc = tx;
  if (tc.shape_known)
    for (int64_t ax : red.axes) tc.shape[ax] = ir::Dim(1);
  ir::Attrs a;
  a.Set("axes", red.axes);
  a.Set("keepdims", int64_t{1});
  ValueId count = b.Emit(OpKind::kReduceSum, {w}, tc, std::move(a));
  ASSIGN_OR_RETURN(ValueId share, b.Div(w, count));
  ASSIGN_OR_RETURN(ValueId dx, b.Mul(b.ExpandLike(b.GO(0), x, ins_axes, false), share));
  b.SetGI(0, dx);
  return absl::OkStatus();
}

absl::Status CumSumGrad(GradBuilder& b) {
  ir::Attrs a = b.node().attrs;
  a.Set("reverse", int64_t{a.Get<int64_t>("reverse", 0) == 0 ? 1 : 0});
  b.SetGI(0, b.Emit(OpKind::kCumSum, {b.GO(0)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

}  // namespace

void RegisterReduceGradients(GradRegistry& r) {
  r.Register(OpKind::kCumSum, CumSumGrad);
  r.Register(OpKind::kReduceSum, ReduceSumMeanGrad, {1});
  r.Register(OpKind::kReduceMean, ReduceSumMeanGrad, {1});
  r.Register(OpKind::kReduceMax, ReduceMaxGrad, {1});
}

}  // namespace onnxpipe::autodiff
