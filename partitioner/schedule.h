// Phase 6 of the partitioner: simulate one training step of a pipeline schedule.
//
// Each stage runs a fixed list of actions in order (torch.distributed.pipelining style):
// - GPipe: F0 .. F(M-1), then B0 .. B(M-1), then the optimizer step O.
// - 1F1B: min(M, K-1-s) warm-up forwards, then one forward and one backward alternately, then the
//   remaining backwards, then O (Megatron's non-interleaved schedule).
// F(s, m) starts when stage s is free and micro-batch m's activations have arrived from stage s-1;
// B(s, m) when stage s is free and the gradient has arrived from stage s+1 (the last stage's B
// follows its own F). A transfer starts when its producer ends and the link (one per direction
// between neighbouring stages) is free, and takes send_*_s; transfers do not occupy the stages'
// compute. The step ends when the last stage finishes its optimizer step. The bubble fraction is
// the idle share of K x step time.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace onnxpipe::partitioner {

enum class ScheduleKind { kGPipe, k1F1B };
const char* ScheduleName(ScheduleKind k);
absl::StatusOr<ScheduleKind> ParseSchedule(std::string_view s);  // "gpipe" | "1f1b"

// Micro-batches whose activations stage `stage` (0-based) of `num_stages` holds at once:
// GPipe M, 1F1B min(M, K - stage).
int64_t InFlightMicrobatches(ScheduleKind kind, int64_t num_stages, int64_t stage, int64_t microbatches);

struct StageTiming {
  double forward_s = 0;        // per micro-batch
  double backward_s = 0;       // per micro-batch, recompute included
  double optimizer_s = 0;      // per step
  double send_forward_s = 0;   // this stage's outputs to stage + 1, per micro-batch
  double send_backward_s = 0;  // this stage's input gradients to stage - 1, per micro-batch
};

struct ScheduleEvent {
  enum Kind : char { kForward = 'F', kBackward = 'B', kOptimizer = 'O', kSendForward = 'f', kSendBackward = 'b' };
  int32_t stage = 0;
  int32_t microbatch = -1;  // -1 for the optimizer step
  Kind kind = kForward;
  double start_s = 0, end_s = 0;
};

struct ScheduleResult {
  double step_s = 0;
  double bubble_fraction = 0;
  std::vector<double> busy_s;          // per stage: compute time in the step
  std::vector<ScheduleEvent> events;   // compute and transfer events, by stage then start time
};

ScheduleResult SimulateSchedule(ScheduleKind kind, const std::vector<StageTiming>& stages,
                                int64_t microbatches);

}  // namespace onnxpipe::partitioner
