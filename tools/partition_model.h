// What `onnxpipe partition` and `onnxpipe profile` share: the training graph of one micro-batch,
// built the way `onnxpipe train` builds it (autodiff::BuildTrainingGraph: mixed precision for bf16, loss,
// gradients, global norm, optimizer update) from a model imported once and bound to the micro-batch size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/graph.h"
#include "tools/model.h"

namespace onnxpipe::tools {

struct TrainingGraphOptions {
  int64_t seq = 0;                // 0: leave the sequence dim as exported
  std::string optimizer = "sgd";  // sgd | adamw
  double momentum = 0;            // SGD momentum (adds a momentum buffer per parameter)
  double clip_norm = 0;           // global-norm clipping
  std::string logits;             // default: the model's only output
  std::string labels = "labels";
  std::string freeze;                 // regex of initializers not trained
  std::string train_only;             // regex of the only initializers trained (autodiff/trainable.h)
  ir::DType dtype = ir::DType::kF32;  // kF32 | kBF16: the training graph `train --dtype` builds
};

// Imports a model once and builds training graphs for any micro-batch size (cached).
class TrainingGraphs {
 public:
  static absl::StatusOr<std::unique_ptr<TrainingGraphs>> Open(const std::string& model_path,
                                                              const TrainingGraphOptions& options);
  // The training graph with the batch dim bound to `microbatch`. Only the latest one is kept (a
  // training graph owns its optimizer state: AdamW doubles the parameters' memory), so a pointer
  // from an earlier call with another size is invalidated.
  absl::StatusOr<const ir::Graph*> Get(int64_t microbatch);
  const Model& model() const { return model_; }
  const std::vector<std::string>& warnings() const { return model_.warnings; }

 private:
  TrainingGraphs() = default;
  std::string path_;
  TrainingGraphOptions options_;
  Model model_;
  std::map<int64_t, autodiff::TrainingGraph> graphs_;
};

}  // namespace onnxpipe::tools
