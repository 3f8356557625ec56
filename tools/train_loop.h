// The step loop of `onnxpipe train` for either trainer (train::StepTrainer: unpartitioned or pipelined): progress
// (a rewritten line on a terminal, plain lines otherwise), --metrics JSON lines, --tensorboard scalars, rolling
// checkpoints every N steps and at the end, and SIGINT / SIGTERM: the step in flight finishes, a checkpoint is saved
// (with --checkpoint-dir) and the loop returns kInterrupted / kTerminated. A second signal kills the process at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/io/checkpoint_manager.h"
#include "executor/io/tensorboard.h"
#include "executor/train/metrics.h"
#include "executor/train/step_trainer.h"
#include "executor/train/train_checkpoint.h"

namespace onnxpipe::tools {

struct TrainLoop {
  int64_t steps = 0;  // run until trainer.step() == steps
  train::MetricsWriter* metrics = nullptr;
  io::TensorBoardWriter* tensorboard = nullptr;
  io::CheckpointManager* checkpoints = nullptr;
  int64_t checkpoint_every = 0;  // 0: only at the end (and on SIGINT)
  int64_t log_every = 1;         // without a terminal: a progress line every N steps (and the first and last)
  const train::RunIdentity* run = nullptr;
  // Multi-process: every rank runs the loop. `agree` turns this rank's stop signal (0, SIGINT or SIGTERM) into the
  // world's after every step (so that all ranks stop after the same one); only the `writer` (rank 0) prints and
  // writes metrics. A checkpoint is sharded: each rank writes shard `shard` of `shards` (its stage's tensors; -1:
  // none, its stage's copy is another replica's), `barrier` returns once every shard is on disk, and the writer then
  // commits the step (CheckpointManager::SaveManifest): a rank that dies before leaves the previous checkpoint.
  std::function<absl::StatusOr<int>(int)> agree;
  bool writer = true;
  struct Sharding {
    int shard = -1, shards = 0;
    std::function<absl::Status()> barrier;
  };
  std::optional<Sharding> sharding;
};

enum class LoopEnd { kCompleted, kInterrupted, kTerminated };

absl::StatusOr<LoopEnd> RunTrainLoop(train::StepTrainer& trainer, const TrainLoop& loop);

// "step k/N  loss ...  lr ...  grad_norm ...  X samples/s"
std::string ProgressLine(const train::StepMetrics& m, int64_t steps);

}  // namespace onnxpipe::tools
