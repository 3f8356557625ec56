// Pipeline schedules as per-stage action lists (torch.distributed.pipelining style), their
// validation, and a simulator that proves a set of lists free of deadlock.
//
// Stage s of K runs, for a step of M micro-batches (m = 0..M-1):
// - GPipe (arXiv 1811.06965): F0 .. F(M-1), then B0 .. B(M-1), then the optimizer step. Every
//   micro-batch's activations are held at once: M in flight.
// - 1F1B (Megatron's non-interleaved schedule, arXiv 2104.04473): min(M, K-s-1) warm-up forwards,
//   then one forward and one backward alternately (steady state), then the remaining backwards
//   (cool-down), then the optimizer step. At most min(M, K-s) micro-batches in flight.
// Backwards run in micro-batch order on every stage for both schedules, so gradients accumulate in
// the same order (0, 1, .., M-1) whichever schedule runs: the two give bitwise-equal results.
// Around each compute action the lists carry the transfers of a chain of stages: RECV_ACT m from
// s-1 before F m and SEND_ACT m to s+1 after it (s > 0 / s < K-1), RECV_GRAD m from s+1 before B m
// and SEND_GRAD m to s-1 after it. The executor keeps the compute order and replaces these by the
// concrete transfers of its stage programs (which may skip stages); the simulator checks both.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::pipeline {

enum class ScheduleKind { kGPipe, k1F1B };
const char* ScheduleKindName(ScheduleKind k);                     // "gpipe" | "1f1b"
absl::StatusOr<ScheduleKind> ParseScheduleKind(std::string_view s);  // "gpipe" | "1f1b"

enum class ActionKind : uint8_t {
  kForward,
  kBackward,
  kRecvActivation,
  kSendActivation,
  kRecvGradient,
  kSendGradient,
  kOptimizerStep,
};
const char* ActionKindName(ActionKind k);  // "F", "B", "RECV_ACT", ...

struct Action {
  ActionKind kind = ActionKind::kForward;
  int32_t microbatch = -1;  // -1 for the optimizer step
  int32_t peer = -1;        // the other stage of a transfer, else -1
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && peer == o.peer;
  }
};
using ActionList = std::vector<Action>;

// One list per stage. Fails for K < 1 or M < 1.
absl::StatusOr<std::vector<ActionList>> BuildSchedule(ScheduleKind kind, int num_stages, int microbatches);

// Micro-batches whose activations stage `stage` holds at once: GPipe M, 1F1B min(M, K - stage)
// (Megatron-LM #169: rank r holds at most p - r).
int InFlightBound(ScheduleKind kind, int num_stages, int stage, int microbatches);

// The largest number of micro-batches forwarded and not yet backwarded at any point of `list`.
int MaxInFlight(const ActionList& list);

// Checks a schedule: on every stage each micro-batch is forwarded once and backwarded once, after
// its forward; the optimizer step comes once, last; every transfer sits next to its compute action
// (RECV_ACT m just before F m, ...) and has its matching counterpart on the peer stage; the peak
// in-flight count of each stage equals InFlightBound; and the lists simulate to completion
// (SimulateSchedule). Errors name the stage and the action.
absl::Status ValidateSchedule(const std::vector<ActionList>& lists, ScheduleKind kind, int microbatches);

// --- Simulation -------------------------------------------------------------------------------
// A stage runs its actions in order. An action first takes every message of `recvs` (waiting until
// each has been sent), then computes for `duration` time units, then sends every message of
// `sends` (sends never wait: messages are buffered, as comm::Comm guarantees). Message ids are
// arbitrary but each must be sent exactly once and received exactly once.
struct SimAction {
  std::string label;  // for error messages and text timelines, e.g. "F3"
  double duration = 0;
  std::vector<int64_t> recvs, sends;
};

struct SimResult {
  // Per stage, per action: start and end times.
  std::vector<std::vector<std::pair<double, double>>> times;
  double makespan = 0;
  double bubble_fraction = 0;  // idle share of K x makespan
};

// Fails when the lists deadlock (naming each stage's blocked action and the messages it waits
// for), or when a message is sent twice, received twice or never sent/received.
absl::StatusOr<SimResult> Simulate(const std::vector<std::vector<SimAction>>& stages);

// The schedule's lists as SimActions: F takes `forward`, B `backward`, the optimizer step
// `optimizer` time units; transfers take none and carry one message per (kind, micro-batch, edge).
std::vector<std::vector<SimAction>> ToSimActions(const std::vector<ActionList>& lists, double forward,
                                                 double backward, double optimizer);

// Simulates the schedule with unit-time forwards and two-unit backwards (the usual 1:2 ratio).
absl::StatusOr<SimResult> SimulateSchedule(const std::vector<ActionList>& lists);

// One line per stage: "s0: F0 F1 B0 B1 O" (transfers left out).
std::string ScheduleToText(const std::vector<ActionList>& lists);

}  // namespace onnxpipe::pipeline
