// The metadata's `extra` object carries the run settings the checkpoint format has no field for; each is compared
// on resume because any of them changes the sequence of updates.
#include "executor/train/train_checkpoint.h"

#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::train {
namespace {

// `checkpoint` with the compute copies (autodiff::OptimizerOptions::compute_copies: state named ComputeCopyName) it
// lacks, where the trainer holds them: a checkpoint written before they were state. Each is its parameter cast, as
// the training graph makes it, so the resumed run is the one the checkpoint's own run would have continued with.
io::Checkpoint WithComputeCopies(const io::Checkpoint& checkpoint, const std::map<std::string, ir::Tensor>& shapes) {
  io::Checkpoint full = checkpoint;
  for (const auto& [name, shape] : shapes) {
    if (checkpoint.Find(name) != nullptr || !ir::IsHalf(shape.dtype())) continue;
    const std::string suffix = autodiff::ComputeCopyName("", shape.dtype());
    if (!name.ends_with(suffix)) continue;
    const ir::Tensor* param = checkpoint.Find(name.substr(0, name.size() - suffix.size()));
    if (param == nullptr || param->dtype() != ir::DType::kF32 || param->dims() != shape.dims()) continue;
    full.tensors.push_back({name, param->CastTo(shape.dtype())});
  }
  return full;
}

std::string OptimizerName(const autodiff::OptimizerOptions& o) {
  return o.kind == autodiff::OptimizerKind::kAdamW ? "adamw" : "sgd";
}

std::map<std::string, double> Hyperparameters(const TrainOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.optimizer.momentum},
          {"nesterov", o.optimizer.nesterov ? 1.0 : 0.0},
          {"weight_decay", o.optimizer.weight_decay},
          {"beta1", o.optimizer.beta1},
          {"beta2", o.optimizer.beta2},
          {"eps", o.optimizer.eps},
          {"clip_norm", o.optimizer.clip_norm},
          {"warmup_steps", static_cast<double>(o.warmup_steps)},
          {"label_smoothing", o.label_smoothing}};
}

nlohmann::json Settings(const RunIdentity& run) {
  const TrainOptions& o = run.options;
  return {{"dtype", std::string(ir::DTypeName(o.dtype))},
          {"batch", o.batch},
          {"seed", o.seed},
          {"shuffle", o.shuffle},
          {"dropout", o.dropout},
          {"logits", o.logits},
          {"labels", o.labels},
          {"freeze", o.freeze_regex},
          {"data_rows", run.data_rows},
          {"vocab", run.vocab_file},
          {"vocab_crc32c", run.vocab_crc32c}};
}

std::string Show(const nlohmann::json& j) { return j.is_string() ? "'" + j.get<std::string>() + "'" : j.dump(); }

}  // namespace

io::Checkpoint MakeCheckpoint(const StepTrainer& trainer, const RunIdentity& run) {
  io::Checkpoint c;
  io::CheckpointMetadata& m = c.metadata;
  m.step = trainer.step();
  const int64_t consumed = trainer.step() * run.options.batch;
  m.epoch = run.data_rows > 0 ? consumed / run.data_rows : 0;
  m.data_position = run.data_rows > 0 ? consumed % run.data_rows : 0;
  m.rng_seed = run.options.seed;
  m.rng_offset = static_cast<uint64_t>(trainer.step());  // the dropout offset of the next step
  m.optimizer = OptimizerName(run.options.optimizer);
  m.hyperparameters = Hyperparameters(run.options);
  m.model = run.model;
  m.extra = Settings(run);
  for (auto& [name, t] : trainer.State()) c.tensors.push_back({name, t});
  return c;
}

absl::StatusOr<std::vector<std::string>> RestoreCheckpoint(const io::Checkpoint& checkpoint,
                                                           const RunIdentity& run, StepTrainer& trainer) {
  const io::CheckpointMetadata& m = checkpoint.metadata;
  const std::string where = "checkpoint '" + checkpoint.path + "'";
  if (!(m.model == run.model)) {
    return FAILED_PRECONDITION() << where << " was written for another model file (" << m.model.ToString()
                                 << ") than '" << run.model_path << "' (" << run.model.ToString() << ")";
  }
  if (m.optimizer != OptimizerName(run.options.optimizer)) {
    return FAILED_PRECONDITION() << where << " holds the state of optimizer '" << m.optimizer
                                 << "', but this run uses --optimizer " << OptimizerName(run.options.optimizer);
  }
  const nlohmann::json want = Settings(run);
  for (const auto& [key, value] : want.items()) {
    if (!m.extra.contains(key)) return FAILED_PRECONDITION() << where << " has no run setting '" << key << "'";
    if (m.extra[key] != value) {
      return FAILED_PRECONDITION() << where << " was written with " << key << " " << Show(m.extra[key])
                                   << ", but this run has " << Show(value)
                                   << " (a resumed run must use the same setting"
                                   << (key == "shuffle" ? ": --shuffle or --no-shuffle; text data is shuffled by "
                                                          "default, npy data is not"
                                                        : "")
                                   << ")";
    }
  }
  std::vector<io::TensorSpec> specs;
  const std::map<std::string, ir::Tensor> shapes = trainer.StateShapes();
  for (const auto& [name, t] : shapes) specs.push_back({name, t.dtype(), t.dims()});
  const io::Checkpoint full = WithComputeCopies(checkpoint, shapes);
  RETURN_IF_ERROR(io::CheckCompatible(full, specs, run.model));
  std::map<std::string, ir::Tensor> state;
  for (const io::NamedTensor& t : full.tensors) state[t.name] = t.tensor;
  RETURN_IF_ERROR(trainer.Restore(state, m.step));
  std::vector<std::string> warnings;
  for (const auto& [key, value] : Hyperparameters(run.options)) {
    auto it = m.hyperparameters.find(key);
    if (it != m.hyperparameters.end() && it->second != value) {
      warnings.push_back(where + " was trained with " + key + " " + std::to_string(it->second) +
                         "; continuing with " + std::to_string(value));
    }
  }
  return warnings;
}

}  // namespace onnxpipe::train
