// SIGINT and SIGTERM only set a flag: saving from the handler would not be async-signal-safe, and stopping between
// steps is what makes the saved state a consistent one. SIGTERM is what Slurm and supervisors send before a
// preemption or a requeue: it ends the run with success (exit 0), so the same command line with --resume auto
// continues it.
#include "tools/train_loop.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "frontend/ir/status.h"

namespace onnxpipe::tools {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;  // the signal received, or 0

void OnStopSignal(int sig) {
  g_interrupted = sig;
  std::signal(sig, SIG_DFL);  // a second Ctrl-C (or SIGTERM) ends the process at once
}

class StopSignalScope {
 public:
  StopSignalScope() {
    g_interrupted = 0;
    struct sigaction sa = {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &previous_int_);
    sigaction(SIGTERM, &sa, &previous_term_);
  }
  ~StopSignalScope() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
  }

 private:
  struct sigaction previous_int_ = {}, previous_term_ = {};
};

absl::Status SaveCheckpoint(const train::StepTrainer& trainer, const TrainLoop& loop) {
  io::Checkpoint checkpoint = train::MakeCheckpoint(trainer, *loop.run);
  std::string path;
  if (const std::optional<TrainLoop::Sharding>& s = loop.sharding) {
    if (s->shard >= 0) RETURN_IF_ERROR(loop.checkpoints->SaveShard(checkpoint, s->shard, s->shards).status());
    RETURN_IF_ERROR(s->barrier());
    if (!loop.writer) return absl::OkStatus();
    ASSIGN_OR_RETURN(path, loop.checkpoints->SaveManifest(std::move(checkpoint), s->shards));
  } else {
    ASSIGN_OR_RETURN(path, loop.checkpoints->Save(checkpoint));
  }
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
  StopSignalScope stop_signals;
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
      RETURN_IF_ERROR(loop.tensorboard->AddScalars(m->step, {{"loss", static_cast<float>(m->loss)},
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
    int stop = g_interrupted;
    if (loop.agree) {
      absl::StatusOr<int> agreed = loop.agree(stop);
      if (!agreed.ok()) {
        end_line();
        return Annotate(agreed.status(), "step " + std::to_string(m->step) + ", after its update");
      }
      stop = *agreed;
    }
    if (stop) {
      end_line();
      const bool term = stop == SIGTERM;
      std::printf("interrupted (%s) after step %lld/%lld\n", term ? "SIGTERM" : "SIGINT",
                  static_cast<long long>(trainer.step()), static_cast<long long>(loop.steps));
      if (loop.checkpoints) RETURN_IF_ERROR(SaveCheckpoint(trainer, loop));
      std::fflush(stdout);
      return term ? LoopEnd::kTerminated : LoopEnd::kInterrupted;
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
