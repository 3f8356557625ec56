// Phase 6 of the partitioner, and what the pipeline executor runs: one training step's schedule as
// one list of actions per stage (torch.distributed.pipelining's schedules as data), built once for
// GPipe and 1F1B, checked, and simulated. The partitioner simulates the lists for its predicted
// step and Chrome trace; the executor's stage threads run the very same lists.
//
// Stage s of K runs, for a step of M micro-batches (m = 0..M-1):
// - GPipe (arXiv 1811.06965): F0 .. F(M-1), then B0 .. B(M-1), then the optimizer step O. Every
//   micro-batch's activations are held at once: M in flight.
// - 1F1B (Megatron's non-interleaved schedule, arXiv 2104.04473): min(M, K-s-1) warm-up forwards,
//   then one forward and one backward alternately, then the remaining backwards, then O. At most
//   min(M, K-s) micro-batches in flight (Megatron-LM #169: rank r holds at most p - r).
// Backwards run in micro-batch order on every stage for both schedules, so gradients accumulate in
// the same order (0, 1, .., M-1) whichever schedule runs: the two give bitwise-equal results.
//
// A stage's backward of one micro-batch may come in parts (StageShape::backward): runs of backward
// nodes (B) and the recompute regions that run just before the first backward node reading them
// (R). Around the compute actions sit the transfers: RECV_ACT m from each peer whose forward sends
// to this stage's forward, before F m; SEND_ACT m to each peer this forward sends to, after it;
// RECV_GRAD m from each peer the backward reads from, before the first part of the backward;
// SEND_GRAD m after the last part. Without a stage program the peers are the chain's (s-1, s+1).
// The executor sends eagerly (as soon as a value exists) and receives at the RECV actions, so a list
// set that simulates to the end cannot deadlock: a receive here waits for every SEND of its
// micro-batch from its peer to this stage.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::partitioner {

enum class ScheduleKind { kGPipe, k1F1B };
const char* ScheduleName(ScheduleKind k);                        // "gpipe" | "1f1b"
absl::StatusOr<ScheduleKind> ParseSchedule(std::string_view s);  // "gpipe" | "1f1b"

// Micro-batches whose activations stage `stage` (0-based) of `num_stages` holds at once:
// GPipe M, 1F1B min(M, K - stage).
int64_t InFlightMicrobatches(ScheduleKind kind, int64_t num_stages, int64_t stage, int64_t microbatches);

enum class ActionKind : uint8_t {
  kForward,
  kBackward,
  kRecompute,
  kRecvActivation,
  kSendActivation,
  kRecvGradient,
  kSendGradient,
  kOptimizerStep,
};
const char* ActionKindName(ActionKind k);  // "F", "B", "R", "RECV_ACT", "SEND_ACT", "RECV_GRAD", "SEND_GRAD", "O"

struct Action {
  ActionKind kind = ActionKind::kForward;
  int32_t microbatch = -1;  // -1 for the optimizer step
  int32_t peer = -1;        // the other stage of a transfer, else -1
  int32_t part = 0;         // B and R: the index of the part in the stage's backward
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && peer == o.peer && part == o.part;
  }
};
using ActionList = std::vector<Action>;

// "F3", "B3", "R3.1" / "B3.2" (part > 0), "RECV_ACT3<0", "SEND_ACT3>1", "RECV_GRAD3<1", "SEND_GRAD3>0", "O".
std::string ActionToString(const Action& a);
absl::StatusOr<Action> ParseAction(std::string_view s);

// What one stage's actions are made of besides the schedule's order: the peers of its transfers
// (ascending) and the parts of one backward, in order (kind kBackward or kRecompute; part = index).
struct StageShape {
  std::vector<int32_t> recv_forward, send_forward, recv_backward, send_backward;
  std::vector<ActionKind> backward = {ActionKind::kBackward};
};
// Stage s of a chain of K: activations from s-1 and to s+1, gradients back; one backward part.
StageShape ChainShape(int32_t num_stages, int32_t stage);

// One list per stage. `shapes`: one per stage, or empty for the chain's. Fails for K < 1, M < 1 or
// a shape without a backward part.
absl::StatusOr<std::vector<ActionList>> BuildSchedule(ScheduleKind kind, int32_t num_stages, int32_t microbatches,
                                                      const std::vector<StageShape>& shapes = {});

// --- Simulation -------------------------------------------------------------------------------
// A stage runs its steps in order. A step first waits for every message of `waits` (each must be
// sent by some step), then computes for `duration`, then sends each of `sends`: a message takes
// the link `link` (one transfer at a time per link; -1: no link) for `transfer_s` and arrives at
// the end of its transfer. Sends do not occupy the stage. A message may be waited for by several
// steps.
struct SimSend {
  int64_t message = 0;
  int64_t link = -1;
  double transfer_s = 0;
};
struct SimStep {
  std::string label;  // for error messages, e.g. "F3"
  double duration = 0;
  std::vector<int64_t> waits;
  std::vector<SimSend> sends;
};
struct SimTimes {
  std::vector<std::vector<std::pair<double, double>>> steps;                   // per stage, per step: start, end
  std::vector<std::vector<std::vector<std::pair<double, double>>>> transfers;  // per stage, step, send
  double makespan = 0;
};
// Fails when the steps deadlock (naming each stage's blocked step and the messages it waits for)
// or wait for a message no step sends.
absl::StatusOr<SimTimes> SimulateSteps(const std::vector<std::vector<SimStep>>& stages);

struct StageTiming {
  double forward_s = 0;        // per micro-batch
  double backward_s = 0;       // per micro-batch, recompute included
  double optimizer_s = 0;      // per step
  double send_forward_s = 0;   // this stage's forward outputs to each peer, per micro-batch
  double send_backward_s = 0;  // this stage's backward outputs to each peer, per micro-batch
};

struct ScheduleEvent {
  enum Kind : char {
    kForward = 'F',
    kBackward = 'B',
    kRecompute = 'R',
    kOptimizer = 'O',
    kSendForward = 'f',
    kSendBackward = 'b'
  };
  int32_t stage = 0;
  int32_t microbatch = -1;  // -1 for the optimizer step
  int32_t peer = -1;        // transfers: the receiving stage
  Kind kind = kForward;
  double start_s = 0, end_s = 0;
};

struct ScheduleResult {
  double step_s = 0;
  double bubble_fraction = 0;         // idle share of K x step_s
  std::vector<double> busy_s;         // per stage: compute time in the step
  std::vector<ScheduleEvent> events;  // F/B/R of every micro-batch, O and transfers that take time;
                                      // by stage, then start time
};

// Walks `lists` with `timing` (one per stage): F takes forward_s, O optimizer_s, B and R their
// part's time from `parts_s` (per stage, per part of its backward) or, without it, part 0 the
// whole backward_s; a SEND takes its stage's send time on the link to its peer. Fails on a deadlock.
absl::StatusOr<ScheduleResult> Simulate(const std::vector<ActionList>& lists, const std::vector<StageTiming>& timing,
                                        const std::vector<std::vector<double>>& parts_s = {});

// The chain lists of `kind` (BuildSchedule without shapes) simulated: what the partitioner's
// search predicts a step to take.
ScheduleResult SimulateSchedule(ScheduleKind kind, const std::vector<StageTiming>& stages, int64_t microbatches);

}  // namespace onnxpipe::partitioner
