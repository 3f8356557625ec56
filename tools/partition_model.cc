#include "tools/partition_model.h"

#include "frontend/autodiff/trainable.h"
#include "frontend/ir/status.h"

namespace onnxpipe::tools {

absl::StatusOr<std::unique_ptr<TrainingGraphs>> TrainingGraphs::Open(const std::string& model_path,
                                                                     const TrainingGraphOptions& options) {
  std::unique_ptr<TrainingGraphs> t(new TrainingGraphs());
  t->path_ = model_path;
  t->options_ = options;
  ASSIGN_OR_RETURN(t->model_, ImportModel(model_path, /*allow_unsupported=*/false));
  // The parameters `onnxpipe train` would train with the same --freeze/--train-only, decided before fusion.
  autodiff::TrainableOptions trainable;
  trainable.freeze_regex = options.freeze;
  trainable.train_only_regex = options.train_only;
  ir::Graph& imported = *t->model_.imported;
  if (const ir::ValueId logits = imported.FindValue(options.logits); logits != ir::kNoValue) {
    trainable.targets.push_back(logits);
  }
  RETURN_IF_ERROR(autodiff::MarkTrainable(&imported, trainable).status());
  return t;
}

absl::StatusOr<const ir::Graph*> TrainingGraphs::Get(int64_t microbatch) {
  if (auto it = graphs_.find(microbatch); it != graphs_.end()) return &it->second.graph;
  graphs_.clear();
  // Bind the batch (and sequence) dims, fold and fuse: a fresh copy of the imported graph.
  Model m;
  m.imported = model_.imported;
  ModelOptions mo;
  mo.batch = microbatch;
  mo.seq = options_.seq;
  RETURN_IF_ERROR(PrepareModel(m, mo));
  const ir::Graph& forward = *m.graph;

  autodiff::TrainingGraphSpec to;
  ASSIGN_OR_RETURN(to.optimizer.kind, autodiff::ParseOptimizerKind(options_.optimizer));
  to.optimizer.momentum = options_.momentum;
  to.optimizer.clip_norm = options_.clip_norm;
  to.logits = options_.logits;
  if (to.logits.empty()) {
    if (forward.outputs().size() != 1) {
      return INVALID_ARGUMENT() << path_ << ": the model has " << forward.outputs().size()
                                << " outputs: name the one the loss reads with --logits";
    }
    to.logits = forward.value(forward.outputs()[0]).name;
  }
  to.labels = options_.labels;
  to.freeze_regex = options_.freeze;
  to.dtype = options_.dtype;
  ASSIGN_OR_RETURN(autodiff::TrainingGraph tg, autodiff::BuildTrainingGraph(forward, to));
  return &graphs_.emplace(microbatch, std::move(tg)).first->second.graph;
}

}  // namespace onnxpipe::tools
