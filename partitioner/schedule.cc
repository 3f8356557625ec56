// Schedules, their checks and the one simulator. The simulator is both the partitioner's timing
// model and the executor's proof of deadlock freedom: it runs the very lists the stage threads run,
// with blocking receives and sends that never wait (the in-process comm buffers them; the
// executor sends as soon as a value is made, never later than the SEND action says).
#include "partitioner/schedule.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

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

// By ActionKind.
constexpr const char* kActionKindNames[] = {"F", "B", "R", "RECV_ACT", "SEND_ACT", "RECV_GRAD", "SEND_GRAD", "O"};

bool IsCompute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kRecompute;
}
bool IsRecv(ActionKind k) { return k == ActionKind::kRecvActivation || k == ActionKind::kRecvGradient; }
bool IsSend(ActionKind k) { return k == ActionKind::kSendActivation || k == ActionKind::kSendGradient; }

}  // namespace

const char* ActionKindName(ActionKind k) { return kActionKindNames[static_cast<int>(k)]; }

std::string ActionToString(const Action& a) {
  std::string s = ActionKindName(a.kind);
  if (a.kind == ActionKind::kOptimizerStep) return s;
  s += std::to_string(a.microbatch);
  if (IsCompute(a.kind)) {
    if (a.part > 0) s += "." + std::to_string(a.part);
  } else {
    s += (IsRecv(a.kind) ? "<" : ">") + std::to_string(a.peer);
  }
  return s;
}

absl::StatusOr<Action> ParseAction(std::string_view s) {
  auto bad = [&]() -> absl::Status {
    return INVALID_ARGUMENT() << "'" << s << "' is not an action (F3, B3, R3.1, RECV_ACT3<0, O, ...)";
  };
  Action a;
  if (s == "O") {
    a.kind = ActionKind::kOptimizerStep;
    return a;
  }
  // The longest name that prefixes s ("RECV_ACT" before "R"; "O" takes no micro-batch and fails below).
  size_t at = std::string_view::npos;
  for (int k = 0; k < static_cast<int>(std::size(kActionKindNames)); ++k) {
    const std::string_view name = kActionKindNames[k];
    if (s.substr(0, name.size()) == name && (at == std::string_view::npos || name.size() > at)) {
      a.kind = static_cast<ActionKind>(k);
      at = name.size();
    }
  }
  if (at == std::string_view::npos) return bad();
  // A non-negative decimal integer at `at`; advances it.
  auto number = [&](int32_t* out) {
    size_t end = at;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9' && end - at < 9) ++end;
    if (end == at) return false;
    *out = std::stoi(std::string(s.substr(at, end - at)));
    at = end;
    return true;
  };
  if (!number(&a.microbatch)) return bad();
  if (IsCompute(a.kind)) {
    if (at < s.size() && s[at] == '.') {
      ++at;
      if (!number(&a.part)) return bad();
    }
  } else {
    if (at >= s.size() || s[at] != (IsRecv(a.kind) ? '<' : '>')) return bad();
    ++at;
    if (!number(&a.peer)) return bad();
  }
  if (at != s.size()) return bad();
  return a;
}

StageShape ChainShape(int32_t num_stages, int32_t stage) {
  StageShape sh;
  if (stage > 0) sh.recv_forward = sh.send_backward = {stage - 1};
  if (stage < num_stages - 1) sh.send_forward = sh.recv_backward = {stage + 1};
  return sh;
}

absl::StatusOr<std::vector<ActionList>> BuildSchedule(ScheduleKind kind, int32_t num_stages, int32_t microbatches,
                                                      const std::vector<StageShape>& shapes) {
  if (num_stages < 1) return INVALID_ARGUMENT() << "a pipeline needs at least 1 stage, got " << num_stages;
  if (microbatches < 1) return INVALID_ARGUMENT() << "a step needs at least 1 micro-batch, got " << microbatches;
  if (!shapes.empty() && static_cast<int32_t>(shapes.size()) != num_stages) {
    return INVALID_ARGUMENT() << shapes.size() << " stage shapes for " << num_stages << " stages";
  }
  const int32_t K = num_stages, M = microbatches;
  std::vector<ActionList> lists(K);
  for (int32_t s = 0; s < K; ++s) {
    const StageShape sh = shapes.empty() ? ChainShape(K, s) : shapes[s];
    if (sh.backward.empty()) return INVALID_ARGUMENT() << "stage " << s << " has no backward part";
    ActionList& l = lists[s];
    auto forward = [&](int32_t m) {
      for (int32_t p : sh.recv_forward) l.push_back({ActionKind::kRecvActivation, m, p});
      l.push_back({ActionKind::kForward, m, -1});
      for (int32_t p : sh.send_forward) l.push_back({ActionKind::kSendActivation, m, p});
    };
    auto backward = [&](int32_t m) {
      for (int32_t p : sh.recv_backward) l.push_back({ActionKind::kRecvGradient, m, p});
      for (size_t i = 0; i < sh.backward.size(); ++i) l.push_back({sh.backward[i], m, -1, static_cast<int32_t>(i)});
      for (int32_t p : sh.send_backward) l.push_back({ActionKind::kSendGradient, m, p});
    };
    if (kind == ScheduleKind::kGPipe) {
      for (int32_t m = 0; m < M; ++m) forward(m);
      for (int32_t m = 0; m < M; ++m) backward(m);
    } else {
      const int32_t warmup = std::min(M, K - s - 1);
      int32_t next_f = 0, next_b = 0;
      while (next_f < warmup) forward(next_f++);
      while (next_f < M) {  // steady state: one forward, one backward
        forward(next_f++);
        backward(next_b++);
      }
      while (next_b < M) backward(next_b++);  // cool-down
    }
    l.push_back({ActionKind::kOptimizerStep, -1, -1});
  }
  return lists;
}

