// Crash-safe file replacement. A reader of `path` sees either the old file or the complete new one, never a
// prefix: bytes go to `<path>.tmp.<pid>` in the same folder, which is fsync'ed, renamed over `path` (atomic on
// POSIX file systems within one folder) and then the folder is fsync'ed so the rename itself survives a power loss.
// A process killed mid-write leaves at most a stale `<path>.tmp.<pid>` beside an intact `path`.
// The temp name is per process: one writer per target path at a time within a process.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::io {

// Writes `bytes` to `path` atomically (see above). The folder must exist.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

// Streaming variant for files too large to build in memory (checkpoints):
//   ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Open(path));
//   RETURN_IF_ERROR(w->Write(chunk)); ...
//   RETURN_IF_ERROR(w->Commit());   // or w->Abort(); destroying an uncommitted writer aborts too.
// Nothing is visible at `path` until Commit() returns OK. After a failed Write or Commit the temp file is removed
// and further calls fail.
class AtomicFileWriter {
 public:
  static absl::StatusOr<std::unique_ptr<AtomicFileWriter>> Open(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Write(std::string_view chunk);
  absl::Status Write(const void* data, size_t n) { return Write(std::string_view(static_cast<const char*>(data), n)); }
  // Flushes, fsyncs, renames over the target and fsyncs the folder.
  absl::Status Commit();
  // Closes and deletes the temp file; `path` is untouched. Safe to call more than once.
  void Abort();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  // Bytes accepted by Write so far.
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd);
  absl::Status FlushBuffer();
  absl::Status WriteAll(const char* data, size_t n);

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  std::string buffer_;  // coalesces small writes (headers, index entries) into large write(2) calls
  uint64_t bytes_written_ = 0;
};

// The temp-file name WriteFileAtomically / AtomicFileWriter use for `path` in this process.
std::string AtomicTempPath(const std::string& path);

// Reads a whole file; NotFound / a clear error naming the file otherwise.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// fsyncs a folder so that renames and creations inside it are durable.
absl::Status SyncDirectory(const std::string& dir);

}  // namespace onnxpipe::io
