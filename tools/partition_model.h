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
#include "tools/graph_flags.h"
#include "tools/model.h"

namespace onnxpipe::tools {

struct TrainingGraphOptions {
  int64_t seq = 0;     // 0: leave the sequence dim as exported
  GraphFlags graph;    // optimizer, loss, trained initializers: as train's flags
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
  // The same with what autodiff found, and the options it was built with (the latest Get's).
  absl::StatusOr<const autodiff::TrainingGraph*> GetTraining(int64_t microbatch);
  const autodiff::TrainingGraphSpec& spec() const { return spec_; }
  const Model& model() const { return model_; }
  const std::vector<std::string>& warnings() const { return model_.warnings; }

 private:
  TrainingGraphs() = default;
  std::string path_;
  TrainingGraphOptions options_;
  Model model_;
  std::map<int64_t, autodiff::TrainingGraph> graphs_;
  autodiff::TrainingGraphSpec spec_;
};

}  // namespace onnxpipe::tools
