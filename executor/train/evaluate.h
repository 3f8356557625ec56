// Evaluation of a trained classifier on a held-out split (`onnxpipe train --eval`): the forward graph in inference
// mode (every Dropout the identity) with the trained parameters, batch by batch, on the CPU kernels or the training
// backend, and the accuracy and mean cross-entropy of its logits computed on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "executor/train/dataset.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

struct EvalResult {
  int64_t samples = 0;  // rows evaluated
  int64_t counted = 0;  // predictions scored (labels other than the ignore index)
  double accuracy = 0;  // argmax(logits) == label, over the counted predictions
  double loss = 0;      // mean cross-entropy (no label smoothing) over the counted predictions
  int64_t correct = 0;  // the sums behind them (to add shards' results)
  double loss_sum = 0;
};

struct EvalOptions {
  std::string logits;           // the forward graph value holding (B, C) or (B, S, V) logits
  std::string labels = "labels";
  int64_t batch = 0;            // rows per forward pass: the batch the graph is bound to
  ir::DType dtype = ir::DType::kF32;  // run in this float precision (the training dtype)
  int64_t ignore_index = -100;
  // Evaluates the batches b (of `batch` rows, in order) with b % shards == shard: a data-parallel rank's share.
  int64_t shard = 0, shards = 1;
  // Where the nodes run: an evaluator made for the evaluated graph (which outlives it) that hands the graph's outputs
  // back on the host (backend::BackendEvaluator::Resident, the training backend); unset: the CPU kernels.
  std::function<absl::StatusOr<std::unique_ptr<ir::OpEvaluator>>(const ir::Graph&)> evaluator;
};

// `forward`: a prepared forward graph (batch bound to options.batch). `params`: trained values by initializer name
// (any float dtype; converted to the run's). Every row of `data` is evaluated once; the last partial batch is
// filled by repeating rows whose predictions are not counted. `samples` is data's rows whatever the shard.
absl::StatusOr<EvalResult> Evaluate(const ir::Graph& forward, const std::map<std::string, ir::Tensor>& params,
                                    const Dataset& data, const EvalOptions& options);

}  // namespace onnxpipe::train
