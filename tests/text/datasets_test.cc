#include "executor/text/datasets.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "executor/io/atomic_file.h"
#include "executor/text/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cli/cli_util.h"
#include "tests/io/test_dir.h"

namespace onnxpipe::text {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

namespace fs = std::filesystem;
using ::testing::ElementsAre;

void Put(const fs::path& path, const std::string& content) {
  fs::create_directories(path.parent_path());
  ASSERT_TRUE(io::WriteFileAtomically(path.string(), content).ok()) << path;
}

// A miniature aclImdb with the real tree's noise: train/unsup, .feat files, urls_*.txt, imdb.vocab, README.
// File names are chosen so byte order differs from numeric order (10_8 < 2_7).
void MakeAclImdb(const fs::path& root) {
  Put(root / "README", "Large Movie Review Dataset (miniature)\n");
  Put(root / "imdb.vocab", "the\nand\n");
  Put(root / "train/labeledBow.feat", "9 0:9 1:1\n");
  Put(root / "train/urls_pos.txt", "http://example.com/a\n");
  Put(root / "train/pos/2_7.txt", "Loved it.<br /><br />Great acting!");
  Put(root / "train/pos/10_8.txt", "A masterpiece, truly.");
  Put(root / "train/pos/0_9.txt", "Best film I've seen — ever.");
  Put(root / "train/neg/1_2.txt", "Boring. Awful plot.");
  Put(root / "train/neg/11_1.txt", "Terrible, just terrible.\n");
  Put(root / "train/unsup/0_0.txt", "unlabelled review, ignored");
  Put(root / "train/unsup/1_0.txt", "another one");
  Put(root / "test/pos/0_10.txt", "Wonderful.");
  Put(root / "test/neg/0_3.txt", "Bad.");
  Put(root / "test/neg/5_4.txt", "Not good, not awful.");
  Put(root / "test/neg/.hidden.txt", "editor backup, ignored");
  Put(root / "test/neg/notes.md", "not a review");
}

// The archive is made by Python's tarfile/zipfile, an implementation independent of libarchive.
std::string MakeArchive(const fs::path& parent, const std::string& out, const std::string& mode) {
  std::string script =
      "import sys, tarfile, zipfile, os\n"
      "parent, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]\n"
      "os.chdir(parent)\n"
      "if mode == 'zip':\n"
      "    with zipfile.ZipFile(out, 'w', zipfile.ZIP_DEFLATED) as z:\n"
      "        for d, _, fs in sorted(os.walk('aclImdb')):\n"
      "            for f in sorted(fs): z.write(os.path.join(d, f))\n"
      "else:\n"
      "    with tarfile.open(out, mode) as t: t.add('aclImdb')\n";
  std::string py = (parent / "mk.py").string();
  EXPECT_TRUE(io::WriteFileAtomically(py, script).ok());
  CommandResult r = RunCommand(ShellQuote(ONNXPIPE_PYTHON) + " " + ShellQuote(py) + " " + ShellQuote(parent.string()) +
                               " " + ShellQuote(out) + " " + mode + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return out;
}

void ExpectSameSplit(const TextSplit& a, const TextSplit& b, const std::string& what) {
  EXPECT_EQ(a.texts, b.texts) << what;
  EXPECT_EQ(a.labels, b.labels) << what;
  EXPECT_EQ(a.sources, b.sources) << what;
}

TEST(AclImdbTest, FolderLayoutOrderAndLabels) {
  TestDir dir("aclimdb_folder");
  MakeAclImdb(fs::path(dir.path()) / "aclImdb");
  auto ds = LoadAclImdb(dir.Path("aclImdb"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->num_classes, 2);
  EXPECT_THAT(ds->train.sources, ElementsAre("train/neg/11_1.txt", "train/neg/1_2.txt", "train/pos/0_9.txt",
                                             "train/pos/10_8.txt", "train/pos/2_7.txt"));
  EXPECT_THAT(ds->train.labels, ElementsAre(0, 0, 1, 1, 1));
  EXPECT_EQ(ds->train.texts[0], "Terrible, just terrible.\n");
  EXPECT_EQ(ds->train.texts[4], "Loved it.<br /><br />Great acting!");
  EXPECT_THAT(ds->test.sources, ElementsAre("test/neg/0_3.txt", "test/neg/5_4.txt", "test/pos/0_10.txt"));
  EXPECT_THAT(ds->test.labels, ElementsAre(0, 0, 1));
  EXPECT_EQ(ds->test.texts[2], "Wonderful.");

  // The folder the archive was unpacked in works too, and so does the format dispatch.
  auto parent = LoadTextDataset(*ParseTextFormat("aclimdb"), dir.path());
  ASSERT_TRUE(parent.ok()) << parent.status();
  ExpectSameSplit(ds->train, parent->train, "parent folder");
}

TEST(AclImdbTest, ArchivesReadLikeTheFolder) {
  TestDir dir("aclimdb_archive");
  fs::path root(dir.path());
  MakeAclImdb(root / "aclImdb");
  auto folder = LoadAclImdb((root / "aclImdb").string());
  ASSERT_TRUE(folder.ok()) << folder.status();
  for (auto [name, mode] : std::vector<std::pair<std::string, std::string>>{
           {"aclImdb_v1.tar.gz", "w:gz"}, {"plain.tar", "w"}, {"xz.tar.xz", "w:xz"}, {"z.zip", "zip"}}) {
    std::string archive = MakeArchive(root, (root / name).string(), mode);
    auto ds = LoadAclImdb(archive);
    ASSERT_TRUE(ds.ok()) << name << ": " << ds.status();
    ExpectSameSplit(folder->train, ds->train, name + " train");
    ExpectSameSplit(folder->test, ds->test, name + " test");
  }

  // A truncated download is reported as such, naming the file.
  std::string bytes = *io::ReadFileToString((root / "aclImdb_v1.tar.gz").string());
  std::string cut = (root / "cut.tar.gz").string();
  ASSERT_TRUE(io::WriteFileAtomically(cut, bytes.substr(0, bytes.size() * 2 / 3)).ok());
  auto r = LoadAclImdb(cut);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(cut), std::string::npos) << r.status();

  // Not an archive at all.
  std::string text = (root / "reviews.txt").string();
  ASSERT_TRUE(io::WriteFileAtomically(text, "just some text, not an archive\n").ok());
  r = LoadAclImdb(text);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot read it as an archive"), std::string::npos) << r.status();
}

TEST(AclImdbTest, MissingOrEmptyClassFolders) {
  TestDir dir("aclimdb_errors");
  fs::path root(dir.path());
  MakeAclImdb(root / "a");
  fs::remove_all(root / "a/test/neg");
  auto r = LoadAclImdb((root / "a").string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("missing folder '" + (root / "a/test/neg").string() + "'"), std::string::npos)
      << r.status();

  MakeAclImdb(root / "b");
  for (const auto& e : fs::directory_iterator(root / "b/train/pos")) fs::remove(e.path());
  r = LoadAclImdb((root / "b").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no reviews in train/pos"), std::string::npos) << r.status();

  r = LoadAclImdb((root / "nowhere").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nowhere"), std::string::npos);

  // An archive without the tree.
  Put(root / "c/aclImdb/other/x.txt", "x");
  std::string archive = MakeArchive(root / "c", (root / "c/empty.tar.gz").string(), "w:gz");
  r = LoadAclImdb(archive);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no reviews in train/neg"), std::string::npos) << r.status();

  EXPECT_FALSE(ParseTextFormat("csv").ok());
  EXPECT_NE(ParseTextFormat("csv").status().message().find("--data-format"), std::string::npos);
}

TEST(TsvTest, ParsesLabelsAndText) {
  TestDir dir("tsv_ok");
  std::string path = dir.Path("train.tsv");
  ASSERT_TRUE(io::WriteFileAtomically(path,
                                      "\xEF\xBB\xBF"
                                      "1\tGood movie\r\n"
                                      "\n"
                                      "0\tBad\tmovie, with a tab\n"
                                      "2\t\n"
                                      "10\tlast line without newline")
                  .ok());
  auto s = LoadTsvFile(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->labels, ElementsAre(1, 0, 2, 10));
  EXPECT_THAT(s->texts, ElementsAre("Good movie", "Bad\tmovie, with a tab", "", "last line without newline"));
  EXPECT_THAT(s->sources, ElementsAre("train.tsv:1", "train.tsv:3", "train.tsv:4", "train.tsv:5"));

  // Folder form: train.tsv + test.tsv; num_classes spans both splits.
  ASSERT_TRUE(io::WriteFileAtomically(dir.Path("test.tsv"), "0\ta\n3\tb\n").ok());
  auto ds = LoadTextDataset(*ParseTextFormat("tsv"), dir.path());
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->train.size(), 4u);
  EXPECT_EQ(ds->test.size(), 2u);
  EXPECT_EQ(ds->num_classes, 11);
  // Single-file form: train only.
  auto single = LoadTsv(dir.Path("test.tsv"));
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->train.size(), 2u);
  EXPECT_EQ(single->test.size(), 0u);
  EXPECT_EQ(single->num_classes, 4);
}

TEST(TsvTest, BadLinesNameFileAndLine) {
  TestDir dir("tsv_bad");
  struct Case {
    std::string content;
    int line;
  };
  std::vector<Case> cases = {
      {"1\tok\n0\tok\nx\thello\n", 3},
      {"1\tok\nno tab here\n", 2},
      {"-1\tnegative\n", 1},
      {"\tno label\n", 1},
      {"1.5\tfraction\n", 1},
      {" 1\tspace\n", 1},
      {"99999999999999999999\tbig\n", 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string path = dir.Path("bad" + std::to_string(i) + ".tsv");
    ASSERT_TRUE(io::WriteFileAtomically(path, cases[i].content).ok());
    auto r = LoadTsvFile(path);
    ASSERT_FALSE(r.ok()) << "case " << i;
    EXPECT_NE(r.status().message().find(path + ":" + std::to_string(cases[i].line) + ": expected <label><TAB><text>"),
              std::string::npos)
        << "case " << i << ": " << r.status();
  }
  std::string empty = dir.Path("empty.tsv");
  ASSERT_TRUE(io::WriteFileAtomically(empty, "\n\n").ok());
  auto r = LoadTsvFile(empty);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no examples"), std::string::npos);
  r = LoadTsvFile(dir.Path("absent.tsv"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);

  fs::create_directories(dir.Path("only_train"));
  ASSERT_TRUE(io::WriteFileAtomically(dir.Path("only_train/train.tsv"), "1\tx\n").ok());
  auto ds = LoadTsv(dir.Path("only_train"));
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("test.tsv"), std::string::npos) << ds.status();
}

// models/make_text_data.py writes the same corpus in both layouts; the two readers must agree on every example
// (the TSV squeezes whitespace, which the tokenizer ignores anyway).
TEST(TextDataTest, ShippedGeneratorLayoutsAgree) {
  if (!fs::exists("/usr/share/games/fortunes/computers")) GTEST_SKIP() << "Debian package 'fortunes' not installed";
  TestDir dir("text_data");
  std::string out = dir.Path("fortunes");
  CommandResult gen = RunCommand(ShellQuote(ONNXPIPE_PYTHON) + " " +
                                 ShellQuote(std::string(ONNXPIPE_SOURCE_DIR) + "/models/make_text_data.py") +
                                 " --out " + ShellQuote(out) + " 2>&1");
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  auto imdb = LoadAclImdb(out);
  auto tsv = LoadTsv(out);
  ASSERT_TRUE(imdb.ok()) << imdb.status();
  ASSERT_TRUE(tsv.ok()) << tsv.status();
  for (auto [a, b] : {std::pair{&imdb->train, &tsv->train}, std::pair{&imdb->test, &tsv->test}}) {
    ASSERT_EQ(a->size(), b->size());
    ASSERT_GT(a->size(), 10u);
    std::multiset<std::pair<int64_t, std::vector<std::string>>> x, y;
    for (size_t i = 0; i < a->size(); ++i) x.emplace(a->labels[i], Tokenize(a->texts[i]));
    for (size_t i = 0; i < b->size(); ++i) y.emplace(b->labels[i], Tokenize(b->texts[i]));
    EXPECT_TRUE(x == y);
  }
}

}  // namespace
}  // namespace onnxpipe::text
