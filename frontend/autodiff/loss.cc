// Cross-entropy loss construction. The per-token case flattens (B, S, V) -> (B*S, V) rather than
// transposing to ONNX's class-second layout (B, V, S): a flatten is free, a transpose is a copy.
#include "frontend/autodiff/loss.h"

#include <algorithm>

#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {

using ir::ValueId;

ValueId FindExistingLoss(const ir::Graph& g) {
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::kSoftmaxCrossEntropyLoss && !n.outputs.empty()) return n.outputs[0];
  }
  return ir::kNoValue;
}

absl::StatusOr<LossInfo> AddCrossEntropyLoss(ir::Graph* g, const std::string& logits_name,
                                             const std::string& labels_name,
                                             const CrossEntropyOptions& options) {
  RET_CHECK(g != nullptr);
  LossInfo info;
  if (ValueId existing = FindExistingLoss(*g); existing != ir::kNoValue) {
    info.loss = existing;
    info.labels = g->node(g->value(existing).producer).inputs[1];
    info.existing = true;
    if (!g->IsGraphOutput(existing)) g->outputs().push_back(existing);
    return info;
  }
  if (!(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0)) {
    return INVALID_ARGUMENT() << "label smoothing " << options.label_smoothing
                              << " is outside [0, 1]";
  }
  ValueId logits = g->FindValue(logits_name);
  if (logits == ir::kNoValue) {
    return NOT_FOUND() << "--logits '" << logits_name << "' is not a value of graph '" << g->name
                       << "'";
  }
  const ir::Value lv = g->value(logits);
  if (!ir::IsFloat(lv.dtype)) {
    return INVALID_ARGUMENT() << "logits '" << logits_name << "' have dtype "
                              << ir::DTypeName(lv.dtype) << "; expected a float type";
  }
  if (!lv.shape_known) {
    return FAILED_PRECONDITION() << "logits '" << logits_name
                                 << "' have no known shape (run shape inference first)";
  }
  const size_t rank = lv.shape.size();
  CrossEntropyGranularity gran = options.granularity;
  if (gran == CrossEntropyGranularity::kAuto) {
    gran = rank == 3 ? CrossEntropyGranularity::kPerToken : CrossEntropyGranularity::kPerSample;
  }
  const size_t want_rank = gran == CrossEntropyGranularity::kPerToken ? 3 : 2;
  if (rank != want_rank) {
    return INVALID_ARGUMENT() << "logits '" << logits_name << "' have shape "
                              << ir::ShapeToString(lv.shape) << "; expected "
                              << (want_rank == 3 ? "(B, S, V) for a per-token loss"
                                                 : "(B, C) for a per-sample loss");
  }
  // Labels: the logits' shape without the class dim.
  ir::Shape label_shape(lv.shape.begin(), lv.shape.end() - 1);
  ValueId labels = g->FindValue(labels_name);
  if (labels != ir::kNoValue) {
    const ir::Value& l = g->value(labels);
    const bool is_input =
        std::find(g->inputs().begin(), g->inputs().end(), labels) != g->inputs().end();
    if (!is_input || !ir::IsInteger(l.dtype) || (l.shape_known && l.shape != label_shape)) {
      return INVALID_ARGUMENT() << "--labels '" << labels_name << "' names an existing value "
                                << ir::DTypeName(l.dtype) << ir::ShapeToString(l.shape)
                                << "; expected an integer graph input of shape "
                                << ir::ShapeToString(label_shape);
    }
  } else {
    labels = g->AddValue(labels_name, ir::DType::kI64, label_shape);
    g->inputs().push_back(labels);
  }
  info.labels = labels;

  ValueId scores = logits, targets = labels;
  if (gran == CrossEntropyGranularity::kPerToken) {
    ir::Shape flat_shape = {lv.shape[0] * lv.shape[1], lv.shape[2]};
    scores = g->AddValue(g->UniqueName("loss/logits_2d"), lv.dtype, flat_shape);
    ir::Attrs fa;
    fa.Set("axis", int64_t{2});
    g->AddNode(ir::OpKind::kFlatten, "loss/Flatten", {logits}, {scores}, std::move(fa));
    ValueId shape = g->AddConstant(g->UniqueName("loss/labels_shape"),
                                   ir::Tensor::FromVector<int64_t>({1}, {-1}));
    targets = g->AddValue(g->UniqueName("loss/labels_1d"), g->value(labels).dtype,
                          {lv.shape[0] * lv.shape[1]});
    g->AddNode(ir::OpKind::kReshape, "loss/Reshape", {labels, shape}, {targets});
  }
  ir::Attrs a;
  a.Set("reduction", std::string("mean"));
  a.Set("ignore_index", options.ignore_index);
  if (options.label_smoothing != 0.0) a.Set("label_smoothing", options.label_smoothing);
  // Half-precision logits: the loss computes in f32 and is f32 (op.h).
  ValueId loss = g->AddValue(g->UniqueName("loss"), ir::IsHalf(lv.dtype) ? ir::DType::kF32 : lv.dtype, ir::Shape{});
  g->AddNode(ir::OpKind::kSoftmaxCrossEntropyLoss, "loss/SoftmaxCrossEntropyLoss",
             {scores, targets}, {loss}, std::move(a));
  g->outputs().push_back(loss);
  info.loss = loss;
  return info;
}

}  // namespace onnxpipe::autodiff
