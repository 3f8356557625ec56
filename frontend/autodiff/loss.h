// Losses appended to a forward graph before autodiff.
//
// AddCrossEntropyLoss: mean cross-entropy between the graph value `logits_name` and integer class
// labels, as PyTorch's CrossEntropyLoss(ignore_index, label_smoothing, reduction="mean"):
//   per sample: logits (B, C),    labels (B);
//   per token:  logits (B, S, V), labels (B, S)  (flattened to (B*S, V) / (B*S) first, so the mean
//               runs over all non-ignored tokens of the batch).
// It adds an int64 graph input named `labels_name` (or reuses an existing graph input of that name
// when its dtype and shape fit) and one SoftmaxCrossEntropyLoss node (reduction "mean",
// ignore_index, label_smoothing attrs) whose scalar output becomes a graph output.
// When the graph already computes a SoftmaxCrossEntropyLoss, that output is the loss as is (its
// labels are whatever the model feeds it) and nothing is added.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

enum class CrossEntropyGranularity {
  kAuto,       // from the logits' rank: 2 -> per sample, 3 -> per token
  kPerSample,  // logits (B, C)
  kPerToken,   // logits (B, S, V)
};

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // in [0, 1]
  CrossEntropyGranularity granularity = CrossEntropyGranularity::kAuto;
};

struct LossInfo {
  ir::ValueId loss = ir::kNoValue;    // float scalar
  ir::ValueId labels = ir::kNoValue;  // the labels the loss reads
  bool existing = false;              // the graph's own SoftmaxCrossEntropyLoss was used
};

// The first SoftmaxCrossEntropyLoss node's loss output of `g` (live node), if any.
ir::ValueId FindExistingLoss(const ir::Graph& g);

absl::StatusOr<LossInfo> AddCrossEntropyLoss(ir::Graph* g, const std::string& logits_name,
                                             const std::string& labels_name,
                                             const CrossEntropyOptions& options);

}  // namespace onnxpipe::autodiff
