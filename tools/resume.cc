#include "tools/resume.h"

#include <cstdio>

#include "frontend/ir/status.h"

namespace onnxpipe::tools {

absl::StatusOr<ResumeMode> ParseResumeMode(const std::string& value) {
  if (value.empty()) return ResumeMode::kOff;
  if (value == "latest") return ResumeMode::kLatest;
  if (value == "auto") return ResumeMode::kAuto;
  return INVALID_ARGUMENT() << "--resume expects no value (continue from --checkpoint-dir's latest checkpoint) or "
                               "'auto' (continue when there is one, else start fresh), got '"
                            << value << "'";
}

absl::StatusOr<std::optional<io::Checkpoint>> FindResumeCheckpoint(const io::CheckpointManager& checkpoints,
                                                                   ResumeMode mode) {
  if (mode == ResumeMode::kOff) return std::nullopt;
  // Only a missing `latest` means "nothing yet": a pointer naming a missing file is an error (LatestPath's).
  ASSIGN_OR_RETURN(std::optional<std::string> path, checkpoints.LatestPath());
  if (!path) {
    if (mode == ResumeMode::kAuto) {
      std::printf("resume auto: no checkpoint in %s yet, starting from step 0\n", checkpoints.dir().c_str());
      return std::nullopt;
    }
    return NOT_FOUND() << "--resume: --checkpoint-dir " << checkpoints.dir()
                       << " holds no checkpoint yet (no 'latest' file); --resume auto starts fresh in that case";
  }
  ASSIGN_OR_RETURN(io::Checkpoint c, io::LoadCheckpoint(*path));
  return std::optional<io::Checkpoint>(std::move(c));
}

}  // namespace onnxpipe::tools
