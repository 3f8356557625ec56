// Re-deriving a symbolic batch dim of a fixed-batch export (batch_symbolic.h). It works node by node
// rather than through one InferShapes call because a Reshape's shape constant must be patched before
// the nodes after it can be inferred, and each candidate patch is judged by inferring that one node.
#include "frontend/passes/batch_symbolic.h"

#include <algorithm>

#include "frontend/ir/infer.h"
#include "frontend/ir/status.h"

namespace onnxpipe::passes {
namespace {

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
      g->AddConstant(g->UniqueName(sv.name + "/batch_symbolic"),
                     ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(shape.size())}, shape));
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
    return INVALID_ARGUMENT() << ir::NodeLabel(n) << " reshapes " << ir::ShapeToString(in.shape) << " to the constant "
                              << IntsToString(shape) << ", which bakes in the export batch " << b0
                              << " in a way shape inference cannot undo" << ReExportHint();
  }
  return INVALID_ARGUMENT() << ir::NodeLabel(n) << " reshapes " << ir::ShapeToString(in.shape) << " to the constant "
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
      return INVALID_ARGUMENT() << ir::NodeLabel(n) << " expands " << ir::ShapeToString(in.shape) << " to the constant "
                                << IntsToString(shape) << ": entry " << i << " broadcasts a size-1 dim to " << b0
                                << ", the export batch, and may or may not be the batch dim" << ReExportHint();
    }
  }
  if (changed) {
    const ir::ValueId c = g->AddConstant(g->UniqueName(sv.name + "/batch_symbolic"),
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
      return Annotate(r.status(), "re-deriving the batch dim of a fixed-batch export (" + ir::NodeLabel(g->node(id)) +
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

}  // namespace onnxpipe::passes
