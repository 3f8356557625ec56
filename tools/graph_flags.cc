#include "tools/graph_flags.h"

#include "frontend/ir/status.h"

namespace onnxpipe::tools {

void AddGraphFlags(FlagSet& fs, GraphFlags* f) {
  fs.String("optimizer", &f->optimizer, "sgd | adamw (AdamW keeps two state tensors per parameter)");
  fs.Double("momentum", &f->momentum, "SGD momentum (adds a buffer per parameter)");
  fs.Bool("nesterov", &f->nesterov, "SGD Nesterov momentum");
  fs.Double("weight-decay", &f->weight_decay, "SGD L2 / AdamW decoupled weight decay, every parameter");
  fs.Double("beta1", &f->beta1, "AdamW beta1");
  fs.Double("beta2", &f->beta2, "AdamW beta2");
  fs.Double("eps", &f->eps, "AdamW epsilon");
  fs.Double("clip-norm", &f->clip_norm, "clip the global gradient norm to this (0: off)");
  fs.String("logits", &f->logits, "the model value the loss reads (default: the only output)");
  fs.String("labels", &f->labels, "labels name: <labels>.npy in --data, the labels input the loss adds");
  fs.Double("label-smoothing", &f->label_smoothing, "cross-entropy label smoothing in [0, 1]");
  fs.Int("ignore-index", &f->ignore_index, "label value that contributes no loss");
  fs.String("freeze", &f->freeze,
            "regex of initializer names not to train, besides the buffers and exporter constants found by the rule "
            "of frontend/autodiff/trainable.h (printed at the start)");
  fs.String("train-only", &f->train_only,
            "regex of the initializer names to train, overriding the rule: every other initializer is frozen "
            "(--freeze still wins)");
  fs.Bool("dropout", &f->dropout, "--no-dropout makes every Dropout the identity");
}

absl::StatusOr<autodiff::TrainingGraphSpec> SpecOf(const GraphFlags& f, ir::DType dtype, const ir::Graph& model) {
  autodiff::TrainingGraphSpec s;
  ASSIGN_OR_RETURN(s.optimizer.kind, autodiff::ParseOptimizerKind(f.optimizer));
  s.optimizer.momentum = f.momentum;
  s.optimizer.nesterov = f.nesterov;
  s.optimizer.weight_decay = f.weight_decay;
  s.optimizer.beta1 = f.beta1;
  s.optimizer.beta2 = f.beta2;
  s.optimizer.eps = f.eps;
  s.optimizer.clip_norm = f.clip_norm;
  s.logits = f.logits;
  if (s.logits.empty()) {
    if (model.outputs().size() != 1) {
      return INVALID_ARGUMENT() << "the model has " << model.outputs().size()
                                << " outputs: name the one the loss reads with --logits";
    }
    s.logits = model.value(model.outputs()[0]).name;
  }
  s.labels = f.labels;
  s.freeze_regex = f.freeze;
  s.dtype = dtype;
  s.dropout = f.dropout;
  s.label_smoothing = f.label_smoothing;
  s.ignore_index = f.ignore_index;
  return s;
}

}  // namespace onnxpipe::tools
