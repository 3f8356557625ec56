// Builds the training graph once; every trainer and the partitioner take it from here, so the partitioned and
// planned executors run exactly what the CPU reference runs.
#include "executor/train/training_graph.h"

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/passes/mixed_precision.h"

namespace onnxpipe::train {
namespace {

ir::DType OtherFloat(ir::DType t) { return t == ir::DType::kF32 ? ir::DType::kF64 : ir::DType::kF32; }

// --no-dropout: the model as PyTorch rebuilds it with p = 0. Setting the ratios to 0 before
// autodiff (rather than only running the forward in inference mode) keeps the backward consistent:
// DropoutGrad scales by 1 / (1 - ratio).
void DisableDropout(ir::Graph& g) {
  for (ir::NodeId id : g.LiveNodes()) {
    ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::kDropout) n.attrs.Set("ratio", 0.0);
    if (n.op == ir::OpKind::kAttention && n.attrs.Has("dropout")) n.attrs.Set("dropout", 0.0);
  }
}

// The value the loss reads: `logits`, or an f32 Cast of it when the graph computes it in half
// precision (the loss and its gradient run in f32). A graph with its own loss keeps it.
std::string F32Logits(ir::Graph& g, const std::string& logits) {
  const ir::ValueId v = g.FindValue(logits);
  if (v == ir::kNoValue || !ir::IsHalf(g.value(v).dtype) || autodiff::FindExistingLoss(g) != ir::kNoValue) {
    return logits;
  }
  const ir::Value& val = g.value(v);
  const std::string name = g.UniqueName(logits + "/f32");
  const ir::ValueId wide = g.AddValue(name, ir::DType::kF32, val.shape, val.shape_known);
  ir::Attrs a;
  a.Set("to", std::string(ir::DTypeName(ir::DType::kF32)));
  g.AddNode(ir::OpKind::kCast, name, {v}, {wide}, std::move(a));
  return name;
}

}  // namespace

absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex) {
  switch (dtype) {
    case ir::DType::kF32:
      return absl::OkStatus();
    case ir::DType::kF64:
      return ir::ConvertFloatPrecision(g, ir::DType::kF32, ir::DType::kF64);
    case ir::DType::kBF16:
      return passes::MixedPrecision({.compute = dtype, .freeze_regex = freeze_regex}).Run(&g).status();
    default:
      return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(dtype);
  }
}

absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward, const std::string& logits,
                                                  const std::string& labels) {
  std::vector<FieldSpec> fields;
  bool labels_is_input = false;
  for (ir::ValueId v : forward.inputs()) {
    const ir::Value& val = forward.value(v);
    if (!val.shape_known || val.shape.empty()) {
      return INVALID_ARGUMENT() << "model input '" << val.name << "' has "
                                << (val.shape_known ? "rank 0" : "no known shape")
                                << "; training data needs a leading batch dim";
    }
    FieldSpec f;
    f.name = val.name;
    f.dtype = val.dtype;
    f.row_shape.assign(val.shape.begin() + 1, val.shape.end());
    if (val.dtype == ir::DType::kF32 || val.dtype == ir::DType::kF64) {
      f.also_accept.push_back(OtherFloat(val.dtype));
    }
    if (val.name == labels) labels_is_input = true;
    fields.push_back(std::move(f));
  }
  if (labels_is_input || autodiff::FindExistingLoss(forward) != ir::kNoValue) return fields;
  const ir::ValueId lv = forward.FindValue(logits);
  if (lv == ir::kNoValue) {
    std::string outs;
    for (ir::ValueId o : forward.outputs()) outs += (outs.empty() ? "'" : ", '") + forward.value(o).name + "'";
    return NOT_FOUND() << "--logits '" << logits << "' is not a value of the model (its outputs: " << outs << ")";
  }
  const ir::Value& l = forward.value(lv);
  if (!l.shape_known || l.shape.size() < 2 || l.shape.size() > 3) {
    return INVALID_ARGUMENT() << "--logits '" << logits << "' has shape " << ir::ShapeToString(l.shape)
                              << "; expected (B, C) or (B, S, V)";
  }
  FieldSpec f;
  f.name = labels;
  f.dtype = ir::DType::kI64;
  f.row_shape.assign(l.shape.begin() + 1, l.shape.end() - 1);
  f.also_accept = {ir::DType::kI32};
  fields.push_back(std::move(f));
  return fields;
}

