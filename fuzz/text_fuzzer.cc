// libFuzzer target for the text layer: tokenizer, vocabulary file parser, TSV parser, vocabulary build + encode.
// Invariants checked on every input (a violation aborts, which libFuzzer reports):
//   - tokens are non-empty, hold no whitespace/control byte and no upper-case ASCII; a punctuation token is 1 byte;
//   - a vocabulary built from the input saves to bytes that Parse accepts and that give the same vocabulary;
//   - Encode returns exactly seq_len ids, each in [0, size);
//   - the parsers never crash: they return a vocabulary/split or an error naming the source.
// Seeds: fuzz/corpus/text (CI replays them: tests/text/text_fuzz_replay_test.cc compiles this file in).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "executor/text/datasets.h"
#include "executor/text/tokenizer.h"
#include "executor/text/vocabulary.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

bool IsPunct(unsigned char c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using onnxpipe::text::Vocabulary;
  std::string_view input(reinterpret_cast<const char*>(data), size);

  onnxpipe::text::ForEachToken(input, [](std::string_view t) {
    Check(!t.empty());
    for (char ch : t) {
      auto c = static_cast<unsigned char>(ch);
      Check(c > ' ' && c != 0x7f && !(c >= 'A' && c <= 'Z'));
      if (IsPunct(c)) Check(t.size() == 1);
    }
  });

  auto parsed = Vocabulary::Parse(input, "fuzz.vocab");
  if (parsed.ok())
    Check(parsed->size() >= 2 && parsed->Id("<pad>") == 0 && parsed->Id("<unk>") == 1);
  else
    Check(parsed.status().message().find("fuzz.vocab:") != std::string_view::npos);

  auto tsv = onnxpipe::text::ParseTsv(input, "fuzz.tsv");
  if (tsv.ok()) {
    Check(tsv->texts.size() == tsv->labels.size() && !tsv->texts.empty());
    for (int64_t l : tsv->labels) Check(l >= 0);
  } else {
    Check(tsv.status().message().find("fuzz.tsv") != std::string_view::npos);
  }

  // Split the input in two "documents" and build a small vocabulary from them.
  size_t cut = size / 2;
  auto vocab = Vocabulary::Build({std::string(input.substr(0, cut)), std::string(input.substr(cut))},
                                 2 + static_cast<int64_t>(size % 17));
  Check(vocab.ok());
  std::string saved;
  for (const std::string& t : vocab->tokens()) saved += t + "\n";
  auto reparsed = Vocabulary::Parse(saved, "saved.vocab");
  Check(reparsed.ok() && *reparsed == *vocab);
  const int64_t seq_len = static_cast<int64_t>(size % 9);
  std::vector<int64_t> ids = vocab->Encode(input, seq_len);
  Check(static_cast<int64_t>(ids.size()) == seq_len);
  for (int64_t id : ids) Check(id >= 0 && id < vocab->size());
  return 0;
}
