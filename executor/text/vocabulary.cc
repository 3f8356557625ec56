#include "executor/text/vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "executor/io/atomic_file.h"
#include "executor/text/tokenizer.h"
#include "frontend/ir/status.h"

namespace onnxpipe::text {
namespace {

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {
  ids_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) ids_.emplace(tokens_[i], static_cast<int64_t>(i));
}

absl::StatusOr<Vocabulary> Vocabulary::Build(const std::vector<std::string>& texts, int64_t max_size) {
  if (max_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab-size ", max_size, ": need at least 2 (<pad> and <unk>)"));
  }
  absl::flat_hash_map<std::string, int64_t> counts;
  for (const std::string& text : texts) {
    ForEachToken(text, [&](std::string_view t) {
      auto it = counts.find(AbslView(t));
      if (it == counts.end()) {
        counts.emplace(std::string(t), 1);
      } else {
        ++it->second;
      }
    });
  }
  std::vector<std::pair<const std::string*, int64_t>> ranked;
  ranked.reserve(counts.size());
  for (const auto& [token, n] : counts) ranked.emplace_back(&token, n);
  auto order = [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : *a.first < *b.first;
  };
  size_t keep = std::min<size_t>(ranked.size(), static_cast<size_t>(max_size - 2));
  std::partial_sort(ranked.begin(), ranked.begin() + keep, ranked.end(), order);
  std::vector<std::string> tokens = {std::string(kPad), std::string(kUnk)};
  for (size_t i = 0; i < keep; ++i) tokens.push_back(*ranked[i].first);
  return Vocabulary(std::move(tokens));
}

absl::Status Vocabulary::Save(const std::string& path) const {
  std::string out;
  for (const std::string& t : tokens_) absl::StrAppend(&out, t, "\n");
  return io::WriteFileAtomically(path, out);
}

absl::StatusOr<Vocabulary> Vocabulary::Load(const std::string& path) {
  absl::StatusOr<std::string> content = io::ReadFileToString(path);
  if (!content.ok()) return Annotate(content.status(), "vocabulary file");
  return Parse(*content, path);
}

absl::StatusOr<Vocabulary> Vocabulary::Parse(std::string_view content, const std::string& path) {
  auto bad = [&](size_t line, const std::string& what) {
    return absl::DataLossError(absl::StrCat("vocabulary file ", path, ":", line, ": ", what,
                                            " (expected one token per line, starting with <pad> and <unk>)"));
  };
  if (content.empty()) return bad(1, "file is empty");
  if (content.back() != '\n')
    return bad(std::count(content.begin(), content.end(), '\n') + 1, "last line has no newline (truncated file?)");
  std::vector<std::string> tokens;
  absl::flat_hash_map<std::string, size_t> first_line;
  size_t start = 0;
  for (size_t line = 1; start < content.size(); ++line) {
    size_t end = content.find('\n', start);
    std::string_view tok = content.substr(start, end - start);
    start = end + 1;
    if (tok.empty()) return bad(line, "empty line");
    for (char c : tok) {
      auto u = static_cast<unsigned char>(c);
      if (u <= ' ' || u == 0x7f) return bad(line, "token contains whitespace or a control character");
    }
    if (line == 1 && tok != kPad)
      return bad(line, absl::StrCat("first token is \"", std::string(tok), "\", not <pad>"));
    if (line == 2 && tok != kUnk)
      return bad(line, absl::StrCat("second token is \"", std::string(tok), "\", not <unk>"));
    auto [it, inserted] = first_line.emplace(std::string(tok), line);
    if (!inserted) {
      return bad(line, absl::StrCat("duplicate token \"", std::string(tok), "\" (first on line ", it->second, ")"));
    }
    tokens.emplace_back(tok);
  }
  if (tokens.size() < 2) return bad(tokens.size() + 1, "missing <unk>");
  return Vocabulary(std::move(tokens));
}

int64_t Vocabulary::Id(std::string_view token) const {
  auto it = ids_.find(AbslView(token));
  return it == ids_.end() ? kUnkId : it->second;
}

void Vocabulary::EncodeInto(std::string_view text, int64_t seq_len, int64_t* out) const {
  if (seq_len <= 0) return;
  int64_t n = 0;
  // Tokenizing past seq_len is wasted work but keeps ForEachToken simple; reviews are a few hundred tokens.
  ForEachToken(text, [&](std::string_view t) {
    if (n < seq_len) out[n++] = Id(t);
  });
  std::fill(out + n, out + seq_len, kPadId);
}

std::vector<int64_t> Vocabulary::Encode(std::string_view text, int64_t seq_len) const {
  std::vector<int64_t> ids(static_cast<size_t>(std::max<int64_t>(seq_len, 0)));
  EncodeInto(text, seq_len, ids.data());
  return ids;
}

ir::Tensor Vocabulary::EncodeBatch(const std::vector<std::string>& texts, int64_t seq_len) const {
  ir::Tensor t(ir::DType::kI64, {static_cast<int64_t>(texts.size()), seq_len});
  int64_t* p = t.mutable_data<int64_t>();
  for (size_t i = 0; i < texts.size(); ++i) EncodeInto(texts[i], seq_len, p + i * seq_len);
  return t;
}

}  // namespace onnxpipe::text
