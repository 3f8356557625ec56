// Gradient rules of Gather, GatherElements and GatherND (GatherGrad, GatherElementsGrad,
// GatherNDGrad: deterministic scatter-adds into zeros shaped like the data), Dropout (DropoutGrad,
// which regenerates the forward's mask) and SoftmaxCrossEntropyLoss (SoftmaxCrossEntropyLossGrad from the forward's saved
// log-probabilities). Indices, labels and class weights are stop-gradient edges.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;

absl::Status GatherGrad(GradBuilder& b) {
  ir::Attrs a;
  a.Set("axis", b.node().attrs.Get<int64_t>("axis", 0));
  b.SetGI(0, b.Emit(OpKind::kGatherGrad, {b.GO(0), b.I(1), b.I(0)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

// GatherElements / GatherND: the backward op takes the forward's attributes (axis / batch_dims).
template <OpKind kGradOp>
absl::Status ScatterBackGrad(GradBuilder& b) {
  b.SetGI(0, b.Emit(kGradOp, {b.GO(0), b.I(1), b.I(0)}, b.TypeOf(b.I(0)), b.node().attrs));
  return absl::OkStatus();
}

// The backward regenerates the forward's mask from its random stream (rng_key), so the forward
// keeps none: one byte per element less of saved activations, written and read.
absl::Status DropoutGrad(GradBuilder& b) {
  ir::Attrs a;
  a.Set("ratio", b.node().attrs.Get<double>("ratio", 0.5));
  a.Set("rng_key", b.node().attrs.Get<std::string>("rng_key", b.node().name));
  b.SetGI(0, b.Emit(OpKind::kDropoutGrad, {b.GO(0)}, b.TypeOf(b.I(0)), std::move(a)));
  return absl::OkStatus();
}

absl::Status SoftmaxCrossEntropyLossGrad(GradBuilder& b) {
  const ValueType ts = b.TypeOf(b.I(0));
  ValueId log_prob = b.EnsureForwardOutput(1, ts);
  std::vector<ValueId> contributions;
  if (b.GO(0) != ir::kNoValue) {
    std::vector<ValueId> ins = {b.GO(0), log_prob, b.I(1)};
    if (b.I(2) != ir::kNoValue) ins.push_back(b.I(2));
    contributions.push_back(b.Emit(OpKind::kSoftmaxCrossEntropyLossGrad, ins, ts, b.node().attrs));
  }
  if (b.GO(1) != ir::kNoValue) {
    // The log-probabilities are a LogSoftmax over the class axis (1).
    ir::Attrs a;
    a.Set("axis", int64_t{1});
    contributions.push_back(b.Emit(OpKind::kLogSoftmaxGrad, {b.GO(1), log_prob}, ts, std::move(a)));
  }
  ValueId g = contributions[0];
  if (contributions.size() == 2) {
    ASSIGN_OR_RETURN(g, b.Add(contributions[0], contributions[1]));
  }
  b.SetGI(0, g);
  return absl::OkStatus();
}

}  // namespace

void RegisterGatherDropoutLossGradients(GradRegistry& r) {
  r.Register(OpKind::kGather, GatherGrad, {1});
  r.Register(OpKind::kGatherElements, ScatterBackGrad<OpKind::kGatherElementsGrad>, {1});
  r.Register(OpKind::kGatherND, ScatterBackGrad<OpKind::kGatherNDGrad>, {1});
  r.Register(OpKind::kDropout, DropoutGrad, {1, 2});
  r.Register(OpKind::kSoftmaxCrossEntropyLoss, SoftmaxCrossEntropyLossGrad, {1, 2});
}

}  // namespace onnxpipe::autodiff
