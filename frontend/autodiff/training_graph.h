// The training graph every trainer runs, built once from a prepared forward graph (symbols bound to the batch and
// sequence length, folded and fused: tools/model.h's PrepareModel):
//   forward -> cross-entropy loss (loss.h) -> gradients (autodiff.h)
//   -> global gradient norm, optional clipping and the optimizer update (optimizer.h)
// whose outputs are the loss and the gradient norm; its inputs are the data fields, the labels, the learning rate
// and the 1-based step count; Graph::state_updates() names the parameters and optimizer state a step updates.
// The pipeline's stage executor (executor/pipeline, one stage by default) and the CPU reference
// (executor/train/trainer.h) train it, and the partitioner plans it (tools/partition_model.h), so the planned and
// the trained graphs are one graph. Its own library (onnxpipe_training_graph): mixed precision is a pass, and the
// passes depend on the autodiff's gradient registry.
//
// fp64 (TrainingGraphSpec::dtype) converts the whole graph to double before the loss is added. bf16 is mixed
// precision (passes/mixed_precision.h): bf16 activations, f32 master weights read through a Cast per use, the loss
// computed in f32 from logits cast to f32, so the gradients, their norm, clipping, the optimizer and its state are
// f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

// What the training graph is: its dtype, loss, frozen parameters and optimizer.
struct TrainingGraphSpec {
  OptimizerOptions optimizer;
  std::string logits;                 // the graph value the loss reads
  std::string labels = "labels";      // the labels' name (a graph input of the training graph)
  std::string freeze_regex;           // initializers never trained (std::regex_search on their names)
  ir::DType dtype = ir::DType::kF32;  // kF32 | kF64 | kBF16 (mixed precision)
  bool dropout = true;                // false: every dropout ratio is 0 (the model as PyTorch rebuilds it with p = 0)
  double label_smoothing = 0.0;
  int64_t ignore_index = -100;
};

// Makes a prepared f32 forward graph compute in the training dtype: kF64 converts every f32 value,
// kBF16 applies passes::MixedPrecision (trainable parameters stay f32 masters; `freeze_regex` names
// the frozen ones as GradOptions does); kF32 leaves it. The evaluation of a trained model uses it too.
absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex);

struct TrainingGraph {
  ir::Graph graph;
  OptimizerGraphInfo optimizer;
  ir::ValueId loss = ir::kNoValue, labels = ir::kNoValue;  // labels: kNoValue when the model has its own loss
  std::vector<ir::ValueId> params, grads;                  // grads[i] is the gradient of params[i]
  // Float initializers the loss does not depend on (not trained; worth a warning) and those frozen by the regex.
  std::vector<std::string> unreachable, frozen;
  int64_t num_classes = 0;  // the logits' class dim (0 when the model has its own loss)

  int64_t num_trainable_parameters() const;
};

// Builds the training graph of `forward` (prepared, f32) for `spec`.
absl::StatusOr<TrainingGraph> BuildTrainingGraph(const ir::Graph& forward, const TrainingGraphSpec& spec);

}  // namespace onnxpipe::autodiff
