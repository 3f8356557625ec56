#include <algorithm>
#include <random>

#include "executor/io/atomic_file.h"
#include "executor/text/tokenizer.h"
#include "executor/text/vocabulary.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/io/test_dir.h"

namespace onnxpipe::text {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Expected token lists are written out by hand from the rules in tokenizer.h.
TEST(TokenizerTest, TrickyStrings) {
  EXPECT_THAT(Tokenize("Don't STOP!! <br /><br />It's 10/10."),
              ElementsAre("don", "'", "t", "stop", "!", "!", "it", "'", "s", "10", "/", "10", "."));
  EXPECT_THAT(Tokenize("Hello,world"), ElementsAre("hello", ",", "world"));
  EXPECT_THAT(Tokenize("a<br/>b<BR>c<br  />d<Br / >e"), ElementsAre("a", "b", "c", "d", "e"));
  EXPECT_THAT(Tokenize("x<br />"), ElementsAre("x"));
  EXPECT_THAT(Tokenize("<b>bold</b>"), ElementsAre("<", "b", ">", "bold", "<", "/", "b", ">"));
  EXPECT_THAT(Tokenize("<br"), ElementsAre("<", "br"));
  EXPECT_THAT(Tokenize("<brx>"), ElementsAre("<", "brx", ">"));
  EXPECT_THAT(Tokenize("e-mail: x@y.com"), ElementsAre("e", "-", "mail", ":", "x", "@", "y", ".", "com"));
  EXPECT_THAT(Tokenize("..."), ElementsAre(".", ".", "."));
  EXPECT_THAT(Tokenize("(\"quoted\")"), ElementsAre("(", "\"", "quoted", "\"", ")"));
  EXPECT_THAT(Tokenize("  \t\n\r\v\f "), IsEmpty());
  EXPECT_THAT(Tokenize(""), IsEmpty());
  EXPECT_THAT(Tokenize(std::string("a\0b\x7f"
                                   "c\x01",
                                   6)),
              ElementsAre("a", "b", "c"));
  // UTF-8 bytes are word characters; only ASCII is lower-cased.
  EXPECT_THAT(Tokenize("Café ÜBER naïve"), ElementsAre("café", "Über", "naïve"));
  EXPECT_THAT(Tokenize("TAB\tsep\nNEW_line"), ElementsAre("tab", "sep", "new", "_", "line"));
  EXPECT_THAT(Tokenize("{[~`^|\\]}"), ElementsAre("{", "[", "~", "`", "^", "|", "\\", "]", "}"));
  EXPECT_THAT(Tokenize("<pad> <unk>"), ElementsAre("<", "pad", ">", "<", "unk", ">"));
}

TEST(VocabularyTest, FrequencyThenAlphabetical) {
  // Counts: a 3, b 2, c 2, d 1, e 1.
  std::vector<std::string> texts = {"b a a c", "C b A d", "e"};
  auto v5 = Vocabulary::Build(texts, 5);
  ASSERT_TRUE(v5.ok()) << v5.status();
  EXPECT_THAT(v5->tokens(), ElementsAre("<pad>", "<unk>", "a", "b", "c"));
  EXPECT_THAT(Vocabulary::Build(texts, 6)->tokens(), ElementsAre("<pad>", "<unk>", "a", "b", "c", "d"));
  auto all = Vocabulary::Build(texts, 100);
  EXPECT_THAT(all->tokens(), ElementsAre("<pad>", "<unk>", "a", "b", "c", "d", "e"));
  EXPECT_EQ(all->size(), 7);
  EXPECT_THAT(Vocabulary::Build(texts, 2)->tokens(), ElementsAre("<pad>", "<unk>"));
  auto bad = Vocabulary::Build(texts, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--vocab-size"), std::string::npos);

  EXPECT_EQ(v5->Id("<pad>"), Vocabulary::kPadId);
  EXPECT_EQ(v5->Id("a"), 2);
  EXPECT_EQ(v5->Id("c"), 4);
  EXPECT_EQ(v5->Id("d"), Vocabulary::kUnkId);
  EXPECT_EQ(v5->token(3), "b");
}

TEST(VocabularyTest, DeterministicUnderInputOrder) {
  // Many ties: 200 distinct words, each appearing 1-3 times.
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    std::string t;
    for (int k = 0; k <= i % 3; ++k) t += "w" + std::to_string(i * 7919 % 1000) + " ";
    texts.push_back(t);
  }
  auto ref = Vocabulary::Build(texts, 50);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    std::shuffle(texts.begin(), texts.end(), rng);
    auto v = Vocabulary::Build(texts, 50);
    ASSERT_TRUE(*v == *ref) << "trial " << trial;
  }
  // Top 48: all 3-count words (i % 3 == 2: 66 of them) would not fit; the kept ones are the alphabetically first.
  std::vector<std::string> three;
  for (int i = 0; i < 200; ++i) {
    if (i % 3 == 2) three.push_back("w" + std::to_string(i * 7919 % 1000));
  }
  std::sort(three.begin(), three.end());
  three.resize(48);
  std::vector<std::string> got(ref->tokens().begin() + 2, ref->tokens().end());
  EXPECT_EQ(got, three);
}

