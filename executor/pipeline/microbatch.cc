// Micro-batch shares, row slicing and the fixed-batch re-derivation. MakeBatchSymbolic works node
// by node rather than through one InferShapes call because a Reshape's shape constant must be
// patched before the nodes after it can be inferred, and each candidate patch is judged by
// inferring that one node.
#include "executor/pipeline/microbatch.h"

#include <algorithm>
#include <cstring>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/status.h"
#include "frontend/passes/pipeline.h"

namespace onnxpipe::pipeline {
namespace {

bool IsViewOp(ir::OpKind op) {
  return op == ir::OpKind::kReshape || op == ir::OpKind::kFlatten || op == ir::OpKind::kSqueeze ||
         op == ir::OpKind::kUnsqueeze || op == ir::OpKind::kIdentity;
}

std::string NodeDesc(const ir::Node& n) { return "node '" + n.name + "' (" + std::string(ir::OpName(n.op)) + ")"; }

std::string IntsToString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool HasSymbol(const ir::Dim& d, const std::string& symbol) {
  return std::find(d.symbols().begin(), d.symbols().end(), symbol) != d.symbols().end();
}

std::string ReExportHint() {
  return "; re-export the model with dynamic axes (torch.onnx.export(..., dynamic_axes={input: {0: 'B'}}), "
         "models/export.py --dynamic-axes) to train it with micro-batches";
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
    return INVALID_ARGUMENT() << NodeDesc(n) << " has reduction '" << rule.reduction
                              << "'; micro-batching needs a scalar loss (mean or sum)";
  }
  if (n.inputs.size() > 2 && n.inputs[2] != ir::kNoValue) {
    return UNIMPLEMENTED() << NodeDesc(n) << " has class weights; micro-batch shares of a weighted mean "
                           << "are not supported, train with --microbatches 1";
  }
  ir::ValueId labels = n.inputs[1];
  while (g.value(labels).producer != ir::kNoNode && IsViewOp(g.node(g.value(labels).producer).op)) {
    labels = g.node(g.value(labels).producer).inputs[0];
  }
  if (g.value(labels).producer != ir::kNoNode ||
      std::find(g.inputs().begin(), g.inputs().end(), labels) == g.inputs().end()) {
    return UNIMPLEMENTED() << "the labels of " << NodeDesc(n)
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
      return INVALID_ARGUMENT() << "micro-batch " << m << " has no label other than ignore_index "
                                << rule.ignore_index << " (its mean loss is 0/0); use fewer micro-batches";
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

// True when every graph input's leading dim is the concrete `batch`.
bool LeadingDimsAre(const ir::Graph& g, int64_t batch) {
  for (ir::ValueId v : g.inputs()) {
    const ir::Value& val = g.value(v);
    if (!val.shape_known || val.shape.empty() || val.shape[0] != ir::Dim(batch)) return false;
  }
  return true;
}

bool HasFixedBatch(const ir::Graph& g) {
  for (ir::ValueId v : g.inputs()) {
    const ir::Value& val = g.value(v);
    if (val.shape_known && !val.shape.empty() && !val.shape[0].is_concrete()) return false;
  }
  return !g.inputs().empty();
}

namespace {

// Tries each entry of the Reshape's shape constant that equals the export batch: the one whose
// replacement by -1 (0 when the constant already has a -1) infers to exactly the batch symbol.
absl::Status PatchReshape(ir::Graph* g, ir::NodeId id, const std::string& symbol, int64_t b0) {
  const ir::Node n = g->node(id);
  // Copies: AddConstant below grows the value table.
  const ir::Value in = g->value(n.inputs[0]);
  const ir::Value sv = g->value(n.inputs[1]);
  if (!sv.constant || !in.shape_known) return absl::OkStatus();
  const ir::Dim count = ir::NumElements(in.shape);
  if (!HasSymbol(count, symbol)) return absl::OkStatus();  // not batch-dependent
  const std::vector<int64_t> shape = sv.constant->ToInt64Vector();
  const bool has_minus1 = std::find(shape.begin(), shape.end(), -1) != shape.end();
  std::vector<size_t> candidates;
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == b0) candidates.push_back(i);
  if (candidates.empty()) return absl::OkStatus();  // a -1 or 0 already carries the batch, or inference says
  const ir::ValueId trial =
      g->AddConstant(g->UniqueName(sv.name + "/batch_symbolic"), ir::Tensor::FromVector<int64_t>(
                                                                     {static_cast<int64_t>(shape.size())}, shape));
  g->node(id).inputs[1] = trial;
  std::vector<std::vector<int64_t>> good;
  for (size_t i : candidates) {
    std::vector<int64_t> s = shape;
    s[i] = has_minus1 ? 0 : -1;
    if (s[i] == 0 && (i >= in.shape.size() || in.shape[i] != ir::Dim::Symbol(symbol))) continue;
    g->value(trial).constant = ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(s.size())}, s);
    absl::StatusOr<std::vector<ir::TypeAndShape>> r = ir::InferNode(*g, g->node(id));
    if (!r.ok() || r->empty() || r->at(0).shape.size() != shape.size()) continue;
    bool ok = r->at(0).shape[i] == ir::Dim::Symbol(symbol);
    for (size_t k = 0; k < shape.size() && ok; ++k) {
      if (k != i && shape[k] > 0) ok = r->at(0).shape[k] == ir::Dim(shape[k]);
    }
    if (ok) good.push_back(s);
  }
  if (good.size() == 1) {
    g->value(trial).constant = ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(good[0].size())}, good[0]);
    return absl::OkStatus();
  }
  g->node(id).inputs[1] = n.inputs[1];
  if (good.empty()) {
    return INVALID_ARGUMENT() << NodeDesc(n) << " reshapes " << ir::ShapeToString(in.shape) << " to the constant "
                              << IntsToString(shape) << ", which bakes in the export batch " << b0
                              << " in a way shape inference cannot undo" << ReExportHint();
  }
  return INVALID_ARGUMENT() << NodeDesc(n) << " reshapes " << ir::ShapeToString(in.shape) << " to the constant "
                            << IntsToString(shape) << ": " << good.size() << " of its entries equal the export batch "
                            << b0 << " and each could be the batch dim, so it is ambiguous" << ReExportHint();
}

