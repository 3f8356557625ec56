#include "executor/text/datasets.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "executor/io/atomic_file.h"
#include "executor/text/aclimdb_internal.h"
#include "frontend/ir/status.h"

namespace onnxpipe::text {
namespace fs = std::filesystem;

namespace internal {

bool IsReviewFileName(const std::string& name) {
  return name.size() > 4 && name[0] != '.' && name.compare(name.size() - 4, 4, ".txt") == 0;
}

absl::StatusOr<TextDataset> AssembleAclImdb(const std::string& where, std::vector<Review> reviews) {
  std::sort(reviews.begin(), reviews.end(), [](const Review& a, const Review& b) {
    return std::tie(a.split, a.cls, a.name) < std::tie(b.split, b.cls, b.name);
  });
  TextDataset ds;
  ds.num_classes = 2;
  for (Review& r : reviews) {
    TextSplit& split = r.split == "train" ? ds.train : ds.test;
    split.labels.push_back(r.cls == "pos" ? 1 : 0);
    split.sources.push_back(absl::StrCat(r.split, "/", r.cls, "/", r.name));
    split.texts.push_back(std::move(r.text));
  }
  for (const char* split : {"train", "test"}) {
    const TextSplit& s = std::string(split) == "train" ? ds.train : ds.test;
    for (int64_t label : {0, 1}) {
      if (std::find(s.labels.begin(), s.labels.end(), label) == s.labels.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--data '", where, "': no reviews in ", split, "/", label ? "pos" : "neg",
            " (expected aclImdb's layout: {train,test}/{pos,neg}/<id>_<rating>.txt, one review per file)"));
      }
    }
  }
  return ds;
}

}  // namespace internal

namespace {

absl::StatusOr<std::vector<internal::Review>> ReadAclImdbFolder(const std::string& root) {
  std::vector<internal::Review> reviews;
  for (const char* split : {"train", "test"}) {
    for (const char* cls : {"neg", "pos"}) {
      fs::path dir = fs::path(root) / split / cls;
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) {
        return absl::NotFoundError(absl::StrCat("--data '", root, "': missing folder '", dir.string(),
                                                "' (expected an aclImdb folder with train/{pos,neg} and "
                                                "test/{pos,neg}, or aclImdb_v1.tar.gz)"));
      }
      fs::directory_iterator it(dir, ec);
      if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list '", dir.string(), "': ", ec.message()));
      for (const fs::directory_entry& e : it) {
        std::string name = e.path().filename().string();
        if (!internal::IsReviewFileName(name) || !e.is_regular_file(ec)) continue;
        ASSIGN_OR_RETURN(std::string text, io::ReadFileToString(e.path().string()));
        reviews.push_back({split, cls, std::move(name), std::move(text)});
      }
    }
  }
  return reviews;
}

// Strict class id: decimal digits only, fits int64.
bool ParseLabel(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

std::string Snippet(std::string_view line) {
  std::string s(line.substr(0, 40));
  for (char& c : s) {
    if (c == '\t') c = ' ';
  }
  return line.size() > 40 ? s + "..." : s;
}

}  // namespace

absl::StatusOr<TextFormat> ParseTextFormat(std::string_view name) {
  if (name == "aclimdb") return TextFormat::kAclImdb;
  if (name == "tsv") return TextFormat::kTsv;
  return absl::InvalidArgumentError(
      absl::StrCat("--data-format '", std::string(name), "': expected 'aclimdb' or 'tsv'"));
}

absl::StatusOr<TextDataset> LoadAclImdb(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--data '", path,
                                            "': no such file or folder (expected an aclImdb "
                                            "folder or aclImdb_v1.tar.gz)"));
  }
  if (!fs::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(std::vector<internal::Review> reviews, internal::ReadAclImdbArchive(path));
    return internal::AssembleAclImdb(path, std::move(reviews));
  }
  std::string root = path;
  // Accept the folder the archive was unpacked in, too.
  if (!fs::is_directory(fs::path(path) / "train", ec) && fs::is_directory(fs::path(path) / "aclImdb" / "train", ec)) {
    root = (fs::path(path) / "aclImdb").string();
  }
  ASSIGN_OR_RETURN(std::vector<internal::Review> reviews, ReadAclImdbFolder(root));
  return internal::AssembleAclImdb(root, std::move(reviews));
}

absl::StatusOr<TextSplit> LoadTsvFile(const std::string& path) {
  absl::StatusOr<std::string> content = io::ReadFileToString(path);
  if (!content.ok()) return Annotate(content.status(), "TSV data");
  return ParseTsv(*content, path);
}

absl::StatusOr<TextSplit> ParseTsv(std::string_view content, const std::string& path) {
  std::string_view rest = content;
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
  TextSplit split;
  const std::string name = fs::path(path).filename().string();
  for (size_t line_no = 1; !rest.empty(); ++line_no) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t tab = line.find('\t');
    int64_t label = 0;
    if (tab == std::string_view::npos || !ParseLabel(line.substr(0, tab), &label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": expected <label><TAB><text> with a non-negative integer class id as label, got \"",
          Snippet(line), "\""));
    }
    split.labels.push_back(label);
    split.texts.emplace_back(line.substr(tab + 1));
    split.sources.push_back(absl::StrCat(name, ":", line_no));
  }
  if (split.texts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no examples (expected lines of <label><TAB><text>)"));
  }
  return split;
}

absl::StatusOr<TextDataset> LoadTsv(const std::string& path) {
  TextDataset ds;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* f : {"train.tsv", "test.tsv"}) {
      if (!fs::exists(fs::path(path) / f, ec)) {
        return absl::NotFoundError(absl::StrCat("--data '", path, "': missing '", (fs::path(path) / f).string(),
                                                "' (expected a folder with train.tsv and test.tsv, or one .tsv file)"));
      }
    }
    ASSIGN_OR_RETURN(ds.train, LoadTsvFile((fs::path(path) / "train.tsv").string()));
    ASSIGN_OR_RETURN(ds.test, LoadTsvFile((fs::path(path) / "test.tsv").string()));
  } else {
    ASSIGN_OR_RETURN(ds.train, LoadTsvFile(path));
  }
  for (const TextSplit* s : {&ds.train, &ds.test}) {
    for (int64_t l : s->labels) ds.num_classes = std::max(ds.num_classes, l + 1);
  }
  return ds;
}

absl::StatusOr<TextDataset> LoadTextDataset(TextFormat format, const std::string& path) {
  switch (format) {
    case TextFormat::kAclImdb:
      return LoadAclImdb(path);
    case TextFormat::kTsv:
      return LoadTsv(path);
  }
  return absl::InvalidArgumentError("unknown text format");
}

}  // namespace onnxpipe::text