absl::StatusOr<TrainingGraph> BuildTrainingGraph(const ir::Graph& forward, const TrainOptions& options) {
  if (options.batch < 1) return INVALID_ARGUMENT() << "--batch must be >= 1, got " << options.batch;
  if (options.dtype != ir::DType::kF32 && options.dtype != ir::DType::kF64 && options.dtype != ir::DType::kBF16) {
    return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(options.dtype);
  }
  TrainingGraph t;
  ir::Graph& g = t.graph;
  g = forward;
  RETURN_IF_ERROR(SetTrainingDType(g, options.dtype, options.freeze_regex));
  if (!options.dropout) DisableDropout(g);

  // Phase 1: the loss, in f32 under mixed precision.
  autodiff::CrossEntropyOptions ce;
  ce.ignore_index = options.ignore_index;
  ce.label_smoothing = options.label_smoothing;
  const std::string logits = F32Logits(g, options.logits);
  ASSIGN_OR_RETURN(autodiff::LossInfo loss, autodiff::AddCrossEntropyLoss(&g, logits, options.labels, ce));
  t.loss = loss.loss;
  if (!loss.existing) {
    const ir::Value& lv = g.value(g.FindValue(logits));
    const ir::Dim classes = lv.shape.back();
    if (!classes.is_concrete()) {
      return INVALID_ARGUMENT() << "--logits '" << options.logits << "' has a symbolic class dim "
                                << ir::ShapeToString(lv.shape);
    }
    t.num_classes = classes.value();
  }

  // Phase 2: gradients.
  autodiff::GradOptions go;
  go.freeze_regex = options.freeze_regex;
  ASSIGN_OR_RETURN(autodiff::TrainingGraphInfo grads, autodiff::BuildGradients(&g, t.loss, go));
  for (ir::ValueId v : grads.unreachable_params) t.unreachable.push_back(g.value(v).name);
  for (ir::ValueId v : grads.frozen_params) t.frozen.push_back(g.value(v).name);
  for (const autodiff::ParamGrad& pg : grads.param_grads) {
    t.params.push_back(pg.param);
    t.grads.push_back(pg.grad);
  }

  // Phase 3: norm, clipping, update.
  ASSIGN_OR_RETURN(t.optimizer, autodiff::AddOptimizer(&g, grads.param_grads, options.optimizer));

  // Phase 4: the step's outputs are the loss and the norm only, so that the logits and gradients
  // are freed as soon as the update has read them.
  g.outputs() = {t.loss, t.optimizer.grad_norm};
  if (!loss.existing) t.labels = loss.labels;
  return t;
}

int64_t TrainingGraph::num_trainable_parameters() const {
  int64_t n = 0;
  for (ir::ValueId p : params) n += graph.value(p).constant->num_elements();
  return n;
}

std::vector<ir::Tensor> StepInputs(const TrainingGraph& tg, const Dataset& data, const TrainOptions& options,
                                   int64_t step, double lr) {
  const std::vector<int64_t> rows = data.BatchRows(step, options.batch, options.shuffle, options.seed);
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId v : tg.graph.inputs()) {
    const ir::Value& in = tg.graph.value(v);
    if (v == tg.optimizer.lr) {
      inputs.push_back(ir::Tensor::Scalar<double>(lr));
    } else if (v == tg.optimizer.step) {
      inputs.push_back(ir::Tensor::Scalar<int64_t>(step + 1));
    } else {
      ir::Tensor t = data.Gather(in.name, rows);
      if (t.dtype() != in.dtype) t = t.CastTo(in.dtype);
      inputs.push_back(std::move(t));
    }
  }
  return inputs;
}

}  // namespace onnxpipe::train