// An Expand shape entry equal to the export batch that faces the input's batch dim becomes 1
// (keep the input's size); one that faces a size-1 dim is a broadcast to the batch or to another dim
// of the same size: ambiguous.
absl::Status PatchExpand(ir::Graph* g, ir::NodeId id, const std::string& symbol, int64_t b0) {
  const ir::Node n = g->node(id);
  const ir::Value in = g->value(n.inputs[0]);
  const ir::Value sv = g->value(n.inputs[1]);
  if (!sv.constant || !in.shape_known) return absl::OkStatus();
  std::vector<int64_t> shape = sv.constant->ToInt64Vector();
  const int64_t offset = static_cast<int64_t>(shape.size()) - static_cast<int64_t>(in.shape.size());
  bool changed = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != b0) continue;
    const int64_t j = static_cast<int64_t>(i) - offset;
    const ir::Dim d = j >= 0 ? in.shape[j] : ir::Dim(1);
    if (d == ir::Dim::Symbol(symbol)) {
      shape[i] = 1;
      changed = true;
    } else if (d == ir::Dim(1) && b0 != 1) {
      return INVALID_ARGUMENT() << NodeDesc(n) << " expands " << ir::ShapeToString(in.shape) << " to the constant "
                                << IntsToString(shape) << ": entry " << i << " broadcasts a size-1 dim to "
                                << b0 << ", the export batch, and may or may not be the batch dim" << ReExportHint();
    }
  }
  if (changed) {
    const ir::ValueId c = g->AddConstant(
        g->UniqueName(sv.name + "/batch_symbolic"),
        ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(shape.size())}, shape));
    g->node(id).inputs[1] = c;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status MakeBatchSymbolic(ir::Graph* g, const std::string& symbol, int64_t* export_batch) {
  RET_CHECK(g != nullptr && !symbol.empty());
  int64_t b0 = -1;
  for (ir::ValueId v : g->inputs()) {
    const ir::Value& val = g->value(v);
    if (!val.shape_known || val.shape.empty() || !val.shape[0].is_concrete()) {
      return INVALID_ARGUMENT() << "input '" << val.name << "' has shape "
                                << (val.shape_known ? ir::ShapeToString(val.shape) : "unknown")
                                << "; a fixed-batch model needs a concrete leading (batch) dim on every input";
    }
    if (b0 >= 0 && val.shape[0].value() != b0) {
      return INVALID_ARGUMENT() << "the inputs' leading dims differ (" << b0 << " and " << val.shape[0].value()
                                << " at '" << val.name << "'), so the batch dim is ambiguous" << ReExportHint();
    }
    b0 = val.shape[0].value();
  }
  RET_CHECK(b0 > 0) << "the graph has no inputs";
  if (export_batch) *export_batch = b0;
  for (ir::ValueId v : g->inputs()) g->value(v).shape[0] = ir::Dim::Symbol(symbol);
  const std::vector<ir::NodeId> order = g->LiveNodes();
  for (ir::NodeId id : order)
    for (ir::ValueId o : g->node(id).outputs)
      if (o != ir::kNoValue) g->value(o).shape_known = false;
  for (ir::NodeId id : order) {
    const ir::OpKind op = g->node(id).op;
    if (op == ir::OpKind::kReshape) RETURN_IF_ERROR(PatchReshape(g, id, symbol, b0));
    if (op == ir::OpKind::kExpand) RETURN_IF_ERROR(PatchExpand(g, id, symbol, b0));
    absl::StatusOr<std::vector<ir::TypeAndShape>> r = ir::InferNode(*g, g->node(id));
    if (!r.ok()) {
      return Annotate(r.status(), "re-deriving the batch dim of a fixed-batch export (" + NodeDesc(g->node(id)) +
                                      ")" + ReExportHint());
    }
    const ir::Node& n = g->node(id);
    for (size_t k = 0; k < n.outputs.size() && k < r->size(); ++k) {
      if (n.outputs[k] == ir::kNoValue) continue;
      ir::Value& out = g->value(n.outputs[k]);
      out.dtype = (*r)[k].dtype;
      out.shape = (*r)[k].shape;
      out.shape_known = true;
    }
  }
  // The loss side needs the batch in the outputs: a constant that kept it is a baked batch.
  for (ir::ValueId v : g->outputs()) {
    const ir::Value& val = g->value(v);
    if (val.shape_known && !val.shape.empty() && !HasSymbol(val.shape[0], symbol)) {
      return INVALID_ARGUMENT() << "output '" << val.name << "' still has shape " << ir::ShapeToString(val.shape)
                                << " after re-deriving the batch dim: the export batch " << b0
                                << " is baked in where shape inference cannot see it" << ReExportHint();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ir::Graph> PrepareMicrobatchForward(const ir::Graph& imported, const std::string& batch_symbol,
                                                   int64_t microbatch_size,
                                                   const std::map<std::string, int64_t>& other_bindings) {
  ir::Graph g = imported;
  const std::string& path = g.source_path;
  std::string symbol = batch_symbol;
  cpu::CpuEvaluator evaluator;
  // A micro-batch of the export's own batch (one micro-batch of the exported size) runs the graph as exported:
  // nothing to re-derive, and no batch symbol to bind.
  const bool as_exported = HasFixedBatch(g) && LeadingDimsAre(g, microbatch_size);
  if (HasFixedBatch(g) && !as_exported) {
    // Fold first: the exporter spells a baked shape as Constant -> Unsqueeze -> Concat chains, which
    // become one shape constant that MakeBatchSymbolic can inspect and patch.
    passes::PipelineOptions fold;
    fold.fuse = false;
    RETURN_IF_ERROR(Annotate(passes::RunForwardPipeline(&g, evaluator, fold), path));
    int64_t b0 = 0;
    RETURN_IF_ERROR(Annotate(MakeBatchSymbolic(&g, symbol, &b0), path));
  } else if (!as_exported) {
    for (ir::ValueId v : g.inputs()) {
      const ir::Value& val = g.value(v);
      if (val.shape_known && !val.shape.empty() && val.shape[0].symbols().size() == 1 &&
          val.shape[0].factor() == 1) {
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
