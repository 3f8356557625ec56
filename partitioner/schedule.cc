// Phase 6: discrete-event simulation of one step. Stages advance through their action lists in
// rounds; an action runs as soon as its cross-stage dependency has been simulated, which always
// happens for the GPipe and 1F1B orders (they are deadlock-free), so the loop terminates after at
// most K * 2M rounds.
#include "partitioner/schedule.h"

#include <algorithm>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {

const char* ScheduleName(ScheduleKind k) { return k == ScheduleKind::kGPipe ? "gpipe" : "1f1b"; }

absl::StatusOr<ScheduleKind> ParseSchedule(std::string_view s) {
  if (s == "gpipe") return ScheduleKind::kGPipe;
  if (s == "1f1b") return ScheduleKind::k1F1B;
  return INVALID_ARGUMENT() << "unknown schedule '" << s << "'; expected gpipe or 1f1b";
}

int64_t InFlightMicrobatches(ScheduleKind kind, int64_t num_stages, int64_t stage, int64_t microbatches) {
  if (kind == ScheduleKind::kGPipe) return microbatches;
  return std::max<int64_t>(1, std::min(microbatches, num_stages - stage));
}

namespace {

struct Action {
  bool forward;
  int32_t m;
};

std::vector<Action> Actions(ScheduleKind kind, int32_t K, int32_t s, int32_t M) {
  std::vector<Action> a;
  if (kind == ScheduleKind::kGPipe) {
    for (int32_t m = 0; m < M; ++m) a.push_back({true, m});
    for (int32_t m = 0; m < M; ++m) a.push_back({false, m});
    return a;
  }
  const int32_t warmup = std::min(M, K - 1 - s);
  int32_t f = 0, b = 0;
  for (; f < warmup; ++f) a.push_back({true, f});
  while (f < M) {
    a.push_back({true, f++});
    a.push_back({false, b++});
  }
  while (b < M) a.push_back({false, b++});
  return a;
}

}  // namespace

ScheduleResult SimulateSchedule(ScheduleKind kind, const std::vector<StageTiming>& stages,
                                int64_t microbatches) {
  ScheduleResult r;
  const int32_t K = static_cast<int32_t>(stages.size());
  const int32_t M = static_cast<int32_t>(std::max<int64_t>(1, microbatches));
  if (K == 0) return r;
  constexpr double kPending = -1;
  // Arrival times of micro-batch m's input at stage s (forward) and of its gradient (backward).
  std::vector<std::vector<double>> fwd_ready(K, std::vector<double>(M, kPending));
  std::vector<std::vector<double>> bwd_ready(K, std::vector<double>(M, kPending));
  std::vector<std::vector<double>> fwd_done(K, std::vector<double>(M, kPending));
  for (int32_t m = 0; m < M; ++m) fwd_ready[0][m] = 0;
  std::vector<double> link_fwd_free(K, 0), link_bwd_free(K, 0), stage_free(K, 0);
  std::vector<std::vector<Action>> lists(K);
  std::vector<size_t> next(K, 0);
  for (int32_t s = 0; s < K; ++s) lists[s] = Actions(kind, K, s, M);
  r.busy_s.assign(K, 0);

  bool progress = true;
  while (progress) {
    progress = false;
    for (int32_t s = 0; s < K; ++s) {
      while (next[s] < lists[s].size()) {
        const Action act = lists[s][next[s]];
        const double ready = act.forward ? fwd_ready[s][act.m]
                                         : (s == K - 1 ? fwd_done[s][act.m] : bwd_ready[s][act.m]);
        if (ready == kPending) break;
        const StageTiming& t = stages[s];
        const double start = std::max(stage_free[s], ready);
        const double end = start + (act.forward ? t.forward_s : t.backward_s);
        stage_free[s] = end;
        r.busy_s[s] += end - start;
        r.events.push_back({s, act.m, act.forward ? ScheduleEvent::kForward : ScheduleEvent::kBackward,
                            start, end});
        if (act.forward) {
          fwd_done[s][act.m] = end;
          if (s + 1 < K) {
            const double ts = std::max(end, link_fwd_free[s]);
            const double te = ts + t.send_forward_s;
            link_fwd_free[s] = te;
            fwd_ready[s + 1][act.m] = te;
            if (t.send_forward_s > 0) r.events.push_back({s, act.m, ScheduleEvent::kSendForward, ts, te});
          }
        } else if (s > 0) {
          const double ts = std::max(end, link_bwd_free[s]);
          const double te = ts + t.send_backward_s;
          link_bwd_free[s] = te;
          bwd_ready[s - 1][act.m] = te;
          if (t.send_backward_s > 0) r.events.push_back({s, act.m, ScheduleEvent::kSendBackward, ts, te});
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int32_t s = 0; s < K; ++s) {
    const double start = stage_free[s];
    const double end = start + stages[s].optimizer_s;
    r.busy_s[s] += end - start;
    if (stages[s].optimizer_s > 0) r.events.push_back({s, -1, ScheduleEvent::kOptimizer, start, end});
    r.step_s = std::max(r.step_s, end);
  }
  double busy = 0;
  for (double b : r.busy_s) busy += b;
  r.bubble_fraction = r.step_s > 0 ? std::max(0.0, 1.0 - busy / (K * r.step_s)) : 0;
  std::stable_sort(r.events.begin(), r.events.end(), [](const ScheduleEvent& x, const ScheduleEvent& y) {
    if (x.stage != y.stage) return x.stage < y.stage;
    return x.start_s < y.start_s;
  });
  return r;
}

}  // namespace onnxpipe::partitioner
