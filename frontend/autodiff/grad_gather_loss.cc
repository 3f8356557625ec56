// Gradient rules of Gather, GatherElements and GatherND (GatherGrad, GatherElementsGrad,
// GatherNDGrad: deterministic scatter-adds into zeros shaped like the data), Dropout (DropoutGrad,
// which regenerates the forward's mask) and SoftmaxCrossEntropyLoss (SoftmaxCrossEntropyLossGrad from the scores and
// the forward's per-position Stats, or from its log-probabilities when the graph has them anyway). Indices, labels and
// class weights are stop-gradient edges.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/precision.h"
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

// The forward keeps two numbers per position (Stats) rather than log_prob, (N, C, ...) in f32, and the backward
// recomputes log_prob from the scores, which a half-precision graph holds in half precision: dScores come out in the
// scores' dtype without an f32 copy of the logits, of log_prob or of dScores. A forward that outputs log_prob for the
// graph (an ONNX model asking for it) has it anyway: the gradient reads it, as log_prob's own gradient does, and is
// cast to the scores' dtype when they are half.
absl::Status SoftmaxCrossEntropyLossGrad(GradBuilder& b) {
  const ValueType ts = b.TypeOf(b.I(0));
  const ir::DType compute = ir::IsHalf(ts.dtype) ? ir::DType::kF32 : ts.dtype;
  const bool has_log_prob = b.O(1) != ir::kNoValue;
  std::vector<ValueId> contributions;
  if (b.GO(0) != ir::kNoValue) {
    std::vector<ValueId> ins;
    if (has_log_prob) {
      ins = {b.GO(0), b.O(1), b.I(1), b.I(2)};
    } else {
      ValueType stats{compute, {}, ts.shape_known};
      if (ts.shape_known) {
        stats.shape = ts.shape;
        stats.shape.erase(stats.shape.begin() + 1);  // the labels' dims (N, D1, ...)
        stats.shape.push_back(ir::Dim(2));
      }
      ins = {b.GO(0), b.I(0), b.I(1), b.I(2), b.EnsureForwardOutput(2, stats)};
    }
    if (ins.size() == 4 && ins[3] == ir::kNoValue) ins.pop_back();
    const ValueType out = has_log_prob ? b.TypeOf(b.O(1)) : ts;
    contributions.push_back(b.Emit(OpKind::kSoftmaxCrossEntropyLossGrad, ins, out, b.node().attrs));
  }
  if (b.GO(1) != ir::kNoValue) {
    // The log-probabilities are a LogSoftmax over the class axis (1).
    ir::Attrs a;
    a.Set("axis", int64_t{1});
    contributions.push_back(b.Emit(OpKind::kLogSoftmaxGrad, {b.GO(1), b.O(1)}, b.TypeOf(b.O(1)), std::move(a)));
  }
  ValueId g = contributions[0];
  if (contributions.size() == 2) {
    ASSIGN_OR_RETURN(g, b.Add(contributions[0], contributions[1]));
  }
  if (b.TypeOf(g).dtype != ts.dtype) g = b.Cast(g, ts.dtype);  // from log_prob's f32 to half scores
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
