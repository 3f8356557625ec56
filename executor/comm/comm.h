// Point-to-point transport between pipeline stages, behind one interface so that the pipeline
// driver runs unchanged over threads of one process (InProcessGroup, here) or over NCCL between
// processes (one per GPU, later).
//
// Contract:
// - A message is one ir::Tensor sent by rank `src` to rank `dst` under a 64-bit tag. Recv(src, tag)
//   returns the message with that tag from that source; callers post the sends and receives of a
//   (src, dst) pair in the same order (what a NCCL implementation relies on), though the in-process
//   implementation also matches tags out of order.
// - Send never waits for the receiver (messages are buffered), so a schedule in which every receive
//   has a matching send is free of deadlock as long as its dependency graph has no cycle (the
//   pipeline driver proves that by simulation before it runs).
// - Tensors are handed over without a copy where the transport allows (in-process: the receiver gets
//   the sender's storage). Tensors are immutable once sent: neither side writes into them.
// - Stream-ordered, as NCCL's send/receive: `stream` is the sender's stream whose earlier work
//   produces the tensor (and the receiver's stream whose later work reads it); the receiver's stream
//   waits for that work before anything issued after Recv. Null streams: host order (the CPU).
// - Abort(reason) stops the whole group: every blocked and every later Send/Recv on every rank
//   returns an error carrying the first reason given, so a failure in one stage wakes all others
//   instead of leaving them waiting forever.
#pragma once

#include <cstdint>
#include <string>

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
  virtual absl::StatusOr<ir::Tensor> Recv(int src, uint64_t tag, backend::Stream* stream) = 0;

  // Stops the group (see the header comment). The first reason wins; later calls keep it.
  virtual void Abort(const absl::Status& reason) = 0;
  // The reason of the abort, or OK while the group runs.
  virtual absl::Status abort_status() const = 0;

  // Bytes this rank has sent / received so far (for reports).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

// True for the error a Send/Recv returns because another rank aborted the group (as opposed to the
// failure that caused the abort).
bool IsAbortedByPeer(const absl::Status& s);

}  // namespace onnxpipe::comm
