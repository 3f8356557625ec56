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
  trainable.freeze_regex = options.graph.freeze;
  trainable.train_only_regex = options.graph.train_only;
  ir::Graph& imported = *t->model_.imported;
  if (const ir::ValueId logits = imported.FindValue(options.graph.logits); logits != ir::kNoValue) {
    trainable.targets.push_back(logits);
  }
  RETURN_IF_ERROR(autodiff::MarkTrainable(&imported, trainable).status());
  return t;
}

absl::StatusOr<const ir::Graph*> TrainingGraphs::Get(int64_t microbatch) {
  ASSIGN_OR_RETURN(const autodiff::TrainingGraph* tg, GetTraining(microbatch));
  return &tg->graph;
}

absl::StatusOr<const autodiff::TrainingGraph*> TrainingGraphs::GetTraining(int64_t microbatch) {
  if (auto it = graphs_.find(microbatch); it != graphs_.end()) return &it->second;
  graphs_.clear();
  // Bind the batch (and sequence) dims, fold and fuse: a fresh copy of the imported graph.
  Model m;
  m.imported = model_.imported;
  ModelOptions mo;
  mo.batch = microbatch;
  mo.seq = options_.seq;
  mo.compute = options_.dtype;
  RETURN_IF_ERROR(PrepareModel(m, mo));
  const ir::Graph& forward = *m.graph;
  absl::StatusOr<autodiff::TrainingGraphSpec> spec = SpecOf(options_.graph, options_.dtype, forward);
  if (!spec.ok()) return Annotate(spec.status(), path_);
  spec_ = *spec;
  ASSIGN_OR_RETURN(autodiff::TrainingGraph tg, autodiff::BuildTrainingGraph(forward, spec_));
  return &graphs_.emplace(microbatch, std::move(tg)).first->second;
}

}  // namespace onnxpipe::tools
