// Protobuf wire format by hand: the three messages TensorBoard needs are tiny and fixed, and keeping protobuf out
// of executor/ is a design rule (protobuf types live only in frontend/onnx).
#include "executor/io/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "executor/io/crc32c.h"
#include "frontend/ir/status.h"

namespace onnxpipe::io {
namespace tfevents {
namespace {

// Wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutTag(std::string* out, uint32_t field, uint32_t wire_type) { PutVarint(out, (field << 3) | wire_type); }
void PutFixed32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutBytesField(std::string* out, uint32_t field, std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}
void PutDoubleField(std::string* out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  PutTag(out, field, kFixed64);
  PutFixed64(out, bits);
}

}  // namespace

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutFixed64(&out, data.size());
  PutFixed32(&out, MaskCrc32c(Crc32c(out.data(), 8)));
  out.append(data.data(), data.size());
  PutFixed32(&out, MaskCrc32c(Crc32c(data)));
  return out;
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string ev;
  PutDoubleField(&ev, 1, wall_time);
  PutBytesField(&ev, 3, "brain.Event:2");
  return ev;
}

std::string EncodeScalarEvent(double wall_time, int64_t step,
                              const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    PutBytesField(&v, 1, tag);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    PutTag(&v, 2, kFixed32);
    PutFixed32(&v, bits);
    PutBytesField(&summary, 1, v);
  }
  std::string ev;
  PutDoubleField(&ev, 1, wall_time);
  // int64 is encoded as its two's-complement uint64 varint (negative steps take 10 bytes).
  PutTag(&ev, 2, kVarint);
  PutVarint(&ev, static_cast<uint64_t>(step));
  PutBytesField(&ev, 5, summary);
  return ev;
}

}  // namespace tfevents

namespace {

double NowSeconds() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() / 1e6;
}

// Host names go into a file name: keep it to characters every file system and TensorBoard's glob accept.
std::string SafeHostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string host(buf);
  for (char& c : host) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_';
    if (!ok) c = '_';
  }
  return host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--tensorboard: cannot create folder '", dir, "': ", ec.message()));
  double now = NowSeconds();
  std::string base = absl::StrCat((std::filesystem::path(dir) / "events.out.tfevents.").string(),
                                  static_cast<int64_t>(now), ".", SafeHostName());
  std::string path = base;
  int fd = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (attempt > 0) path = absl::StrCat(base, ".", static_cast<long>(getpid()), ".", attempt);
    // O_EXCL: two writers started in the same second must not interleave records in one file.
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensorboard: cannot create event file '", path, "': ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(path, fd));
  RETURN_IF_ERROR(w->WriteRecord(tfevents::EncodeFileVersionEvent(now)));
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status TensorBoardWriter::WriteRecord(std::string_view data) {
  std::string rec = tfevents::FrameRecord(data);
  const char* p = rec.data();
  size_t n = rec.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("cannot write TensorBoard event file '", path_, "': ", std::strerror(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::AddScalar(std::string_view tag, int64_t step, float value) {
  return AddScalar(tag, step, value, NowSeconds());
}

absl::Status TensorBoardWriter::AddScalar(std::string_view tag, int64_t step, float value, double wall_time) {
  if (tag.empty())
    return absl::InvalidArgumentError(absl::StrCat("TensorBoard scalar with an empty tag (", path_, ")"));
  return WriteRecord(tfevents::EncodeScalarEvent(wall_time, step, {{std::string(tag), value}}));
}

absl::Status TensorBoardWriter::AddScalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  for (const auto& v : values) {
    if (v.first.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("TensorBoard scalar with an empty tag (", path_, ")"));
    }
  }
  return WriteRecord(tfevents::EncodeScalarEvent(NowSeconds(), step, values));
}

}  // namespace onnxpipe::io
