// Schedules, their checks and the deadlock simulator. The simulator is the proof the executor
// relies on: it runs the very lists (and, for a real program, the very transfers) the stage
// threads will run, with blocking receives and buffered sends, so a list set that simulates to the
// end cannot hang on the in-process comm.
#include "executor/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

const char* ScheduleKindName(ScheduleKind k) { return k == ScheduleKind::kGPipe ? "gpipe" : "1f1b"; }

absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view s) {
  if (s == "gpipe") return ScheduleKind::kGPipe;
  if (s == "1f1b") return ScheduleKind::k1F1B;
  return INVALID_ARGUMENT() << "unknown schedule '" << s << "'; expected gpipe or 1f1b";
}

const char* ActionKindName(ActionKind k) {
  switch (k) {
    case ActionKind::kForward: return "F";
    case ActionKind::kBackward: return "B";
    case ActionKind::kRecvActivation: return "RECV_ACT";
    case ActionKind::kSendActivation: return "SEND_ACT";
    case ActionKind::kRecvGradient: return "RECV_GRAD";
    case ActionKind::kSendGradient: return "SEND_GRAD";
    case ActionKind::kOptimizerStep: return "OPTIMIZER_STEP";
  }
  return "?";
}

namespace {

std::string Describe(int stage, size_t index, const Action& a) {
  std::ostringstream os;
  os << "stage " << stage << " action " << index << " (" << ActionKindName(a.kind);
  if (a.microbatch >= 0) os << " micro-batch " << a.microbatch;
  if (a.peer >= 0) os << " peer " << a.peer;
  os << ")";
  return os.str();
}

}  // namespace

