// The training graph of `onnxpipe train`, built once from a prepared forward graph (symbols bound to the batch and
// sequence length, folded and fused: tools/model.h's PrepareModel):
//   forward -> cross-entropy loss (frontend/autodiff/loss.h) -> gradients (autodiff.h)
//   -> global gradient norm, optional clipping and the optimizer update (optimizer.h)
// whose outputs are the loss and the gradient norm; its inputs are the data fields, the labels, the learning rate
// and the 1-based step count; Graph::state_updates() names the parameters and optimizer state a step updates.
// Every trainer runs this graph: the pipeline's stage executor (executor/pipeline, one stage by default), the CPU
// reference (trainer.h), and the partitioner plans it (tools/partition_model.h).
//
// fp64 (TrainOptions::dtype) converts the whole graph to double before the loss is added; float data is converted
// on the fly. bf16 is mixed precision (passes/mixed_precision.h): bf16 activations, f32 master weights read through
// a Cast per use, the loss computed in f32 from logits cast to f32, so the gradients, their norm, clipping, the
// optimizer and its state are f32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/train/dataset.h"
#include "frontend/autodiff/lr_schedule.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

struct TrainOptions {
  int64_t batch = 0;
  int64_t steps = 0;
  autodiff::OptimizerOptions optimizer;
  double lr = 0.0;
  autodiff::LrScheduleKind schedule = autodiff::LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  std::string logits;                 // the graph value the loss reads
  std::string labels = "labels";      // the labels' name: graph input and <labels>.npy
  std::string freeze_regex;           // initializers never trained (std::regex_search on their names)
  ir::DType dtype = ir::DType::kF32;  // kF32 | kF64 | kBF16 (mixed precision)
  uint64_t seed = 0;
  bool shuffle = false;
  bool dropout = true;          // false: every Dropout is the identity (EvalContext training off)
  bool check_numerics = false;  // name the first node producing NaN/Inf
  double label_smoothing = 0.0;
  int64_t ignore_index = -100;
};

// What the data folder must hold for a forward graph (as imported, before binding): one field per
// graph input (its dtype and dims after the batch dim) and the labels (int64, the logits' dims
// between the batch and the class dim). Float inputs also accept the other float width.
absl::StatusOr<std::vector<FieldSpec>> DataFields(const ir::Graph& forward, const std::string& logits,
                                                  const std::string& labels);

// Makes a prepared f32 forward graph compute in the training dtype: kF64 converts every f32 value,
// kBF16 applies passes::MixedPrecision (trainable parameters stay f32 masters; `freeze_regex` names
// the frozen ones as GradOptions does); kF32 leaves it. The evaluation of a trained model uses it too.
absl::Status SetTrainingDType(ir::Graph& g, ir::DType dtype, const std::string& freeze_regex);

struct TrainingGraph {
  ir::Graph graph;
  autodiff::OptimizerGraphInfo optimizer;
  ir::ValueId loss = ir::kNoValue, labels = ir::kNoValue;  // labels: kNoValue when the model has its own loss
  std::vector<ir::ValueId> params, grads;                  // grads[i] is the gradient of params[i]
  // Float initializers the loss does not depend on (not trained; worth a warning) and those frozen by the regex.
  std::vector<std::string> unreachable, frozen;
  int64_t num_classes = 0;  // the logits' class dim (0 when the model has its own loss)

  int64_t num_trainable_parameters() const;
};

// Builds the training graph of `forward` (prepared, f32) for `options` (its dtype, loss, freezing and optimizer).
absl::StatusOr<TrainingGraph> BuildTrainingGraph(const ir::Graph& forward, const TrainOptions& options);

// The inputs of step `step` (0-based) of the training graph, in graph-input order: its batch rows of the data (cast
// to the graph's dtype), the learning rate `lr` and the step count step + 1.
std::vector<ir::Tensor> StepInputs(const TrainingGraph& tg, const Dataset& data, const TrainOptions& options,
                                   int64_t step, double lr);

}  // namespace onnxpipe::train
