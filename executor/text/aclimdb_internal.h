// Shared between the folder and the archive readers of aclImdb (datasets.cc, aclimdb_archive.cc). Not API.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/text/datasets.h"

namespace onnxpipe::text::internal {

struct Review {
  std::string split;  // "train" | "test"
  std::string cls;    // "neg" | "pos"
  std::string name;   // file name, "<id>_<rating>.txt"
  std::string text;
};

// True for the file names that hold reviews: "*.txt", not hidden.
bool IsReviewFileName(const std::string& name);

// Sorts into the documented order, labels neg 0 / pos 1, and refuses a class folder without reviews.
// `where` names the folder or archive in messages.
absl::StatusOr<TextDataset> AssembleAclImdb(const std::string& where, std::vector<Review> reviews);

absl::StatusOr<std::vector<Review>> ReadAclImdbArchive(const std::string& path);

}  // namespace onnxpipe::text::internal
