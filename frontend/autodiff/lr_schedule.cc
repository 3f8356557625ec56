#include "frontend/autodiff/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "frontend/ir/status.h"

namespace onnxpipe::autodiff {

double LrSchedule::At(int64_t k) const {
  if (k < 0) k = 0;
  if (k < warmup_steps) {
    return base_lr * static_cast<double>(k + 1) / static_cast<double>(warmup_steps);
  }
  if (kind == LrScheduleKind::kConstant) return base_lr;
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return base_lr;
  // Steps past the end (a caller running longer than planned) stay at 0 rather than rising again
  // along the cosine.
  const double p = std::min(1.0, static_cast<double>(k - warmup_steps) / decay_steps);
  if (kind == LrScheduleKind::kCosine) return base_lr * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  return base_lr * (1.0 - p);
}

absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "cosine") return LrScheduleKind::kCosine;
  if (name == "linear") return LrScheduleKind::kLinear;
  return INVALID_ARGUMENT() << "unknown learning-rate schedule '" << name
                            << "'; expected constant, cosine or linear";
}

absl::StatusOr<LrSchedule> MakeLrSchedule(LrScheduleKind kind, double base_lr,
                                          int64_t warmup_steps, int64_t total_steps) {
  if (!(base_lr > 0) || !std::isfinite(base_lr)) {
    return INVALID_ARGUMENT() << "learning rate must be positive and finite, got " << base_lr;
  }
  if (total_steps < 1) return INVALID_ARGUMENT() << "steps must be >= 1, got " << total_steps;
  if (warmup_steps < 0 || warmup_steps > total_steps) {
    return INVALID_ARGUMENT() << "warm-up steps must lie in [0, steps=" << total_steps << "], got "
                              << warmup_steps;
  }
  LrSchedule s;
  s.kind = kind;
  s.base_lr = base_lr;
  s.warmup_steps = warmup_steps;
  s.total_steps = total_steps;
  return s;
}

}  // namespace onnxpipe::autodiff
