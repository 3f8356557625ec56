// Replays the seed corpus of fuzz/text_fuzzer.cc (fuzz/corpus/text/) through the fuzzer's own entry point, as CI
// cannot run libFuzzer: text_fuzzer.cc is compiled into this test, so every seed is checked against the fuzzer's
// invariants (a violation aborts, naming the seed on stderr first). The well-formed seeds must also parse.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "executor/text/datasets.h"
#include "executor/text/vocabulary.h"
#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace onnxpipe::text {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(ONNXPIPE_SOURCE_DIR) / "fuzz" / "corpus" / "text";

std::string ReadSeed(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(TextFuzzCorpusReplay, EverySeedKeepsTheFuzzerInvariants) {
  ASSERT_TRUE(fs::is_directory(kCorpus)) << kCorpus;
  int files = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(kCorpus)) {
    if (!e.is_regular_file()) continue;
    ++files;
    const std::string bytes = ReadSeed(e.path());
    std::fprintf(stderr, "replaying %s\n", e.path().filename().c_str());
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
  EXPECT_GE(files, 15);
}

TEST(TextFuzzCorpusReplay, WellFormedSeedsParse) {
  absl::StatusOr<TextSplit> tsv = ParseTsv(ReadSeed(kCorpus / "tsv_two_classes"), "tsv_two_classes");
  ASSERT_TRUE(tsv.ok()) << tsv.status();
  EXPECT_EQ(tsv->labels, (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(tsv->texts[1], "my kernel has a bug");
  absl::StatusOr<TextSplit> crlf = ParseTsv(ReadSeed(kCorpus / "tsv_crlf_bom"), "tsv_crlf_bom");
  ASSERT_TRUE(crlf.ok()) << crlf.status();
  EXPECT_EQ(crlf->labels, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(crlf->texts[1], "second\tline with a tab");
  absl::StatusOr<Vocabulary> vocab = Vocabulary::Parse(ReadSeed(kCorpus / "vocab_valid"), "vocab_valid");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->size(), 7);
  EXPECT_EQ(vocab->Id("soup"), 4);
  EXPECT_FALSE(ParseTsv(ReadSeed(kCorpus / "tsv_bad_label"), "tsv_bad_label").ok());
  EXPECT_FALSE(Vocabulary::Parse(ReadSeed(kCorpus / "vocab_missing_specials"), "vocab_missing_specials").ok());
}

}  // namespace
}  // namespace onnxpipe::text
