#include "frontend/onnx/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontend/ir/status.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"

namespace onnxpipe::onnx_frontend {

namespace fs = std::filesystem;

absl::Status ParseProtoFile(const std::string& path, google::protobuf::Message& msg,
                            const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return NOT_FOUND() << path << ": file not found";
  if (!fs::is_regular_file(path, ec)) return INVALID_ARGUMENT() << path << ": not a regular file";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NOT_FOUND() << path << ": cannot open: " << std::strerror(errno);
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size > INT_MAX) {
    ::close(fd);
    return INVALID_ARGUMENT() << path << ": over protobuf's 2 GiB limit (or cannot stat); store "
                                         "the weights as external data";
  }
  bool ok;
  {
    google::protobuf::io::FileInputStream stream(fd);
    ok = msg.ParseFromZeroCopyStream(&stream);
  }
  ::close(fd);
  if (!ok) {
    return INVALID_ARGUMENT() << path << ": not a valid " << what
                              << " protobuf (truncated or corrupt file, or not ONNX at all)";
  }
  return absl::OkStatus();
}

std::string FolderOf(const std::string& path) {
  fs::path p = fs::path(path).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(absl::StrCat(path_, ".tmp.", ::getpid())) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && fd_ != -1) ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Open() {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    fd_ = -1;
    return INVALID_ARGUMENT() << path_ << ": cannot create '" << temp_path_
                              << "': " << std::strerror(errno);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Write(const void* data, int64_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t got = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return INVALID_ARGUMENT() << path_ << ": write failed: " << std::strerror(errno);
    }
    p += got;
    n -= got;
    size_ += got;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::PadTo(int64_t alignment) {
  static const char kZeros[4096] = {};
  int64_t pad = (alignment - size_ % alignment) % alignment;
  while (pad > 0) {
    const int64_t n = std::min<int64_t>(pad, sizeof(kZeros));
    RETURN_IF_ERROR(Write(kZeros, n));
    pad -= n;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (::fsync(fd_) != 0) {
    return INVALID_ARGUMENT() << path_ << ": fsync failed: " << std::strerror(errno);
  }
  ::close(fd_);
  fd_ = -2;  // closed; the destructor still removes the temp file unless committed
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    committed_ = true;  // nothing left to clean up
    return INVALID_ARGUMENT() << path_ << ": rename from '" << temp_path_
                              << "' failed: " << std::strerror(err);
  }
  committed_ = true;
  int dir = ::open(FolderOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::onnx_frontend