absl::StatusOr<SimTimes> SimulateSteps(const std::vector<std::vector<SimStep>>& stages) {
  const int32_t K = static_cast<int32_t>(stages.size());
  SimTimes r;
  r.steps.resize(K);
  r.transfers.resize(K);
  std::set<int64_t> sent_somewhere;
  for (const std::vector<SimStep>& st : stages)
    for (const SimStep& x : st)
      for (const SimSend& m : x.sends) sent_somewhere.insert(m.message);
  for (int32_t s = 0; s < K; ++s) {
    for (const SimStep& x : stages[s]) {
      for (int64_t m : x.waits) {
        if (!sent_somewhere.count(m)) {
          return INVALID_ARGUMENT() << "stage " << s << " step '" << x.label << "' waits for message " << m
                                    << ", which no step sends";
        }
      }
    }
  }
  std::vector<size_t> pos(K, 0);
  std::vector<double> clock(K, 0.0);
  std::map<int64_t, double> arrival, link_free;
  for (;;) {
    bool progress = false, done = true;
    for (int32_t s = 0; s < K; ++s) {
      while (pos[s] < stages[s].size()) {
        const SimStep& x = stages[s][pos[s]];
        double ready = clock[s];
        bool blocked = false;
        for (int64_t m : x.waits) {
          auto it = arrival.find(m);
          if (it == arrival.end()) {
            blocked = true;
            break;
          }
          ready = std::max(ready, it->second);
        }
        if (blocked) break;
        const double end = ready + x.duration;
        std::vector<std::pair<double, double>> transfers;
        for (const SimSend& m : x.sends) {
          double start = end;
          if (m.link >= 0) start = std::max(start, link_free[m.link]);
          const double stop = start + m.transfer_s;
          if (m.link >= 0) link_free[m.link] = stop;
          if (!arrival.emplace(m.message, stop).second) {
            return INVALID_ARGUMENT() << "stage " << s << " step '" << x.label << "' sends message " << m.message
                                      << " a second time";
          }
          transfers.push_back({start, stop});
        }
        r.steps[s].push_back({ready, end});
        r.transfers[s].push_back(std::move(transfers));
        clock[s] = end;
        ++pos[s];
        progress = true;
      }
      done = done && pos[s] == stages[s].size();
    }
    if (done) break;
    if (!progress) {
      std::ostringstream os;
      os << "the schedule deadlocks:";
      for (int32_t s = 0; s < K; ++s) {
        if (pos[s] == stages[s].size()) {
          os << " stage " << s << " done;";
          continue;
        }
        const SimStep& x = stages[s][pos[s]];
        os << " stage " << s << " waits in '" << x.label << "' for message(s)";
        for (int64_t m : x.waits)
          if (!arrival.count(m)) os << " " << m;
        os << ";";
      }
      return FAILED_PRECONDITION() << os.str();
    }
  }
  for (int32_t s = 0; s < K; ++s) r.makespan = std::max(r.makespan, clock[s]);
  return r;
}

