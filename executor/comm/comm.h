// Transport between pipeline stages (and, later, data-parallel replicas), shaped like NCCL so that
// the stage executor runs unchanged over threads of one process (InProcessGroup, here), CPU
// processes or NCCL (one process per GPU, later).
//
// Contract:
// - Tensors are placed (ir::Placement): on the host or in a backend's memory. Every call is
//   stream-ordered, as NCCL's: `stream` is the caller's stream; the call's reads of its tensor come
//   after the work issued on it before the call, and work issued on it after the call sees the
//   result. Null streams: host order (the CPU).
// - Send(dst, tag, t): the message is t's contents when the call is made; the caller may overwrite
//   t with work issued after the call. Sends never wait for the receiver (messages are buffered).
// - Recv(src, tag, into): the next message from that source lands in `into`, a buffer the caller
//   provides (the stage arena's planned slot for the value); its dtype and dims must be the
//   message's, else the call fails naming both. Messages are matched by order per (src, dst) pair,
//   as NCCL matches them: the n-th Recv from src takes the n-th message src sent here. The tag is a
//   check: when it is not the one the sender gave that message, the call fails naming both (an
//   implementation that cannot carry tags, NCCL, ignores them), so two sides posting in different
//   orders show as an error instead of a silently swapped tensor.
// - GroupStart/GroupEnd (ncclGroupStart/End): the sends and receives posted between them are
//   issued together at GroupEnd, sends first, so a group that receives from a peer and sends to it
//   cannot deadlock whatever order its calls were made in. Calls in a group only check their
//   arguments; GroupEnd returns the first error of the group's transfers. Groups nest; AllReduce is
//   not allowed inside one.
// - Holding (NCCL's, and the in-process group's `nccl_semantics`): a send may not complete before its
//   receive is posted, so such a comm holds each Send made outside a group (its tensor copied at
//   once) and issues the held sends with its next group, its next Recv, or Flush: a stage's sends go
//   out together with the receive it posts next (partitioner/transfer_order.h proves the plan's
//   posts complete that way). Flush issues what is held; a comm that sends at once has nothing to.
// - AllReduce(t, ranks): over the group `ranks` (distinct ranks, this one among them, listed the same
//   way by every member), every member's t becomes the sum of the members' tensors, in place. The
//   sum is a left fold in the order of `ranks`, ((t_r0 + t_r1) + t_r2) + ..., computed once and
//   copied to every member, so the result is bitwise identical on every member and equal to a
//   serial sum in that order. Members call the all-reduces of one group in the same order (the
//   n-th call of each member is one all-reduce, as NCCL matches collectives); their tensors must
//   agree in dtype and dims, else every member fails naming both.
// - PrepareGroups(groups): collective over the whole world, once, before any AllReduce: every rank passes the same
//   list, the groups its all-reduces will name (the world needs none). NCCL makes a communicator per group there
//   (ncclCommSplit is collective over its parent); the other comms need nothing.
// - Abort(reason) stops the whole group: every blocked and every later call on every rank returns an
//   error carrying the first reason given, so a failure in one stage wakes all others instead of
//   leaving them waiting forever.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::comm {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual absl::Status Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) = 0;
  virtual absl::Status Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) = 0;
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;
  virtual absl::Status Flush() = 0;
  virtual absl::Status AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) = 0;
  virtual absl::Status PrepareGroups(const std::vector<std::vector<int>>& groups) { return absl::OkStatus(); }

  // Stops the group (see the header comment). The first reason wins; later calls keep it.
  virtual void Abort(const absl::Status& reason) = 0;
  // The reason of the abort, or OK while the group runs.
  virtual absl::Status abort_status() const = 0;

  // Bytes this rank has sent / received so far by Send/Recv (for reports).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

// True for the error a call returns because another rank aborted the group (as opposed to the
// failure that caused the abort).
bool IsAbortedByPeer(const absl::Status& s);
// What a call returns once the group is aborted for `reason`.
absl::Status AbortedStatus(const absl::Status& reason);

// The error of a Recv on rank `self` for message `want` from `src` whose next message is `next`.
absl::Status OutOfOrder(int self, int src, uint64_t want, uint64_t next);

// "{0, 2, 3}": how errors name a group of ranks.
std::string RanksString(const std::vector<int>& ranks);

// "f32 (2, 3)": how errors name a tensor.
std::string DescribeTensor(const ir::Tensor& t);

}  // namespace onnxpipe::comm
