// The flags that shape a training graph (optimizer, loss, which initializers train), shared by `onnxpipe train`,
// `partition` and `profile`: a plan's stage programs are built with partition's, and a rank of `train --plan`
// checks them against its own (executor/pipeline/stage_file.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/graph.h"
#include "tools/flags.h"

namespace onnxpipe::tools {

struct GraphFlags {
  std::string optimizer = "sgd", logits, labels = "labels", freeze, train_only;
  double momentum = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, clip_norm = 0, label_smoothing = 0;
  int64_t ignore_index = -100;
  bool nesterov = false, dropout = true;
};

void AddGraphFlags(FlagSet& fs, GraphFlags* f);

// The training graph's options from the flags and the training dtype; logits default to the model's only output
// (an error naming --logits when it has several).
absl::StatusOr<autodiff::TrainingGraphSpec> SpecOf(const GraphFlags& f, ir::DType dtype, const ir::Graph& model);

}  // namespace onnxpipe::tools
