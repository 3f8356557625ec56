// Builds the training graph once; every trainer and the partitioner take it from here, so the partitioned and
// planned executors run exactly what the CPU reference runs.
#include "frontend/autodiff/training_graph.h"

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/passes/cast_into_gemm.h"
#include "frontend/passes/ksum_from_producer.h"
#include "frontend/passes/mixed_precision.h"
#include "frontend/passes/sum_into_norm_grad.h"

namespace onnxpipe::autodiff {
namespace {

// --no-dropout: the model as PyTorch rebuilds it with p = 0. Setting the ratios to 0 before
// autodiff (rather than only running the forward in inference mode) keeps the backward consistent:
// DropoutGrad scales by 1 / (1 - ratio).
void DisableDropout(ir::Graph& g) {
  for (ir::NodeId id : g.LiveNodes()) {
    ir::Node& n = g.node(id);
    if (n.op == ir::OpKind::kDropout) n.attrs.Set("ratio", 0.0);
    if (n.attrs.Has("dropout")) n.attrs.Set("dropout", 0.0);  // Attention's, a fused one (op.h)
  }
}

// The value the loss reads: `logits` as the graph computes them. The loss reads half-precision logits
// directly and computes in f32 inside its kernels (op.h), so under mixed precision that is the bf16
// value, and the f32 copy MixedPrecision made of it as a graph output (a Cast under the output's name)
// is removed when nothing else reads it: nothing of (rows x vocabulary) f32 remains around the loss.
// A graph with its own loss keeps it.
std::string LossLogits(ir::Graph& g, const std::string& logits) {
  const ir::ValueId v = g.FindValue(logits);
  if (v == ir::kNoValue || FindExistingLoss(g) != ir::kNoValue || g.value(v).dtype != ir::DType::kF32) return logits;
  const ir::NodeId cast = g.value(v).producer;
  if (cast == ir::kNoNode || g.node(cast).op != ir::OpKind::kCast) return logits;
  const ir::ValueId half = g.node(cast).inputs[0];
  if (!ir::IsHalf(g.value(half).dtype)) return logits;
  if (g.ComputeUses()[v].empty()) {
    std::erase(g.outputs(), v);
    g.RemoveNode(cast);
  }
  return g.value(half).name;
}
}  // namespace

absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex) {
  switch (dtype) {
    case ir::DType::kF32:
      return absl::OkStatus();
    case ir::DType::kF64:
      return ir::ConvertComputePrecision(g, ir::DType::kF32, ir::DType::kF64);
    case ir::DType::kBF16:
      return passes::MixedPrecision({.compute = dtype, .freeze_regex = freeze_regex}).Run(&g).status();
    default:
      return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(dtype);
  }
}

absl::StatusOr<TrainingGraph> BuildTrainingGraph(const ir::Graph& forward, const TrainingGraphSpec& spec) {
  if (spec.dtype != ir::DType::kF32 && spec.dtype != ir::DType::kF64 && spec.dtype != ir::DType::kBF16) {
    return INVALID_ARGUMENT() << "training dtype must be f32, f64 or bf16, got " << ir::DTypeName(spec.dtype);
  }
  TrainingGraph t;
  ir::Graph& g = t.graph;
  g = forward;
  RETURN_IF_ERROR(SetTrainingDType(g, spec.dtype, spec.freeze_regex));
  if (!spec.dropout) DisableDropout(g);

  // Phase 1: the loss (an f32 value, from bf16 logits under mixed precision).
  CrossEntropyOptions ce;
  ce.ignore_index = spec.ignore_index;
  ce.label_smoothing = spec.label_smoothing;
  const std::string logits = LossLogits(g, spec.logits);
  ASSIGN_OR_RETURN(LossInfo loss, AddCrossEntropyLoss(&g, logits, spec.labels, ce));
  t.loss = loss.loss;
  if (!loss.existing) {
    const ir::Value& lv = g.value(g.FindValue(logits));
    const ir::Dim classes = lv.shape.back();
    if (!classes.is_concrete()) {
      return INVALID_ARGUMENT() << "--logits '" << spec.logits << "' has a symbolic class dim "
                                << ir::ShapeToString(lv.shape);
    }
    t.num_classes = classes.value();
  }

  // Phase 2: gradients.
  GradOptions go;
  go.freeze_regex = spec.freeze_regex;
  ASSIGN_OR_RETURN(TrainingGraphInfo grads, BuildGradients(&g, t.loss, go));
  // Under mixed precision the weight-gradient GEMMs write their f32 masters' gradients themselves.
  if (spec.dtype == ir::DType::kBF16) RETURN_IF_ERROR(passes::CastIntoGemm().Run(&g).status());
  // A normalisation's incoming gradient summed over its output's readers is added as it is loaded.
  RETURN_IF_ERROR(passes::SumIntoNormGrad().Run(&g).status());
  // A bias gradient is summed by the kernel that writes its Linear's incoming gradient, where one can.
  RETURN_IF_ERROR(passes::KSumFromProducer().Run(&g).status());
  for (ir::ValueId v : grads.unreachable_params) t.unreachable.push_back(g.value(v).name);
  for (ir::ValueId v : grads.frozen_params) t.frozen.push_back(g.value(v).name);
  for (const ParamGrad& pg : grads.param_grads) {
    t.params.push_back(pg.param);
    t.grads.push_back(pg.grad);
  }

  // Phase 3: norm, clipping, update.
  ASSIGN_OR_RETURN(t.optimizer, AddOptimizer(&g, grads.param_grads, spec.optimizer));

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

}  // namespace onnxpipe::autodiff
