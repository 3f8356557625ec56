// Labelled text corpora for classification training.
//
// aclImdb (Maas et al. 2011, aclImdb_v1.tar.gz): ROOT/{train,test}/{pos,neg}/<id>_<rating>.txt, one review per
// file; labels neg = 0, pos = 1; ROOT/train/unsup and every other file are ignored. ROOT may be
//   - the folder holding train/ and test/, or its parent (which holds aclImdb/), or
//   - the archive itself (any format and compression libarchive reads: .tar.gz, .tar, .zip ...), whose entries are
//     `[<top>/]{train,test}/{pos,neg}/*.txt` with one optional top folder (`aclImdb/` in the real archive).
// TSV: one example per line, `<label><TAB><text>`, label a non-negative integer class id; empty lines are skipped,
// a trailing '\r' and a leading UTF-8 BOM are dropped, further tabs belong to the text.
//
// Order is deterministic and the same for a folder and its archive: per split, all neg files sorted by file name
// (byte order), then all pos files sorted by file name; TSV keeps line order. Trainers shuffle with their own seed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::text {

struct TextSplit {
  std::vector<std::string> texts;
  std::vector<int64_t> labels;
  std::vector<std::string> sources;  // "train/pos/0_9.txt" or "train.tsv:12", for messages
  size_t size() const { return texts.size(); }
};

struct TextDataset {
  TextSplit train;
  TextSplit test;           // empty only for a single TSV file
  int64_t num_classes = 0;  // 1 + the largest label in either split
};

enum class TextFormat { kAclImdb, kTsv };
// "aclimdb" or "tsv" (the --data-format values); InvalidArgument naming the flag otherwise.
absl::StatusOr<TextFormat> ParseTextFormat(std::string_view name);

// A folder or an archive, as described above. Each of the four class folders must hold at least one review.
absl::StatusOr<TextDataset> LoadAclImdb(const std::string& path);

// One TSV file (errors name file:line).
absl::StatusOr<TextSplit> LoadTsvFile(const std::string& path);
// LoadTsvFile on bytes already in memory; `path` names them in errors and sources.
absl::StatusOr<TextSplit> ParseTsv(std::string_view content, const std::string& path);
// A folder with train.tsv and test.tsv (both required), or one .tsv file used as the train split (test empty).
absl::StatusOr<TextDataset> LoadTsv(const std::string& path);

absl::StatusOr<TextDataset> LoadTextDataset(TextFormat format, const std::string& path);

}  // namespace onnxpipe::text
