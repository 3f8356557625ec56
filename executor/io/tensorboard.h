// TensorBoard scalar logging without TensorFlow or protobuf: an event file is a sequence of TFRecords
//   u64 length | u32 masked CRC32C(length bytes) | data | u32 masked CRC32C(data)     (all little-endian)
// whose data are serialized tensorflow.Event messages, hand-encoded here:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2" (what TensorBoard's loader expects).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::io {

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) if needed and a new `events.out.tfevents.<unix seconds>.<host>` in it (a `.<pid>.<n>`
  // suffix is added if that name is taken), then writes the file_version record.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one Event with one scalar, stamped with the current wall time. Each call reaches the file (one
  // write(2) per record), so TensorBoard sees it while training runs and a crash loses nothing logged before.
  absl::Status AddScalar(std::string_view tag, int64_t step, float value);
  // Same with an explicit wall time (seconds since the Unix epoch).
  absl::Status AddScalar(std::string_view tag, int64_t step, float value, double wall_time);
  // Several scalars of one step in one Event.
  absl::Status AddScalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status WriteRecord(std::string_view data);

  std::string path_;
  int fd_ = -1;
};

// The pieces, exposed for tests and for other writers of TensorBoard data.
namespace tfevents {
// TFRecord framing of one record.
std::string FrameRecord(std::string_view data);
std::string EncodeFileVersionEvent(double wall_time);
std::string EncodeScalarEvent(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
}  // namespace tfevents

}  // namespace onnxpipe::io
