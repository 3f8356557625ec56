// A folder of rolling checkpoints:
//   DIR/step_<n>.ckpt   one per saved step (SaveCheckpoint format), the newest `keep_last` kept
//   DIR/step_<n>.shard-<i>-of-<S>.ckpt
//                       a multi-process run's shards of step n: each process writes its own tensors (SaveShard),
//                       and step_<n>.ckpt is then the manifest naming them (LoadCheckpoint reads them all)
//   DIR/latest          one line, "step_<n>.ckpt": the checkpoint to resume from
// Save writes the step file atomically, then the `latest` pointer atomically, then prunes; a kill at any moment
// leaves `latest` naming a complete checkpoint (the new one or the previous one). A sharded save is committed the
// same way once every shard is on disk (the caller's barrier), so a process killed while writing its shard leaves
// the previous checkpoint. Stale `*.tmp.<pid>` files of processes that no longer run (killed mid-write) are removed
// on the next Save (never by SaveShard: on a shared folder another node's writer may be at work).
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
  // Writes `shard` (its tensors, the step's metadata) as shard i of S of its step; returns the path written.
  absl::StatusOr<std::string> SaveShard(const Checkpoint& shard, int i, int shards);
  // Commits the step's S shards written by SaveShard: `manifest` (its metadata; no tensors) becomes step_<n>.ckpt
  // naming them, as Save does (latest, pruning: a pruned step's shards go with it).
  absl::StatusOr<std::string> SaveManifest(Checkpoint manifest, int shards);

  // The checkpoint `latest` names; nullopt when the folder has no `latest` (nothing to resume). An error when the
  // pointer is malformed or names a missing file.
  absl::StatusOr<std::optional<std::string>> LatestPath() const;
  // LoadCheckpoint(LatestPath()); NotFound when there is nothing to resume from.
  absl::StatusOr<Checkpoint> LoadLatest() const;

  // Steps of the step_<n>.ckpt files present, ascending.
  absl::StatusOr<std::vector<int64_t>> ListSteps() const;

  static std::string FileName(int64_t step);  // "step_<n>.ckpt"
  static std::string ShardFileName(int64_t step, int i, int shards);  // "step_<n>.shard-<i>-of-<S>.ckpt"
  const std::string& dir() const { return dir_; }

 private:
  void RemoveStaleTempFiles() const;
  absl::Status MakeFolder() const;
  // Deletes step files beyond keep_last other than `step`'s, and their shards.
  absl::Status Prune(int64_t step) const;

  std::string dir_;
  int keep_last_;
};

}  // namespace onnxpipe::io
