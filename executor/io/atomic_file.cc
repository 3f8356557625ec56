// Atomic replacement with POSIX calls rather than std::ofstream: ofstream cannot fsync, and a file that was renamed
// into place without fsync can show up empty after a crash on ext4/xfs (the rename is journaled before the data).
#include "executor/io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "frontend/ir/status.h"

namespace onnxpipe::io {
namespace {

constexpr size_t kBufferSize = 1 << 20;

absl::Status ErrnoError(int err, const std::string& what, const std::string& file) {
  std::string msg = absl::StrCat(what, " '", file, "': ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

std::string ParentDir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

std::string AtomicTempPath(const std::string& path) { return absl::StrCat(path, ".tmp.", static_cast<long>(getpid())); }

absl::Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open folder", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems (e.g. certain network mounts) refuse fsync on a folder; the rename is still atomic there.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) return ErrnoError(err, "cannot fsync folder", dir);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("atomic write: empty file name");
  std::string temp = AtomicTempPath(path);
  // O_TRUNC, not O_EXCL: a stale temp of an earlier process that had our pid is garbage, not a conflict.
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    absl::Status s = ErrnoError(err, "cannot create temp file", temp);
    return absl::Status(s.code(), absl::StrCat(s.message(), " (writing '", path, "')"));
  }
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(temp), fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, int fd)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {
  buffer_.reserve(kBufferSize);
}

AtomicFileWriter::~AtomicFileWriter() { Abort(); }

void AtomicFileWriter::Abort() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
  buffer_.clear();
}

absl::Status AtomicFileWriter::WriteAll(const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd_, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError(errno, "cannot write", temp_path_);
      Abort();
      return s;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::FlushBuffer() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = WriteAll(buffer_.data(), buffer_.size());
  buffer_.clear();
  return s;
}

absl::Status AtomicFileWriter::Write(std::string_view chunk) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("write to '", path_, "' after commit/abort"));
  bytes_written_ += chunk.size();
  if (buffer_.size() + chunk.size() <= kBufferSize) {
    buffer_.append(chunk);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(FlushBuffer());
  if (chunk.size() >= kBufferSize) return WriteAll(chunk.data(), chunk.size());
  buffer_.append(chunk);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("commit of '", path_, "' after commit/abort"));
  RETURN_IF_ERROR(FlushBuffer());
  if (::fsync(fd_) != 0) {
    absl::Status s = ErrnoError(errno, "cannot fsync", temp_path_);
    Abort();
    return s;
  }
  if (::close(fd_) != 0) {
    absl::Status s = ErrnoError(errno, "cannot close", temp_path_);
    fd_ = -1;
    ::unlink(temp_path_.c_str());
    return s;
  }
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    absl::Status s = ErrnoError(errno, absl::StrCat("cannot rename '", temp_path_, "' to"), path_);
    ::unlink(temp_path_.c_str());
    return s;
  }
  return SyncDirectory(ParentDir(path_));
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w->Write(bytes));
  return w->Commit();
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is a folder, expected a file"));
  }
  std::string out;
  if (st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      absl::Status s = ErrnoError(errno, "cannot read", path);
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace onnxpipe::io
