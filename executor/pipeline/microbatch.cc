// Micro-batch shares, row slicing and the forward graph of one micro-batch.
#include "executor/pipeline/microbatch.h"

#include <algorithm>
#include <cstring>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"
#include "frontend/passes/batch_symbolic.h"
#include "frontend/passes/pipeline.h"

namespace onnxpipe::pipeline {
namespace {

bool IsViewOp(ir::OpKind op) {
  return op == ir::OpKind::kReshape || op == ir::OpKind::kFlatten || op == ir::OpKind::kSqueeze ||
         op == ir::OpKind::kUnsqueeze || op == ir::OpKind::kIdentity;
}

std::string IntsToString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

absl::StatusOr<LossShareRule> AnalyzeLoss(const ir::Graph& g, ir::ValueId loss, int32_t microbatches) {
  LossShareRule rule;
  rule.loss = loss;
  RET_CHECK(loss >= 0 && loss < g.num_values());
  const ir::NodeId p = g.value(loss).producer;
  if (p == ir::kNoNode || g.node(p).op != ir::OpKind::kSoftmaxCrossEntropyLoss) {
    if (microbatches == 1) return rule;
    return INVALID_ARGUMENT() << "the loss '" << g.value(loss).name
                              << "' is not a SoftmaxCrossEntropyLoss output, so it cannot be split into "
                              << microbatches << " micro-batches; train with --microbatches 1";
  }
  const ir::Node& n = g.node(p);
  rule.reduction = n.attrs.Get<std::string>("reduction", "mean");
  rule.has_ignore_index = n.attrs.Has("ignore_index");
  rule.ignore_index = n.attrs.Get<int64_t>("ignore_index", 0);
  if (microbatches == 1) return rule;
  if (rule.reduction != "mean" && rule.reduction != "sum") {
    return INVALID_ARGUMENT() << ir::NodeLabel(n) << " has reduction '" << rule.reduction
                              << "'; micro-batching needs a scalar loss (mean or sum)";
  }
  if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) {
    return UNIMPLEMENTED() << ir::NodeLabel(n) << " has class weights; micro-batch shares of a weighted mean "
                           << "are not supported, train with --microbatches 1";
  }
  ir::ValueId labels = n.inputs[1];
  while (g.value(labels).producer != ir::kNoNode && IsViewOp(g.node(g.value(labels).producer).op)) {
    labels = g.node(g.value(labels).producer).inputs[0];
  }
  if (g.value(labels).producer != ir::kNoNode ||
      std::find(g.inputs().begin(), g.inputs().end(), labels) == g.inputs().end()) {
    return UNIMPLEMENTED() << "the labels of " << ir::NodeLabel(n)
                           << " are computed in the graph, so the micro-batches' shares of the mean cannot be "
                              "counted; train with --microbatches 1";
  }
  rule.labels_input = g.value(labels).name;
  return rule;
}

absl::StatusOr<std::vector<double>> LossShares(const LossShareRule& rule, const std::vector<ir::Tensor>& labels) {
  const size_t M = labels.size();
  if (M <= 1) return std::vector<double>(M, 1.0);
  if (rule.reduction == "sum") return std::vector<double>(M, 1.0);
  std::vector<int64_t> counts(M, 0);
  int64_t total = 0;
  for (size_t m = 0; m < M; ++m) {
    const ir::Tensor& t = labels[m];
    if (!ir::IsInteger(t.dtype())) {
      return INVALID_ARGUMENT() << "labels '" << rule.labels_input << "' have dtype " << ir::DTypeName(t.dtype())
                                << "; expected integers";
    }
    for (int64_t i = 0; i < t.num_elements(); ++i)
      counts[m] += !(rule.has_ignore_index && t.GetAsInt(i) == rule.ignore_index);
    total += counts[m];
  }
  if (total == 0) {
    return INVALID_ARGUMENT() << "every label of the batch equals ignore_index " << rule.ignore_index
                              << ": the mean loss is undefined";
  }
  std::vector<double> shares(M);
  for (size_t m = 0; m < M; ++m) {
    if (counts[m] == 0) {
      return INVALID_ARGUMENT() << "micro-batch " << m << " has no label other than ignore_index " << rule.ignore_index
                                << " (its mean loss is 0/0); use fewer micro-batches";
    }
    shares[m] = static_cast<double>(counts[m]) / static_cast<double>(total);
  }
  return shares;
}

absl::StatusOr<ir::Tensor> SliceRows(const ir::Tensor& t, int64_t begin, int64_t end) {
  if (t.rank() < 1 || begin < 0 || end > t.dims()[0] || begin > end) {
    return INVALID_ARGUMENT() << "cannot take rows [" << begin << ", " << end << ") of a tensor with dims "
                              << IntsToString(t.dims());
  }
  std::vector<int64_t> dims = t.dims();
  dims[0] = end - begin;
  ir::Tensor out(t.dtype(), dims);
  const int64_t row_bytes = t.dims()[0] > 0 ? t.num_bytes() / t.dims()[0] : 0;
  if (out.num_bytes() > 0) {
    std::memcpy(out.raw(), static_cast<const uint8_t*>(t.raw()) + begin * row_bytes, out.num_bytes());
  }
  return out;
}

absl::StatusOr<ir::Graph> PrepareMicrobatchForward(const ir::Graph& imported, const std::string& batch_symbol,
                                                   int64_t microbatch_size,
                                                   const std::map<std::string, int64_t>& other_bindings,
                                                   ir::DType compute) {
  ir::Graph g = imported;
  const std::string& path = g.source_path;
  if (compute == ir::DType::kF64) RETURN_IF_ERROR(ir::ConvertComputePrecision(g, ir::DType::kF32, ir::DType::kF64));
  std::string symbol = batch_symbol;
  cpu::CpuEvaluator evaluator;
  // A micro-batch of the export's own batch (one micro-batch of the exported size) runs the graph as exported:
  // nothing to re-derive, and no batch symbol to bind.
  const bool as_exported = passes::HasFixedBatch(g) && passes::LeadingDimsAre(g, microbatch_size);
  if (passes::HasFixedBatch(g) && !as_exported) {
    // Fold first: the exporter spells a baked shape as Constant -> Unsqueeze -> Concat chains, which
    // become one shape constant that MakeBatchSymbolic can inspect and patch.
    passes::PipelineOptions fold;
    fold.fuse = false;
    RETURN_IF_ERROR(Annotate(passes::RunForwardPipeline(&g, evaluator, fold), path));
    int64_t b0 = 0;
    RETURN_IF_ERROR(Annotate(passes::MakeBatchSymbolic(&g, symbol, &b0), path));
  } else if (!as_exported) {
    for (ir::ValueId v : g.inputs()) {
      const ir::Value& val = g.value(v);
      if (val.shape_known && !val.shape.empty() && val.shape[0].symbols().size() == 1 && val.shape[0].factor() == 1) {
        symbol = val.shape[0].symbols()[0];
        break;
      }
    }
  }
  std::map<std::string, int64_t> bindings = other_bindings;
  if (!as_exported) bindings[symbol] = microbatch_size;
  RETURN_IF_ERROR(Annotate(ir::BindSymbols(g, bindings), path));
  RETURN_IF_ERROR(Annotate(ir::InferShapes(g), path));
  RETURN_IF_ERROR(Annotate(passes::RunForwardPipeline(&g, evaluator, passes::PipelineOptions{}), path));
  return g;
}

}  // namespace onnxpipe::pipeline
