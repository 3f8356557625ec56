// Internal to frontend/onnx: reading protobuf files and crash-safe writing of output files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace onnxpipe::onnx_frontend {

// Parses `path` into `msg` straight from the file. NotFound when missing; InvalidArgument naming
// the file and `what` ("ONNX model") when it is not a regular file, over protobuf's 2 GiB limit,
// or does not parse.
absl::Status ParseProtoFile(const std::string& path, google::protobuf::Message& msg,
                            const char* what);

// The folder of `path` ("." for a bare file name).
std::string FolderOf(const std::string& path);

// Writes a file so that readers of `path` see the old file or the whole new one: bytes go to
// `<path>.tmp.<pid>` in the same folder; Commit() fsyncs it, renames it over `path` and fsyncs
// the folder. Destroying an uncommitted writer removes the temp file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  absl::Status Open();
  absl::Status Write(const void* data, int64_t n);
  absl::Status Write(std::string_view s) { return Write(s.data(), static_cast<int64_t>(s.size())); }
  // Zero bytes up to the next multiple of `alignment`.
  absl::Status PadTo(int64_t alignment);
  absl::Status Commit();
  int64_t size() const { return size_; }

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
  int64_t size_ = 0;
  bool committed_ = false;
};

}  // namespace onnxpipe::onnx_frontend
