// Finding the token and mask inputs by following the data flow from each graph input to the embedding Gather,
// so that any export (any input names, a Cast of the ids to int32, an extra Unsqueeze) is recognised the same way.
#include "executor/train/text_data.h"

#include <algorithm>

#include "frontend/ir/status.h"

namespace onnxpipe::train {
namespace {

// Ops that pass token ids through unchanged in value (only their dtype or layout changes).
bool PassesIdsThrough(ir::OpKind op) {
  switch (op) {
    case ir::OpKind::kCast:
    case ir::OpKind::kIdentity:
    case ir::OpKind::kReshape:
    case ir::OpKind::kUnsqueeze:
    case ir::OpKind::kSqueeze:
    case ir::OpKind::kFlatten:
      return true;
    default:
      return false;
  }
}

// The embedding table (a rank-2 float constant) whose Gather indices come from `input`; kNoValue if none.
ir::ValueId FindEmbeddingTable(const ir::Graph& g, const std::vector<std::vector<ir::NodeId>>& uses,
                               ir::ValueId input) {
  std::vector<ir::ValueId> frontier = {input};
  for (size_t i = 0; i < frontier.size() && i < 64; ++i) {
    const ir::ValueId v = frontier[i];
    for (ir::NodeId nid : uses[v]) {
      const ir::Node& n = g.node(nid);
      if (n.op == ir::OpKind::kGather && n.inputs.size() == 2 && n.inputs[1] == v) {
        const ir::Value& table = g.value(n.inputs[0]);
        if (table.constant && ir::IsFloat(table.dtype) && table.constant->rank() == 2) return n.inputs[0];
      } else if (PassesIdsThrough(n.op) && !n.inputs.empty() && n.inputs[0] == v) {
        for (ir::ValueId out : n.outputs) {
          if (out != ir::kNoValue) frontier.push_back(out);
        }
      }
    }
  }
  return ir::kNoValue;
}

bool SameShape(const ir::Value& a, const ir::Value& b) {
  return a.shape_known && b.shape_known && a.shape == b.shape;
}

std::string Describe(const ir::Value& v) {
  return "'" + v.name + "' (" + std::string(ir::DTypeName(v.dtype)) + " " +
         (v.shape_known ? ir::ShapeToString(v.shape) : std::string("unknown shape")) + ")";
}

}  // namespace

absl::StatusOr<MaskConvention> ParseMaskConvention(const std::string& name) {
  if (name == "auto") return MaskConvention::kAuto;
  if (name == "keep") return MaskConvention::kKeep;
  if (name == "pad") return MaskConvention::kPad;
  return INVALID_ARGUMENT() << "--mask expects auto, keep or pad, got '" << name << "'";
}

absl::StatusOr<TextInputs> FindTextInputs(const ir::Graph& g, const std::string& labels) {
  const std::vector<std::vector<ir::NodeId>> uses = g.ComputeUses();
  std::vector<ir::ValueId> candidates;
  ir::ValueId table = ir::kNoValue;
  for (ir::ValueId in : g.inputs()) {
    const ir::Value& v = g.value(in);
    if (!ir::IsInteger(v.dtype) || !v.shape_known || v.shape.size() != 2) continue;
    const ir::ValueId t = FindEmbeddingTable(g, uses, in);
    if (t == ir::kNoValue) continue;
    candidates.push_back(in);
    table = t;
  }
  std::string all;
  for (ir::ValueId in : g.inputs()) all += (all.empty() ? "" : ", ") + Describe(g.value(in));
  if (candidates.empty()) {
    return INVALID_ARGUMENT() << "text data needs a token-id input: an integer (batch, sequence) graph input "
                                 "that indexes an embedding table (Gather on a 2-D float initializer); the "
                                 "model's inputs are "
                              << all;
  }
  if (candidates.size() > 1) {
    return INVALID_ARGUMENT() << "text data feeds one token-id input, but " << candidates.size()
                              << " graph inputs index embedding tables (" << all
                              << "); train such a model from .npy files (--data-format npy)";
  }
  const ir::Value& tok = g.value(candidates[0]);
  TextInputs out;
  out.tokens = tok.name;
  out.tokens_dtype = tok.dtype;
  out.embedding = g.value(table).name;
  out.embedding_rows = g.value(table).constant->dims()[0];
  if (tok.shape[1].is_concrete()) {
    out.seq = tok.shape[1].value();
  } else {
    out.seq_symbol = tok.shape[1].ToString();
  }
  for (ir::ValueId in : g.inputs()) {
    const ir::Value& v = g.value(in);
    if (in == candidates[0] || v.name == labels) continue;
    const bool maskable = ir::IsInteger(v.dtype) || ir::IsFloat(v.dtype) || v.dtype == ir::DType::kBool;
    if (out.mask.empty() && maskable && SameShape(v, tok)) {
      out.mask = v.name;
      out.mask_dtype = v.dtype;
      continue;
    }
    return INVALID_ARGUMENT() << "graph input " << Describe(v)
                              << " cannot be fed from text: text data feeds the token ids ('" << tok.name
                              << "') and one padding mask with their shape; train this model from .npy files "
                                 "(--data-format npy)";
  }
  return out;
}

std::map<std::string, ir::Tensor> EncodeTextSplit(const text::TextSplit& split, const text::Vocabulary& vocab,
                                                  int64_t seq, const TextInputs& inputs, MaskConvention mask,
                                                  const std::string& labels_name) {
  const int64_t n = static_cast<int64_t>(split.size());
  std::map<std::string, ir::Tensor> out;
  ir::Tensor ids = vocab.EncodeBatch(split.texts, seq);  // (N, seq) i64
  if (!inputs.mask.empty()) {
    if (mask == MaskConvention::kAuto) {
      mask = inputs.mask_dtype == ir::DType::kBool ? MaskConvention::kPad : MaskConvention::kKeep;
    }
    ir::Tensor m(ir::DType::kI64, {n, seq});
    const int64_t* id = ids.data<int64_t>();
    int64_t* mp = m.mutable_data<int64_t>();
    for (int64_t i = 0; i < n * seq; ++i) {
      const bool pad = id[i] == text::Vocabulary::kPadId;
      mp[i] = (pad == (mask == MaskConvention::kPad)) ? 1 : 0;
    }
    out[inputs.mask] = m.CastTo(inputs.mask_dtype);
  }
  std::vector<int64_t> labels(split.labels.begin(), split.labels.end());
  out[labels_name] = ir::Tensor::FromVector<int64_t>({n}, labels);
  out[inputs.tokens] = inputs.tokens_dtype == ir::DType::kI64 ? ids : ids.CastTo(inputs.tokens_dtype);
  return out;
}

}  // namespace onnxpipe::train
