// A folder of rolling checkpoints:
//   DIR/step_<n>.ckpt   one per saved step (SaveCheckpoint format), the newest `keep_last` kept
//   DIR/latest          one line, "step_<n>.ckpt": the checkpoint to resume from
// Save writes the step file atomically, then the `latest` pointer atomically, then prunes; a kill at any moment
// leaves `latest` naming a complete checkpoint (the new one or the previous one). Stale `*.tmp.<pid>` files of
// processes that no longer run (killed mid-write) are removed on the next Save.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/io/checkpoint.h"

namespace onnxpipe::io {

class CheckpointManager {
 public:
  // keep_last <= 0 keeps every checkpoint.
  CheckpointManager(std::string dir, int keep_last);

  // Saves `checkpoint` as step_<metadata.step>.ckpt (replacing one of the same step), points `latest` at it and
  // deletes the oldest step files beyond keep_last (never the one just written). Creates the folder if needed.
  // Returns the path written.
  absl::StatusOr<std::string> Save(const Checkpoint& checkpoint);

  // The checkpoint `latest` names; nullopt when the folder has no `latest` (nothing to resume). An error when the
  // pointer is malformed or names a missing file.
  absl::StatusOr<std::optional<std::string>> LatestPath() const;
  // LoadCheckpoint(LatestPath()); NotFound when there is nothing to resume from.
  absl::StatusOr<Checkpoint> LoadLatest() const;

  // Steps of the step_<n>.ckpt files present, ascending.
  absl::StatusOr<std::vector<int64_t>> ListSteps() const;

  static std::string FileName(int64_t step);  // "step_<n>.ckpt"
  const std::string& dir() const { return dir_; }

 private:
  void RemoveStaleTempFiles() const;

  std::string dir_;
  int keep_last_;
};

}  // namespace onnxpipe::io
