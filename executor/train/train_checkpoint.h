// A Trainer's state as an io::Checkpoint (`onnxpipe train --checkpoint-dir/--resume`): the parameters and
// optimizer state as tensors; the step (which also fixes the data position, the shuffle permutation and the
// dropout stream: both are functions of (seed, step)); and what must not change between the saving run and the
// resuming one, so that a resumed run is bit-identical to an uninterrupted one or is refused.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "executor/io/checkpoint.h"
#include "executor/train/trainer.h"

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

io::Checkpoint MakeCheckpoint(const Trainer& trainer, const RunIdentity& run);

// Checks `checkpoint` against the run about to resume and loads it into `trainer`. Refused with an error naming
// the checkpoint file and the mismatch: another model file, optimizer, training dtype, batch, seed, --shuffle,
// --dropout, data size or vocabulary, or tensors that differ from the training graph's state. Differing
// hyper-parameters (lr, momentum, ...) are allowed; each is returned as a warning line.
absl::StatusOr<std::vector<std::string>> RestoreCheckpoint(const io::Checkpoint& checkpoint,
                                                           const RunIdentity& run, Trainer& trainer);

}  // namespace onnxpipe::train
