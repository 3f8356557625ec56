// Token <-> id mapping for the text models: id 0 = "<pad>", id 1 = "<unk>", then the most frequent training tokens.
// The file form is one token per line in id order (line 1 "<pad>", line 2 "<unk>"), newline-terminated, written
// atomically; the trainer saves it beside the checkpoint and reloads it for evaluation and resume.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::text {

class Vocabulary {
 public:
  static constexpr int64_t kPadId = 0;
  static constexpr int64_t kUnkId = 1;
  static constexpr std::string_view kPad = "<pad>";
  static constexpr std::string_view kUnk = "<unk>";

  // The `max_size` - 2 most frequent tokens of Tokenize(texts) (ties broken by byte order of the token, so the
  // result does not depend on hash order or thread count), after <pad> and <unk>. Fewer when the texts have fewer
  // distinct tokens. max_size must be >= 2.
  static absl::StatusOr<Vocabulary> Build(const std::vector<std::string>& texts, int64_t max_size);
  // Refuses a file that is not exactly what Save writes (errors give file:line).
  static absl::StatusOr<Vocabulary> Load(const std::string& path);
  // Load on bytes already in memory; `source` names them in errors.
  static absl::StatusOr<Vocabulary> Parse(std::string_view content, const std::string& source);
  absl::Status Save(const std::string& path) const;

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int64_t id) const { return tokens_[id]; }
  const std::vector<std::string>& tokens() const { return tokens_; }
  // kUnkId for tokens not in the vocabulary.
  int64_t Id(std::string_view token) const;

  // Ids of the first `seq_len` tokens of `text`, padded with kPadId to exactly seq_len.
  std::vector<int64_t> Encode(std::string_view text, int64_t seq_len) const;
  void EncodeInto(std::string_view text, int64_t seq_len, int64_t* out) const;
  // An i64 tensor [texts.size(), seq_len], row i = Encode(texts[i]).
  ir::Tensor EncodeBatch(const std::vector<std::string>& texts, int64_t seq_len) const;

  bool operator==(const Vocabulary& o) const { return tokens_ == o.tokens_; }

 private:
  explicit Vocabulary(std::vector<std::string> tokens);

  std::vector<std::string> tokens_;
  absl::flat_hash_map<std::string, int64_t> ids_;
};

}  // namespace onnxpipe::text
