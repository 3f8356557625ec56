// Feeding a model from labelled text (--data-format aclimdb | tsv): which graph inputs take the token ids and the
// padding mask, and the tensors of a tokenized split.
//
// The token input is found from the graph, not by name: the one integer graph input of rank 2 whose values reach
// the index operand of a Gather on a rank-2 float initializer (the embedding table), possibly through Cast,
// Identity, Reshape, (Un)Squeeze or Flatten. The table's rows are the model's vocabulary size. A second graph
// input with the token input's shape (same rank, each dim the same size or symbol) and an integer, bool or float
// dtype is the attention mask; any other graph input cannot be fed from text and is an error naming it.
//
// Mask values: MaskConvention::kKeep writes 1 at real tokens and 0 at padding (Hugging Face's attention_mask);
// kPad writes true at padding (PyTorch's key_padding_mask). The default (kAuto) picks kPad for a bool mask and
// kKeep otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/text/datasets.h"
#include "executor/text/vocabulary.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

enum class MaskConvention { kAuto, kKeep, kPad };
// "auto" | "keep" | "pad" (the --mask values).
absl::StatusOr<MaskConvention> ParseMaskConvention(const std::string& name);

struct TextInputs {
  std::string tokens;              // graph input fed the token ids
  ir::DType tokens_dtype = ir::DType::kI64;
  std::string embedding;           // the Gather table the ids index
  int64_t embedding_rows = 0;      // its dim 0: ids must be < this
  std::optional<int64_t> seq;      // the token input's dim 1 when it is a fixed size
  std::string seq_symbol;          // its symbol when it is not
  std::string mask;                // graph input fed the padding mask; empty when the model has none
  ir::DType mask_dtype = ir::DType::kI64;
};

// `imported`: the forward graph as imported (symbolic dims unbound). `labels` names the labels input of a model
// that computes its own loss (it is then not an unfeedable input).
absl::StatusOr<TextInputs> FindTextInputs(const ir::Graph& imported, const std::string& labels);

// The tensors of one split for Dataset::FromTensors: token ids (N, seq) in the token input's dtype, the mask
// (N, seq) when the model has one, and the labels (N) as i64 under `labels_name`.
std::map<std::string, ir::Tensor> EncodeTextSplit(const text::TextSplit& split, const text::Vocabulary& vocab,
                                                  int64_t seq, const TextInputs& inputs, MaskConvention mask,
                                                  const std::string& labels_name);

}  // namespace onnxpipe::train
