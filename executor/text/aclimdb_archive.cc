// Reads aclImdb straight from its archive with libarchive, so a user can point --data at the 84 MB download
// instead of unpacking 100k small files. Entries outside {train,test}/{pos,neg} (train/unsup's 50k reviews, the
// bag-of-words .feat files, imdb.vocab) are skipped without being decompressed into memory.
#include <archive.h>
#include <archive_entry.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "executor/text/aclimdb_internal.h"

namespace onnxpipe::text::internal {
namespace {

struct ArchiveCloser {
  void operator()(archive* a) const { archive_read_free(a); }
};

std::string ArchiveError(archive* a) {
  const char* e = archive_error_string(a);
  return e ? e : "unknown libarchive error";
}

}  // namespace

absl::StatusOr<std::vector<Review>> ReadAclImdbArchive(const std::string& path) {
  std::unique_ptr<archive, ArchiveCloser> a(archive_read_new());
  archive_read_support_filter_all(a.get());
  archive_read_support_format_all(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("--data '", path,
                                                   "': cannot read it as an archive: ", ArchiveError(a.get()),
                                                   " (expected an aclImdb folder or aclImdb_v1.tar.gz)"));
  }
  std::vector<Review> reviews;
  bool have_top = false;
  std::string top;
  archive_entry* entry = nullptr;
  while (true) {
    int rc = archive_read_next_header(a.get(), &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc == ARCHIVE_FATAL) {
      return absl::DataLossError(absl::StrCat("--data '", path, "': archive is damaged after ", reviews.size(),
                                              " reviews: ", ArchiveError(a.get())));
    }
    // ARCHIVE_WARN (e.g. an odd header charset) still yields a usable entry.
    if (archive_entry_filetype(entry) != AE_IFREG) continue;
    const char* raw_name = archive_entry_pathname(entry);
    if (raw_name == nullptr) continue;
    std::vector<std::string> parts = absl::StrSplit(raw_name, '/', absl::SkipEmpty());
    while (!parts.empty() && parts.front() == ".") parts.erase(parts.begin());
    std::string entry_top;
    if (parts.size() == 4) {
      entry_top = parts[0];
      parts.erase(parts.begin());
    }
    if (parts.size() != 3 || (parts[0] != "train" && parts[0] != "test") || (parts[1] != "pos" && parts[1] != "neg") ||
        !IsReviewFileName(parts[2])) {
      continue;
    }
    if (!have_top) {
      have_top = true;
      top = entry_top;
    } else if (entry_top != top) {
      return absl::InvalidArgumentError(absl::StrCat("--data '", path, "': reviews under two different top folders ('",
                                                     top, "/' and '", entry_top, "/'); expected one aclImdb tree"));
    }
    Review r{parts[0], parts[1], parts[2], {}};
    char buf[1 << 16];
    while (true) {
      la_ssize_t n = archive_read_data(a.get(), buf, sizeof(buf));
      if (n < 0) {
        return absl::DataLossError(
            absl::StrCat("--data '", path, "': cannot read entry '", raw_name, "': ", ArchiveError(a.get())));
      }
      if (n == 0) break;
      r.text.append(buf, static_cast<size_t>(n));
    }
    reviews.push_back(std::move(r));
  }
  return reviews;
}

}  // namespace onnxpipe::text::internal
