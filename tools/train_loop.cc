// SIGINT only sets a flag: saving from the handler would not be async-signal-safe, and stopping between steps is
// what makes the saved state a consistent one.
#include "tools/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "frontend/ir/status.h"

namespace onnxpipe::tools {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;

void OnSigint(int) {
  g_interrupted = 1;
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}

class SigintScope {
 public:
  SigintScope() {
    g_interrupted = 0;
    struct sigaction sa = {};
    sa.sa_handler = OnSigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &previous_);
  }
  ~SigintScope() { sigaction(SIGINT, &previous_, nullptr); }

 private:
  struct sigaction previous_ = {};
};

absl::Status SaveCheckpoint(const train::StepTrainer& trainer, const TrainLoop& loop) {
  ASSIGN_OR_RETURN(std::string path, loop.checkpoints->Save(train::MakeCheckpoint(trainer, *loop.run)));
  std::printf("checkpoint: %s (step %lld)\n", path.c_str(), static_cast<long long>(trainer.step()));
  return absl::OkStatus();
}

}  // namespace

std::string ProgressLine(const train::StepMetrics& m, int64_t steps) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld  loss %.6g  lr %.4g  grad_norm %.4g  %.1f samples/s",
                static_cast<long long>(m.step + 1), static_cast<long long>(steps), m.loss, m.lr, m.grad_norm,
                m.samples_per_s);
  return buf;
}

absl::StatusOr<LoopEnd> RunTrainLoop(train::StepTrainer& trainer, const TrainLoop& loop) {
  SigintScope sigint;
  const bool tty = isatty(fileno(stdout));
  bool line_open = false;  // a \r progress line waits for its newline
  auto end_line = [&] {
    if (line_open) std::printf("\n");
    line_open = false;
  };
  while (trainer.step() < loop.steps) {
    absl::StatusOr<train::StepMetrics> m = trainer.Step();
    if (!m.ok()) {
      end_line();
      return m.status();
    }
    if (loop.metrics) RETURN_IF_ERROR(loop.metrics->Write(*m));
    if (loop.tensorboard) {
      RETURN_IF_ERROR(loop.tensorboard->AddScalars(
          m->step, {{"loss", static_cast<float>(m->loss)},
                    {"lr", static_cast<float>(m->lr)},
                    {"grad_norm", static_cast<float>(m->grad_norm)},
                    {"samples_per_s", static_cast<float>(m->samples_per_s)}}));
    }
    const bool last = trainer.step() == loop.steps;
    if (tty || last || m->step == 0 || trainer.step() % std::max<int64_t>(loop.log_every, 1) == 0) {
      std::printf(tty ? "\r%s\x1b[K" : "%s\n", ProgressLine(*m, loop.steps).c_str());
      line_open = tty;
      std::fflush(stdout);
    }
    if (g_interrupted) {
      end_line();
      std::printf("interrupted (SIGINT) after step %lld/%lld\n", static_cast<long long>(trainer.step()),
                  static_cast<long long>(loop.steps));
      if (loop.checkpoints) RETURN_IF_ERROR(SaveCheckpoint(trainer, loop));
      std::fflush(stdout);
      return LoopEnd::kInterrupted;
    }
    if (loop.checkpoints && (last || (loop.checkpoint_every > 0 && trainer.step() % loop.checkpoint_every == 0))) {
      end_line();
      RETURN_IF_ERROR(SaveCheckpoint(trainer, loop));
    }
  }
  end_line();
  return LoopEnd::kCompleted;
}

}  // namespace onnxpipe::tools
