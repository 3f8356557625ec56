// A trainer's state (train::StepTrainer: the unpartitioned or the pipelined one, interchangeably) as an
// io::Checkpoint (`onnxpipe train --checkpoint-dir/--resume`): the parameters and optimizer state as tensors; the
// step (which also fixes the data position, the shuffle permutation, the learning rate and the dropout stream: all
// are functions of (seed, step)); and what must not change between the saving run and the resuming one, so that a
// resumed run is bit-identical to an uninterrupted one or is refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "executor/io/checkpoint.h"
#include "executor/train/step_trainer.h"
#include "executor/train/training_graph.h"

namespace onnxpipe::train {

// What identifies a run for resuming.
struct RunIdentity {
  io::ModelFingerprint model;
  std::string model_path;
  TrainOptions options;
  int64_t data_rows = 0;
  std::string vocab_file;      // file name (in the checkpoint folder) of the text vocabulary; empty for npy data
  uint32_t vocab_crc32c = 0;
};

io::Checkpoint MakeCheckpoint(const StepTrainer& trainer, const RunIdentity& run);

// Checks `checkpoint` against the run about to resume and loads it into `trainer`. Refused with an error naming
// the checkpoint file and the mismatch: another model file, optimizer, training dtype, batch, seed, --shuffle,
// --dropout, data size or vocabulary, or tensors that differ from the training graph's state. Differing
// hyper-parameters (lr, momentum, ...) are allowed; each is returned as a warning line.
absl::StatusOr<std::vector<std::string>> RestoreCheckpoint(const io::Checkpoint& checkpoint,
                                                           const RunIdentity& run, StepTrainer& trainer);

}  // namespace onnxpipe::train