absl::StatusOr<std::vector<ActionList>> BuildSchedule(ScheduleKind kind, int num_stages, int microbatches) {
  if (num_stages < 1) return INVALID_ARGUMENT() << "a pipeline needs at least 1 stage, got " << num_stages;
  if (microbatches < 1) return INVALID_ARGUMENT() << "a step needs at least 1 micro-batch, got " << microbatches;
  const int K = num_stages, M = microbatches;
  std::vector<ActionList> lists(K);
  for (int s = 0; s < K; ++s) {
    ActionList& l = lists[s];
    auto forward = [&](int m) {
      if (s > 0) l.push_back({ActionKind::kRecvActivation, m, s - 1});
      l.push_back({ActionKind::kForward, m, -1});
      if (s < K - 1) l.push_back({ActionKind::kSendActivation, m, s + 1});
    };
    auto backward = [&](int m) {
      if (s < K - 1) l.push_back({ActionKind::kRecvGradient, m, s + 1});
      l.push_back({ActionKind::kBackward, m, -1});
      if (s > 0) l.push_back({ActionKind::kSendGradient, m, s - 1});
    };
    if (kind == ScheduleKind::kGPipe) {
      for (int m = 0; m < M; ++m) forward(m);
      for (int m = 0; m < M; ++m) backward(m);
    } else {
      const int warmup = std::min(M, K - s - 1);
      int next_f = 0, next_b = 0;
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

int InFlightBound(ScheduleKind kind, int num_stages, int stage, int microbatches) {
  if (kind == ScheduleKind::kGPipe) return microbatches;
  return std::min(microbatches, num_stages - stage);
}

int MaxInFlight(const ActionList& list) {
  int now = 0, peak = 0;
  for (const Action& a : list) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++now);
    if (a.kind == ActionKind::kBackward) --now;
  }
  return peak;
}

absl::Status ValidateSchedule(const std::vector<ActionList>& lists, ScheduleKind kind, int microbatches) {
  const int K = static_cast<int>(lists.size()), M = microbatches;
  RET_CHECK(K >= 1 && M >= 1);
  // (kind, micro-batch, src, dst) of every send; receives must match them one to one.
  std::multiset<std::tuple<int, int, int, int>> sends, recvs;
  for (int s = 0; s < K; ++s) {
    const ActionList& l = lists[s];
    std::vector<int> forward_at(M, -1), backward_at(M, -1);
    int optimizer_at = -1;
    for (size_t i = 0; i < l.size(); ++i) {
      const Action& a = l[i];
      const bool has_m = a.kind != ActionKind::kOptimizerStep;
      if (has_m && (a.microbatch < 0 || a.microbatch >= M)) {
        return INVALID_ARGUMENT() << Describe(s, i, a) << ": micro-batch out of range [0, " << M << ")";
      }
      switch (a.kind) {
        case ActionKind::kForward:
          if (forward_at[a.microbatch] >= 0) return INVALID_ARGUMENT() << Describe(s, i, a) << ": forwarded twice";
          forward_at[a.microbatch] = static_cast<int>(i);
          break;
        case ActionKind::kBackward:
          if (forward_at[a.microbatch] < 0) {
            return INVALID_ARGUMENT() << Describe(s, i, a) << ": backward before the micro-batch's forward";
          }
          if (backward_at[a.microbatch] >= 0) return INVALID_ARGUMENT() << Describe(s, i, a) << ": backwarded twice";
          backward_at[a.microbatch] = static_cast<int>(i);
          break;
        case ActionKind::kOptimizerStep:
          if (optimizer_at >= 0) return INVALID_ARGUMENT() << Describe(s, i, a) << ": a second optimizer step";
          optimizer_at = static_cast<int>(i);
          break;
        default: {
          const bool activation =
              a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kSendActivation;
          const bool is_send = a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient;
          const int want_peer = (activation == is_send) ? s + 1 : s - 1;
          if (a.peer != want_peer) {
            return INVALID_ARGUMENT() << Describe(s, i, a) << ": expected peer " << want_peer;
          }
          const ActionKind compute = activation ? ActionKind::kForward : ActionKind::kBackward;
          const size_t j = is_send ? i - 1 : i + 1;
          if ((is_send && i == 0) || j >= l.size() || l[j].kind != compute || l[j].microbatch != a.microbatch) {
            return INVALID_ARGUMENT() << Describe(s, i, a) << ": not next to " << ActionKindName(compute) << " "
                                      << a.microbatch;
          }
          const int src = is_send ? s : a.peer, dst = is_send ? a.peer : s;
          (is_send ? sends : recvs).insert({activation ? 0 : 1, a.microbatch, src, dst});
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      if (forward_at[m] < 0 || backward_at[m] < 0) {
        return INVALID_ARGUMENT() << "stage " << s << " never " << (forward_at[m] < 0 ? "forwards" : "backwards")
                                  << " micro-batch " << m;
      }
    }
    if (optimizer_at != static_cast<int>(l.size()) - 1) {
      return INVALID_ARGUMENT() << "stage " << s << ": the optimizer step must come once, last";
    }
    // Every boundary of a chain carries each micro-batch once each way.
    int n_recv_act = 0, n_send_act = 0, n_recv_grad = 0, n_send_grad = 0;
    for (const Action& a : l) {
      n_recv_act += a.kind == ActionKind::kRecvActivation;
      n_send_act += a.kind == ActionKind::kSendActivation;
      n_recv_grad += a.kind == ActionKind::kRecvGradient;
      n_send_grad += a.kind == ActionKind::kSendGradient;
    }
    const int first = s > 0 ? M : 0, last = s < K - 1 ? M : 0;
    if (n_recv_act != first || n_send_grad != first || n_send_act != last || n_recv_grad != last) {
      return INVALID_ARGUMENT() << "stage " << s << " has " << n_recv_act << " RECV_ACT, " << n_send_act
                                << " SEND_ACT, " << n_recv_grad << " RECV_GRAD, " << n_send_grad
                                << " SEND_GRAD; expected " << first << ", " << last << ", " << last << ", "
                                << first;
    }
    const int peak = MaxInFlight(l), bound = InFlightBound(kind, K, s, M);
    if (peak != bound) {
      return INVALID_ARGUMENT() << "stage " << s << " holds up to " << peak << " micro-batches in flight; "
                                << ScheduleKindName(kind) << " with K=" << K << ", M=" << M << " holds "
                                << bound;
    }
  }
  if (sends != recvs) {
    for (const auto& t : sends) {
      if (recvs.count(t) != sends.count(t)) {
        return INVALID_ARGUMENT() << (std::get<0>(t) ? "gradient" : "activation") << " of micro-batch "
                                  << std::get<1>(t) << " from stage " << std::get<2>(t) << " to stage "
                                  << std::get<3>(t) << " is sent " << sends.count(t) << " times, received "
                                  << recvs.count(t) << " times";
      }
    }
    return INVALID_ARGUMENT() << "a receive has no matching send";
  }
  return SimulateSchedule(lists).status();
}

absl::StatusOr<SimResult> Simulate(const std::vector<std::vector<SimAction>>& stages) {
  const int K = static_cast<int>(stages.size());
  SimResult r;
  r.times.resize(K);
  std::vector<size_t> pos(K, 0);
  std::vector<double> clock(K, 0.0), busy(K, 0.0);
  std::map<int64_t, double> sent_at;
  std::set<int64_t> received;
  for (;;) {
    bool progress = false, done = true;
    for (int s = 0; s < K; ++s) {
      while (pos[s] < stages[s].size()) {
        const SimAction& a = stages[s][pos[s]];
        double ready = clock[s];
        bool blocked = false;
        for (int64_t m : a.recvs) {
          auto it = sent_at.find(m);
          if (it == sent_at.end()) {
            blocked = true;
            break;
          }
          ready = std::max(ready, it->second);
        }
        if (blocked) break;
        for (int64_t m : a.recvs) {
          if (!received.insert(m).second) {
            return INVALID_ARGUMENT() << "stage " << s << " action '" << a.label << "' receives message " << m
                                      << " a second time";
          }
        }
        const double end = ready + a.duration;
        for (int64_t m : a.sends) {
          if (!sent_at.emplace(m, end).second) {
            return INVALID_ARGUMENT() << "stage " << s << " action '" << a.label << "' sends message " << m
                                      << " a second time";
          }
        }
        r.times[s].push_back({ready, end});
        busy[s] += a.duration;
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
      for (int s = 0; s < K; ++s) {
        if (pos[s] == stages[s].size()) {
          os << " stage " << s << " done;";
          continue;
        }
        const SimAction& a = stages[s][pos[s]];
        os << " stage " << s << " waits in '" << a.label << "' for message(s)";
        for (int64_t m : a.recvs)
          if (!sent_at.count(m)) os << " " << m;
        os << ";";
      }
      return FAILED_PRECONDITION() << os.str();
    }
  }
  for (const auto& [m, t] : sent_at) {
    if (!received.count(m)) return INVALID_ARGUMENT() << "message " << m << " is sent but never received";
  }
  double total_busy = 0;
  for (int s = 0; s < K; ++s) {
    r.makespan = std::max(r.makespan, clock[s]);
    total_busy += busy[s];
  }
  r.bubble_fraction = r.makespan > 0 ? 1.0 - total_busy / (K * r.makespan) : 0.0;
  return r;
}

std::vector<std::vector<SimAction>> ToSimActions(const std::vector<ActionList>& lists, double forward,
                                                 double backward, double optimizer) {
  auto message = [](int gradient, int m, int src, int dst) -> int64_t {
    return ((static_cast<int64_t>(gradient) * 1048576 + m) * 65536 + src) * 65536 + dst;
  };
  std::vector<std::vector<SimAction>> out(lists.size());
  for (size_t s = 0; s < lists.size(); ++s) {
    for (const Action& a : lists[s]) {
      SimAction sa;
      sa.label = std::string(ActionKindName(a.kind)) + (a.microbatch >= 0 ? std::to_string(a.microbatch) : "");
      const int me = static_cast<int>(s);
      switch (a.kind) {
        case ActionKind::kForward: sa.duration = forward; break;
        case ActionKind::kBackward: sa.duration = backward; break;
        case ActionKind::kOptimizerStep: sa.duration = optimizer; break;
        case ActionKind::kRecvActivation: sa.recvs.push_back(message(0, a.microbatch, a.peer, me)); break;
        case ActionKind::kSendActivation: sa.sends.push_back(message(0, a.microbatch, me, a.peer)); break;
        case ActionKind::kRecvGradient: sa.recvs.push_back(message(1, a.microbatch, a.peer, me)); break;
        case ActionKind::kSendGradient: sa.sends.push_back(message(1, a.microbatch, me, a.peer)); break;
      }
      out[s].push_back(std::move(sa));
    }
  }
  return out;
}

absl::StatusOr<SimResult> SimulateSchedule(const std::vector<ActionList>& lists) {
  return Simulate(ToSimActions(lists, /*forward=*/1, /*backward=*/2, /*optimizer=*/0));
}

std::string ScheduleToText(const std::vector<ActionList>& lists) {
  std::ostringstream os;
  for (size_t s = 0; s < lists.size(); ++s) {
    os << "s" << s << ":";
    for (const Action& a : lists[s]) {
      if (a.kind == ActionKind::kForward) os << " F" << a.microbatch;
      if (a.kind == ActionKind::kBackward) os << " B" << a.microbatch;
      if (a.kind == ActionKind::kOptimizerStep) os << " O";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace onnxpipe::pipeline
