// Learning-rate schedules, computed on the host once per step and fed to the optimizer graph's
// kLrName input (optimizer.h).
//
// For 0-based step k of N (--steps), base rate lr and W warm-up steps:
//   k <  W: lr * (k + 1) / W                       (linear warm-up; the W-th step runs at lr)
//   k >= W: p = (k - W) / (N - W)  in [0, 1)
//     constant: lr
//     cosine:   lr * (1 + cos(pi * p)) / 2
//     linear:   lr * (1 - p)
// so the decaying schedules would reach 0 at step N, the first step not taken.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace onnxpipe::autodiff {

enum class LrScheduleKind { kConstant, kCosine, kLinear };

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double base_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  // The learning rate of 0-based step k.
  double At(int64_t k) const;
};

// "constant" | "cosine" | "linear".
absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name);

// Checks lr > 0 and finite, total_steps >= 1, 0 <= warmup_steps <= total_steps.
absl::StatusOr<LrSchedule> MakeLrSchedule(LrScheduleKind kind, double base_lr,
                                          int64_t warmup_steps, int64_t total_steps);

}  // namespace onnxpipe::autodiff
