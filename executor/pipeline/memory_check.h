// Out of memory answered before anything is allocated: a compiled plan's stages are laid out (the layout the
// executor then allocates, memory.h) and the bytes they will allocate are compared with what the backend has free.
// Stages of one process share one device (threads over one GPU, or the host), so their needs add up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/pipeline/memory.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::pipeline {

struct PlanMemoryNeed {
  std::vector<int64_t> stage_bytes;  // what each stage allocates
  int64_t total = 0;
};

// What the stages of `plan` allocate on `be`: arena, gradient accumulators and kernel scratch, plus parameters,
// optimizer state and the other constants where the backend's memory is not the host's (a host backend reads them
// where they already are). `only_stage` >= 0: that stage alone (a rank's process), the others counted as 0.
absl::StatusOr<PlanMemoryNeed> PlanAllocationBytes(const partitioner::CompiledPlan& plan, const backend::Backend& be,
                                                   int32_t only_stage = -1);

// What a run may allocate on `be`: its free memory, capped by `budget` when > 0 (--memory-budget); the budget alone
// when the backend cannot tell; UNIMPLEMENTED when neither is known.
absl::StatusOr<int64_t> AvailableBytes(const backend::Backend& be, int64_t budget);

// RESOURCE_EXHAUSTED when `need` is more than AvailableBytes(be, budget): the message says how much each stage needs
// and how much is free (or what the budget allows). OK when it fits or nothing limits it.
absl::Status CheckFits(const PlanMemoryNeed& need, const backend::Backend& be, int64_t budget = 0);

// "1.50 GiB" (or MiB / KiB / bytes for smaller sizes).
std::string HumanBytes(int64_t bytes);

}  // namespace onnxpipe::pipeline
