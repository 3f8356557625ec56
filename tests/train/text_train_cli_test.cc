// `onnxpipe train` on text data: the aclImdb folder, its archive and TSV feed the same rows; the rows equal a
// hand encoding of the texts through the saved vocabulary (token ids and the padding mask); the vocabulary is the
// most frequent training words; clear errors for what text cannot feed.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "executor/data/npy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_util.h"
#include "tests/train/metrics_lines.h"
#include "tests/train/text_corpus.h"

namespace onnxpipe {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::CommandResult;
using testing::MetricsWithoutTiming;
using testing::Onnxpipe;
using testing::RunCommand;
using testing::SourcePath;

std::vector<std::string> Lines(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

class TextTrainCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("text_train_cli");
    corpus_ = dir_ / "corpus";
    train_ = testing::MakeTextSplit(24, 1);
    test_ = testing::MakeTextSplit(10, 2);
    testing::WriteTextCorpus(corpus_, train_, test_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  CommandResult Train(const std::string& model, const std::string& data, const std::string& extra) {
    return RunCommand(Onnxpipe() + " train " + SourcePath(model) + " --data " + data +
                      " --batch 8 --steps 4 --optimizer adamw --lr 0.003 --no-dropout " + extra);
  }

  fs::path dir_, corpus_;
  std::vector<testing::TextExample> train_, test_;
};

TEST_F(TextTrainCliTest, AclImdbFolderArchiveAndTsvTrainTheSameRows) {
  ASSERT_EQ(RunCommand("tar czf " + (dir_ / "corpus.tar.gz").string() + " -C " + corpus_.string() +
                       " train test").exit_code, 0);
  const std::string common = "--seq 12 --shuffle --seed 4 --metrics ";
  std::vector<std::vector<nlohmann::json>> runs;
  for (const auto& [data, format] : std::vector<std::pair<fs::path, std::string>>{
           {corpus_, "--data-format aclimdb"}, {dir_ / "corpus.tar.gz", ""}, {corpus_, "--data-format tsv"},
           {corpus_ / "train.tsv", ""}}) {
    const fs::path m = dir_ / ("m" + std::to_string(runs.size()) + ".jsonl");
    CommandResult r = Train("models/tiny_classifier.onnx", data.string(), format + " " + common + m.string());
    ASSERT_EQ(r.exit_code, 0) << data << " " << format << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr("48 training"));
    runs.push_back(MetricsWithoutTiming(m));
  }
  ASSERT_EQ(runs[0].size(), 4u);
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "run " << i;
}

// The text path feeds exactly what a hand encoding through the saved vocabulary gives: ids of the words (unknown
// words 1), padding 0 up to --seq, truncation, and the BERT model's attention mask 1 at tokens and 0 at padding.
TEST_F(TextTrainCliTest, TextRowsEqualAHandEncodingWithTheMask) {
  const fs::path saved = dir_ / "out" / "bert.onnx", m_text = dir_ / "text.jsonl", m_npy = dir_ / "npy.jsonl";
  const int64_t seq = 10, vocab_size = 12;
  // --no-shuffle: the text rows in file order, as the npy rows below are by default.
  CommandResult r = Train("models/tiny_bert.onnx", (corpus_ / "train.tsv").string(),
                          "--seq 10 --vocab-size 12 --no-shuffle --metrics " + m_text.string() + " --save " +
                              saved.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("mask -> 'attention_mask'"));
  const std::vector<std::string> vocab = Lines(dir_ / "out" / "bert.vocab.txt");
  ASSERT_EQ(vocab.size(), static_cast<size_t>(vocab_size));
  EXPECT_EQ(vocab[0], "<pad>");
  EXPECT_EQ(vocab[1], "<unk>");

  // The vocabulary: the 10 most frequent training words, by count then byte order.
  std::map<std::string, int64_t> counts;
  for (const testing::TextExample& e : train_) {
    std::istringstream words(e.text);
    for (std::string w; words >> w;) ++counts[w];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& [w, c] : counts) ranked.push_back({-c, w});
  std::sort(ranked.begin(), ranked.end());
  for (int64_t i = 2; i < vocab_size; ++i) EXPECT_EQ(vocab[i], ranked[i - 2].second) << "id " << i;

  std::map<std::string, int64_t> ids;
  for (size_t i = 0; i < vocab.size(); ++i) ids[vocab[i]] = static_cast<int64_t>(i);
  const int64_t n = static_cast<int64_t>(train_.size());
  std::vector<int64_t> tokens(n * seq, 0), mask(n * seq, 0), labels(n);
  for (int64_t i = 0; i < n; ++i) {
    std::istringstream words(train_[i].text);
    int64_t j = 0;
    for (std::string w; words >> w && j < seq; ++j) {
      tokens[i * seq + j] = ids.count(w) ? ids[w] : 1;
      mask[i * seq + j] = 1;
    }
    labels[i] = train_[i].label;
  }
  const fs::path npy = dir_ / "npy";
  fs::create_directories(npy);
  ASSERT_TRUE(data::WriteNpy((npy / "tokens.npy").string(), ir::Tensor::FromVector<int64_t>({n, seq}, tokens)).ok());
  ASSERT_TRUE(data::WriteNpy((npy / "attention_mask.npy").string(),
                             ir::Tensor::FromVector<int64_t>({n, seq}, mask)).ok());
  ASSERT_TRUE(data::WriteNpy((npy / "labels.npy").string(), ir::Tensor::FromVector<int64_t>({n}, labels)).ok());
  r = Train("models/tiny_bert.onnx", npy.string(), "--metrics " + m_npy.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(MetricsWithoutTiming(m_npy), MetricsWithoutTiming(m_text));
  // The mask matters: all-ones masks train differently.
  std::fill(mask.begin(), mask.end(), 1);
  ASSERT_TRUE(data::WriteNpy((npy / "attention_mask.npy").string(),
                             ir::Tensor::FromVector<int64_t>({n, seq}, mask)).ok());
  r = Train("models/tiny_bert.onnx", npy.string(), "--metrics " + m_npy.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(MetricsWithoutTiming(m_npy)[0]["loss"], MetricsWithoutTiming(m_text)[0]["loss"]);
}

// The vocabulary lives in the checkpoint folder; a resumed run reuses it (and refuses a changed one).
TEST_F(TextTrainCliTest, ResumeReusesTheSavedVocabulary) {
  const fs::path ck = dir_ / "ck", m_full = dir_ / "full.jsonl", m_half = dir_ / "half.jsonl";
  const std::string common = "--seq 12 --shuffle --seed 2 --data-format tsv ";
  CommandResult r = Train("models/tiny_classifier.onnx", corpus_.string(),
                          common + "--metrics " + m_full.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = RunCommand(Onnxpipe() + " train " + SourcePath("models/tiny_classifier.onnx") + " --data " + corpus_.string() +
                 " --batch 8 --steps 2 --optimizer adamw --lr 0.003 --no-dropout " + common + "--checkpoint-dir " +
                 ck.string() + " --metrics " + m_half.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(ck / "vocab.txt"));
  // --vocab-size would build another vocabulary; the resumed run takes the saved one.
  r = Train("models/tiny_classifier.onnx", corpus_.string(),
            common + "--vocab-size 6 --resume --checkpoint-dir " + ck.string() + " --metrics " + m_half.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(MetricsWithoutTiming(m_half), MetricsWithoutTiming(m_full));

  std::vector<std::string> vocab = Lines(ck / "vocab.txt");
  std::swap(vocab[2], vocab[3]);
  std::ofstream out(ck / "vocab.txt", std::ios::trunc);
  for (const std::string& t : vocab) out << t << "\n";
  out.close();
  r = Train("models/tiny_classifier.onnx", corpus_.string(),
            common + "--steps 6 --resume --checkpoint-dir " + ck.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("was written with vocab_crc32c"));
}

// The corpus is grouped by class (all neg, then all pos), as aclImdb folders and many TSV files are: text data is
// shuffled by default (the same rows as --shuffle, not file order), npy data keeps file order (the same rows as
// --no-shuffle), and the run header says which. A checkpoint of a default text run resumes bit for bit; resuming it
// in file order is refused naming the flag.
TEST_F(TextTrainCliTest, TextIsShuffledByDefaultAndNpyKeepsFileOrder) {
  std::map<std::string, std::vector<nlohmann::json>> text;
  for (const std::string order : {"", "--shuffle", "--no-shuffle"}) {
    const fs::path m = dir_ / ("text" + std::to_string(text.size()) + ".jsonl");
    CommandResult r = Train("models/tiny_classifier.onnx", corpus_.string(),
                            "--seq 12 --seed 5 " + order + " --metrics " + m.string());
    ASSERT_EQ(r.exit_code, 0) << order << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr(order == "--no-shuffle" ? "4 steps, rows in file order\n"
                                                         : "4 steps, rows shuffled per epoch (seed 5)\n"))
        << order;
    text[order] = MetricsWithoutTiming(m);
  }
  ASSERT_EQ(text[""].size(), 4u);
  EXPECT_EQ(text[""], text["--shuffle"]);
  EXPECT_NE(text[""][0]["loss"], text["--no-shuffle"][0]["loss"]);

  std::map<std::string, std::vector<nlohmann::json>> npy;
  const std::string golden = SourcePath("models/golden/tiny_classifier/data");
  for (const std::string order : {"", "--shuffle", "--no-shuffle"}) {
    const fs::path m = dir_ / ("npy" + std::to_string(npy.size()) + ".jsonl");
    CommandResult r = Train("models/tiny_classifier.onnx", golden, "--seed 5 " + order + " --metrics " + m.string());
    ASSERT_EQ(r.exit_code, 0) << order << "\n" << r.err;
    EXPECT_THAT(r.out, HasSubstr(order == "--shuffle" ? "4 steps, rows shuffled per epoch (seed 5)\n"
                                                      : "4 steps, rows in file order\n"))
        << order;
    npy[order] = MetricsWithoutTiming(m);
  }
  ASSERT_EQ(npy[""].size(), 4u);
  EXPECT_EQ(npy[""], npy["--no-shuffle"]);
  EXPECT_NE(npy[""][0]["loss"], npy["--shuffle"][0]["loss"]);

  // 2 steps with a checkpoint, then --resume to 4 (batch 8 of 48 rows: the resumed steps continue the permutation).
  const fs::path ck = dir_ / "ck", m_resumed = dir_ / "resumed.jsonl";
  const std::string text_flags = "--seq 12 --seed 5 --checkpoint-dir " + ck.string() + " --metrics " +
                                 m_resumed.string();
  CommandResult r = Train("models/tiny_classifier.onnx", corpus_.string(), text_flags + " --steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Train("models/tiny_classifier.onnx", corpus_.string(), text_flags + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(MetricsWithoutTiming(m_resumed), text[""]);
  r = Train("models/tiny_classifier.onnx", corpus_.string(), text_flags + " --steps 6 --resume --no-shuffle");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("was written with shuffle true, but this run has false"));
  EXPECT_THAT(r.err, HasSubstr("--shuffle or --no-shuffle; text data is shuffled by default"));
}

TEST_F(TextTrainCliTest, WhatTextCannotFeedIsAClearError) {
  // A dynamic sequence dim needs --seq.
  CommandResult r = Train("models/tiny_classifier.onnx", corpus_.string(), "");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("input 'tokens' dim 1 is 'S'): pass --seq S"));
  r = Train("models/tiny_classifier.onnx", corpus_.string(), "--seq 8 --vocab-size 5000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--vocab-size 5000 exceeds the rows of the model's embedding table 'emb.weight' (2000)"));
  r = Train("models/tiny_classifier.onnx", (corpus_ / "train.tsv").string(), "--seq 8 --eval");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--eval needs a test split"));
  fs::create_directories(dir_ / "empty");
  r = Train("models/tiny_classifier.onnx", (dir_ / "empty").string(), "--seq 8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--data-format npy|aclimdb|tsv"));
  r = Train("models/tiny_classifier.onnx", corpus_.string(), "--seq 8 --data-format csv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--data-format expects npy, aclimdb or tsv, got 'csv'"));
}

}  // namespace
}  // namespace onnxpipe
