// `onnxpipe train --resume [auto]`: which checkpoint of --checkpoint-dir a run continues from. `--resume` alone
// requires one (a run meant to continue); `--resume auto` continues from DIR/latest when there is one and starts
// fresh otherwise, so that a requeued job (Slurm, a supervisor) runs the same command line every time.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/io/checkpoint.h"
#include "executor/io/checkpoint_manager.h"

namespace onnxpipe::tools {

enum class ResumeMode { kOff, kLatest, kAuto };

// The --resume flag's value: "" (not given), "latest" (`--resume` alone) or "auto".
absl::StatusOr<ResumeMode> ParseResumeMode(const std::string& value);

// The checkpoint to continue from, or nullopt to start at step 0. kLatest: an error naming the folder when it holds
// no checkpoint yet; kAuto: prints that the run starts fresh when it holds none. A checkpoint that exists but cannot
// be read is an error in either mode (starting over would silently discard the run's progress).
absl::StatusOr<std::optional<io::Checkpoint>> FindResumeCheckpoint(const io::CheckpointManager& checkpoints,
                                                                   ResumeMode mode);

}  // namespace onnxpipe::tools