TEST(VocabularyTest, SaveLoadRoundTripAndFileForm) {
  TestDir dir("vocab_io");
  auto v = Vocabulary::Build({"the cat, the hat!", "The end."}, 10);
  ASSERT_TRUE(v.ok());
  std::string path = dir.Path("vocab.txt");
  ASSERT_TRUE(v->Save(path).ok());
  // the 3; then 1 each, byte order: "!" "," "." "cat" "end" "hat".
  EXPECT_EQ(*io::ReadFileToString(path), "<pad>\n<unk>\nthe\n!\n,\n.\ncat\nend\nhat\n");
  auto loaded = Vocabulary::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(*loaded == *v);
  EXPECT_EQ(loaded->Id("hat"), 8);
  EXPECT_EQ(dir.ListNames(), std::vector<std::string>{"vocab.txt"});  // atomic write leaves no temp
}

TEST(VocabularyTest, CorruptFilesAreRefusedWithFileAndLine) {
  TestDir dir("vocab_bad");
  struct Case {
    std::string content;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"", ":1: file is empty"},
      {"<pad>\n<unk>\nthe", ":3: last line has no newline"},
      {"the\n<unk>\n", ":1: first token is \"the\", not <pad>"},
      {"<pad>\nthe\n", ":2: second token is \"the\", not <unk>"},
      {"<pad>\n", ":2: missing <unk>"},
      {"<pad>\n<unk>\na\nb\na\n", ":5: duplicate token \"a\" (first on line 3)"},
      {"<pad>\n<unk>\na\n\nb\n", ":4: empty line"},
      {"<pad>\n<unk>\na b\n", ":3: token contains whitespace"},
      {"<pad>\r\n<unk>\r\n", ":1: token contains whitespace"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path = dir.Path("v" + std::to_string(i) + ".txt");
    ASSERT_TRUE(io::WriteFileAtomically(path, cases[i].content).ok());
    auto r = Vocabulary::Load(path);
    ASSERT_FALSE(r.ok()) << "case " << i;
    EXPECT_NE(r.status().message().find(path + cases[i].needle), std::string::npos)
        << "case " << i << ": " << r.status();
  }
  auto missing = Vocabulary::Load(dir.Path("absent.txt"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.txt"), std::string::npos);
}

TEST(VocabularyTest, EncodePadsAndTruncates) {
  auto v = Vocabulary::Build({"b a a c", "C b A d", "e"}, 5);  // <pad> <unk> a b c
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(v->Encode("A b z a", 6), ElementsAre(2, 3, 1, 2, 0, 0));
  EXPECT_THAT(v->Encode("a a b b c c", 3), ElementsAre(2, 2, 3));
  EXPECT_THAT(v->Encode("c, b", 4), ElementsAre(4, 1, 3, 0));  // "," is unknown
  EXPECT_THAT(v->Encode("", 2), ElementsAre(0, 0));
  EXPECT_THAT(v->Encode("a", 0), IsEmpty());
  ir::Tensor t = v->EncodeBatch({"c a", "b b b b b", ""}, 4);
  ASSERT_EQ(t.dtype(), ir::DType::kI64);
  ASSERT_EQ(t.dims(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(t.ToInt64Vector(), (std::vector<int64_t>{4, 2, 0, 0, 3, 3, 3, 3, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace onnxpipe::text
