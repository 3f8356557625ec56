// Per-step training metrics and their JSON-lines file: one object per step,
//   {"step": k, "loss": L, "lr": ..., "grad_norm": ..., "samples_per_s": ...}
// where L is the loss of step k's batch before the update and grad_norm the global L2 norm of the
// trainable gradients (before clipping). Doubles are written with round-trip precision.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::train {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double samples_per_s = 0;
  double seconds = 0;  // wall time of the step
};

// One JSON object (no newline).
std::string MetricsJson(const StepMetrics& m);
// The evaluation line: {"split": split, "accuracy": A, "loss": L}.
std::string EvalJson(const std::string& split, double accuracy, double loss);

class MetricsWriter {
 public:
  // Creates (truncates) `path`; its folder must exist.
  static absl::StatusOr<MetricsWriter> Open(const std::string& path);
  // For a run resumed at `step`: keeps the lines of the steps before it (a run killed after its last
  // checkpoint may have logged later steps, which the resumed run logs again; an earlier --eval line is
  // dropped too), rewriting the file atomically, then appends. A missing file is created.
  static absl::StatusOr<MetricsWriter> OpenForResume(const std::string& path, int64_t step);
  // Appends one line and flushes it, so a crashed or interrupted run keeps its completed steps.
  absl::Status Write(const StepMetrics& m);
  absl::Status WriteLine(const std::string& json);

 private:
  struct Closer {
    void operator()(FILE* f) const {
      if (f) std::fclose(f);
    }
  };
  static absl::StatusOr<MetricsWriter> Open(const std::string& path, const char* mode);

  std::string path_;
  std::unique_ptr<FILE, Closer> file_;
};

}  // namespace onnxpipe::train