absl::StatusOr<ScheduleResult> Simulate(const std::vector<ActionList>& lists, const std::vector<StageTiming>& timing,
                                        const std::vector<std::vector<double>>& parts_s) {
  const int32_t K = static_cast<int32_t>(lists.size());
  RET_CHECK(static_cast<int32_t>(timing.size()) == K) << "one timing per stage";
  RET_CHECK(parts_s.empty() || static_cast<int32_t>(parts_s.size()) == K) << "part times for every stage or none";
  // A message per (micro-batch, from, to, sender's phase); a receive waits for every message its
  // peer sends it for the micro-batch. Links: one per (from, to) pair.
  auto message = [](int32_t m, int32_t from, int32_t to, bool backward) -> int64_t {
    return ((static_cast<int64_t>(m) * 4096 + from) * 4096 + to) * 2 + (backward ? 1 : 0);
  };
  std::set<int64_t> sent;
  for (int32_t s = 0; s < K; ++s)
    for (const Action& a : lists[s])
      if (IsSend(a.kind)) sent.insert(message(a.microbatch, s, a.peer, a.kind == ActionKind::kSendGradient));
  std::vector<std::vector<SimStep>> steps(K);
  for (int32_t s = 0; s < K; ++s) {
    const StageTiming& t = timing[s];
    for (const Action& a : lists[s]) {
      SimStep x;
      x.label = ActionToString(a);
      switch (a.kind) {
        case ActionKind::kForward:
          x.duration = t.forward_s;
          break;
        case ActionKind::kBackward:
        case ActionKind::kRecompute:
          if (parts_s.empty()) {
            x.duration = a.part == 0 ? t.backward_s : 0;
          } else {
            RET_CHECK(a.part >= 0 && a.part < static_cast<int32_t>(parts_s[s].size()))
                << "stage " << s << ": no time for backward part " << a.part;
            x.duration = parts_s[s][a.part];
          }
          break;
        case ActionKind::kOptimizerStep:
          x.duration = t.optimizer_s;
          break;
        case ActionKind::kRecvActivation:
        case ActionKind::kRecvGradient:
          for (bool backward : {false, true}) {
            const int64_t id = message(a.microbatch, a.peer, s, backward);
            if (sent.count(id)) x.waits.push_back(id);
          }
          if (x.waits.empty()) x.waits.push_back(message(a.microbatch, a.peer, s, false));  // never sent: fails
          break;
        case ActionKind::kSendActivation:
        case ActionKind::kSendGradient: {
          const bool backward = a.kind == ActionKind::kSendGradient;
          x.sends.push_back({message(a.microbatch, s, a.peer, backward), static_cast<int64_t>(s) * 4096 + a.peer,
                             backward ? t.send_backward_s : t.send_forward_s});
          break;
        }
      }
      steps[s].push_back(std::move(x));
    }
  }
  ASSIGN_OR_RETURN(SimTimes times, SimulateSteps(steps));
  ScheduleResult r;
  r.busy_s.assign(K, 0);
  for (int32_t s = 0; s < K; ++s) {
    for (size_t i = 0; i < lists[s].size(); ++i) {
      const Action& a = lists[s][i];
      const auto [start, end] = times.steps[s][i];
      ScheduleEvent e;
      e.stage = s;
      e.microbatch = a.microbatch;
      e.start_s = start;
      e.end_s = end;
      switch (a.kind) {
        case ActionKind::kForward:
          e.kind = ScheduleEvent::kForward;
          break;
        case ActionKind::kBackward:
          e.kind = ScheduleEvent::kBackward;
          break;
        case ActionKind::kRecompute:
          e.kind = ScheduleEvent::kRecompute;
          break;
        case ActionKind::kOptimizerStep:
          e.kind = ScheduleEvent::kOptimizer;
          break;
        case ActionKind::kSendActivation:
        case ActionKind::kSendGradient: {
          const auto [ts, te] = times.transfers[s][i][0];
          if (te > ts) {
            r.events.push_back(
                {s, a.microbatch, a.peer,
                 a.kind == ActionKind::kSendActivation ? ScheduleEvent::kSendForward : ScheduleEvent::kSendBackward, ts,
                 te});
          }
          continue;
        }
        default:
          continue;
      }
      r.busy_s[s] += end - start;
      // Parts that take no time (the unused parts of a backward timed as one) and an optimizer
      // step that takes none are left out.
      const bool empty_part =
          (a.kind == ActionKind::kBackward || a.kind == ActionKind::kRecompute) && a.part > 0 && end == start;
      if (empty_part || (a.kind == ActionKind::kOptimizerStep && end == start)) continue;
      r.events.push_back(e);
    }
  }
  r.step_s = times.makespan;
  double busy = 0;
  for (double b : r.busy_s) busy += b;
  r.bubble_fraction = r.step_s > 0 ? std::max(0.0, 1.0 - busy / (K * r.step_s)) : 0;
  std::stable_sort(r.events.begin(), r.events.end(), [](const ScheduleEvent& x, const ScheduleEvent& y) {
    if (x.stage != y.stage) return x.stage < y.stage;
    return x.start_s < y.start_s;
  });
  return r;
}

ScheduleResult SimulateSchedule(ScheduleKind kind, const std::vector<StageTiming>& stages, int64_t microbatches) {
  const int32_t K = static_cast<int32_t>(stages.size());
  if (K == 0) return ScheduleResult();
  const int32_t M = static_cast<int32_t>(std::max<int64_t>(1, microbatches));
  absl::StatusOr<std::vector<ActionList>> lists = BuildSchedule(kind, K, M);
  // The chain lists of both schedules are deadlock-free (schedule_test.cc), so neither can fail.
  absl::StatusOr<ScheduleResult> r = lists.ok() ? Simulate(*lists, stages) : lists.status();
  return r.ok() ? *std::move(r) : ScheduleResult();
}

}  // namespace onnxpipe::partitioner
