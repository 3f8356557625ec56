// Micro-batching: splitting a step's batch into M micro-batches and making the loss of the M
// micro-batches add up to the batch's. A fixed-batch export is made batch-polymorphic first
// (frontend/passes/batch_symbolic.h).
//
// Loss shares. The training loss is a mean over the batch (SoftmaxCrossEntropyLoss, reduction
// "mean": over the samples, or over the non-ignored tokens for a per-token loss). A micro-batch's
// mean weighted by its share n_m / N (n_m = its samples or non-ignored tokens, N = the batch's)
// sums to the batch mean, and so do the gradients when the backward is seeded with the share
// instead of 1 (the backward is linear in its seed). With equal micro-batches and no ignored
// labels the share is 1/M, a power of two for M = 1, 2, 4, ..., so seeding with it scales every
// gradient exactly. reduction "sum": every share is 1.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::pipeline {

// How a micro-batch's share of the loss is counted.
struct LossShareRule {
  ir::ValueId loss = ir::kNoValue;
  std::string reduction = "mean";  // "mean" | "sum"
  bool has_ignore_index = false;
  int64_t ignore_index = -100;
  std::string labels_input;  // the graph input the loss's labels come from (through reshapes)
};

// The rule for the scalar `loss` of a training graph. With microbatches > 1 the loss must be a
// SoftmaxCrossEntropyLoss (mean or sum, no class weights) whose labels are a graph input viewed
// through Reshape/Flatten/Squeeze/Unsqueeze/Identity; otherwise an error says why the loss cannot
// be split. With one micro-batch any loss is accepted (the share is 1).
absl::StatusOr<LossShareRule> AnalyzeLoss(const ir::Graph& g, ir::ValueId loss, int32_t microbatches);

// Shares of the micro-batches given each one's labels (any integer dtype). Errors when the batch
// has no labelled position, or a micro-batch has none (its mean would be 0/0).
absl::StatusOr<std::vector<double>> LossShares(const LossShareRule& rule, const std::vector<ir::Tensor>& labels);

// Rows [begin, end) of `t` along dim 0, as a new tensor.
absl::StatusOr<ir::Tensor> SliceRows(const ir::Tensor& t, int64_t begin, int64_t end);

// Binds `bindings` (the batch symbol to the micro-batch size, the sequence, ...), re-infers shapes
// and runs the forward pipeline (folding and fusion), as tools/model.h's PrepareModel does: the
// forward graph a micro-batch's training graph is built from. A fixed-batch graph whose inputs' leading
// dim is `microbatch_size` (one micro-batch of the export's batch) is used as exported; any other
// fixed-batch graph is made symbolic first (MakeBatchSymbolic), which may refuse it as ambiguous. With `compute`
// kF64 the graph computes in f64 before anything is folded (ir::ConvertComputePrecision), so that what folding
// computes (a rotary table from positions) is f64 too, not f32 converted afterwards.
absl::StatusOr<ir::Graph> PrepareMicrobatchForward(const ir::Graph& imported, const std::string& batch_symbol,
                                                   int64_t microbatch_size,
                                                   const std::map<std::string, int64_t>& other_bindings,
                                                   ir::DType compute);

}  // namespace onnxpipe::pipeline
