// The transfers of a pipeline program as NCCL runs them: what every rank posts, in the order it posts
// it, and the proof that the ranks' posts match and cannot deadlock under NCCL's rules.
//
// NCCL matches point-to-point by order: the n-th send from rank a to rank b is the n-th receive on b
// from a, whatever the two sides think they are exchanging, and a send may not complete before its
// receive is posted. The executor (executor/pipeline) posts, per stage and in its action list's order:
// - each value a compute action (F, B, R) makes for a peer, as the node making it ends, in node order
//   and, for a value going to several peers, in ascending peer order;
// - each RECV action's values, in the order its value list gives, as one group, which also takes the values of the
//   RECV actions right after it for the same micro-batch and direction (from other peers: a stage that reads a
//   value skipping the stage before it): NCCL completes a group as a whole, and receiving those one peer at a
//   time can deadlock 1F1B (ReceiveRunEnd);
// - in the optimizer phase: the accumulated contributions it sends (the post transfer list's order,
//   less those all-reduced), then per post node the values it reads from peers (before the node) and
//   the values it makes for peers (after it); a value from a peer after every value that peer sent
//   before it; a Sum the plan all-reduces (AllReducedSums) exchanges nothing point-to-point.
// A comm holds the sends made since its last group and issues them with the next group (a RECV
// action's, a receive of the optimizer phase, or the flush at the end of a compute action not
// followed by a RECV and at the end of the step): so a stage's sends and its next receives go out as one
// ncclGroupStart/End, which is what lets a 1F1B stage send its activation and receive its gradient without waiting for
// each other.
//
// ProveTransferOrder derives those posts and checks (1) that on every channel the sender's n-th
// message is the receiver's n-th (micro-batch and value), and (2) that the micro-batch phase's groups
// complete under NCCL's rules: a group completes once every one of its sends and receives has its
// counterpart in the peer's current group. The optimizer phase's few small transfers are staged by
// every comm (a send there does not wait for its receive); ProveDeadlockFree covers them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "partitioner/schedule.h"
#include "partitioner/stage_program.h"

namespace onnxpipe::partitioner {

struct TransferOp {
  enum Kind : uint8_t { kSend, kRecv };
  Kind kind = kSend;
  int32_t peer = -1;
  int32_t microbatch = -1;  // -1: the optimizer phase
  ir::ValueId value = ir::kNoValue;
};
struct TransferGroup {
  std::string action;  // what posts it, e.g. "RECV_ACT3<0", "O"
  std::vector<TransferOp> ops;
  bool optimizer = false;  // posted by the optimizer phase
};

// Whether the next action after list[i] that is not a SEND (SENDs post nothing: values leave as they are made)
// receives: a compute action's held sends then go out with that receive, else at the action's end.
bool ReceivesNext(const ActionList& list, size_t i);

// The end of the run of RECV actions that begins at list[i] (a RECV): the index after the last one of the same
// direction and micro-batch that follows it with only SENDs between. The run is received as one group.
size_t ReceiveRunEnd(const ActionList& list, size_t i);

// Stage k's posts in order, grouped as the comm issues them (see the file comment).
std::vector<TransferGroup> TransferProgram(const PipelineProgram& p, const std::vector<ActionList>& lists, int32_t k);

// OK when every stage's groups (program[k], in order) complete under NCCL's rules (the header comment), the
// optimizer phase's aside; else an error naming each blocked stage's waiting action.
absl::Status SimulateTransfers(const std::vector<std::vector<TransferGroup>>& program);

// OK when the stages' posts match message by message on every channel and complete under NCCL's
// rules; else an error naming the channel, the message and both sides' values, or each blocked
// stage's waiting action.
absl::Status ProveTransferOrder(const PipelineProgram& p, const std::vector<ActionList>& lists);

}  // namespace onnxpipe::partitioner
