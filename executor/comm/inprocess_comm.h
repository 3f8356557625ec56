// In-process implementation of comm::Comm: the ranks of a group are threads of one process, each
// holding the Comm endpoint of its rank; their tensors live in one backend's memory (or on the
// host), and every copy goes through that backend on the streams of the ranks involved.
// A Send copies its tensor into a staging buffer of the message on the sender's stream and
// records an event; the Recv makes the receiver's stream wait for it and copies the staging buffer
// into the caller's buffer. Messages are queued per destination (unbounded; the pipeline schedule
// bounds how many are in flight). An all-reduce is summed once, by the member that arrives last,
// on its stream, into a buffer of the reduction that every member then copies from.
// One lock and one condition variable serve the whole group: stages exchange a few messages per
// micro-batch, far too few for contention to matter, and a single condition variable makes Abort
// trivially wake every waiter.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"

namespace onnxpipe::comm {

// Staging buffers kept from one group to the next (a pipeline step makes a group each step): a Send
// stages into a free buffer of exactly its size, after the receive that last read it has finished
// (an event on the receiver's stream), instead of allocating one; an all-reduce sums into one, after
// every member has copied the previous sum out of it. On a GPU that keeps cudaMalloc, and cudaFree's
// device-wide synchronisation, out of the step loop. Thread-safe.
class StagingPool {
 public:
  // Buffers allocated so far (for tests).
  int64_t allocations() const;

 private:
  friend class InProcessGroup;
  struct Entry {
    std::shared_ptr<uint8_t> buffer;
    std::vector<std::shared_ptr<backend::Event>> done;  // the last reads of it
  };
  mutable std::mutex mu_;
  std::multimap<int64_t, Entry> free_;  // by bytes
  int64_t allocations_ = 0;
};

class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  // `timeout_s` > 0: a Recv, GroupEnd or AllReduce that waits longer fails with DeadlineExceeded (a
  // hang detector for tests and debugging); 0 waits without limit. `backend`: where the ranks'
  // tensors live besides the host (null: the CPU backend).
  // `staging`: buffers to stage sends in, shared with later groups (null: each send stages into
  // a buffer of its own).
  static std::shared_ptr<InProcessGroup> Create(int world_size, double timeout_s = 0,
                                                std::shared_ptr<const backend::Backend> backend = nullptr,
                                                std::shared_ptr<StagingPool> staging = nullptr);

  int size() const { return world_size_; }
  // The endpoint of `rank` (0 <= rank < size()); several endpoints of one rank share its mailbox.
  std::unique_ptr<Comm> Endpoint(int rank);

  // NCCL's point-to-point semantics (comm.h's holding), for tests that run a driver as NCCL would: each rank's sends
  // are held until its next group, receive or Flush, and a group returns only once its sends have been received.
  // Call before the first transfer.
  void UseNcclSemantics() { nccl_semantics_ = true; }

  void Abort(const absl::Status& reason);
  absl::Status abort_status() const;
  // Messages sent and not yet received, over all ranks (0 after a clean step).
  int64_t pending_messages() const;

 private:
  friend class InProcessComm;
  struct Message {
    int src;
    uint64_t tag;
    ir::Tensor staged;  // the message's bytes, the transport's own
    std::shared_ptr<backend::Event> ready;
    std::shared_ptr<uint8_t> pooled;  // staged's buffer when it came from the StagingPool
  };
  // One all-reduce of one group of ranks; members by their position in the group's list.
  struct Reduction {
    std::vector<ir::Tensor> inputs;
    std::vector<std::shared_ptr<backend::Event>> ready;
    int arrived = 0, departed = 0;
    bool finished = false;
    absl::Status error;
    ir::Tensor sum;
    std::shared_ptr<backend::Event> done;
    StagingPool::Entry pooled;  // sum's buffer when it came from the staging pool; `done` gets each member's copy
  };
  using ReductionKey = std::pair<std::vector<int>, int64_t>;  // the group, the member's call count

  InProcessGroup(int world_size, double timeout_s, std::shared_ptr<const backend::Backend> backend,
                 std::shared_ptr<StagingPool> staging);
  absl::Status CheckPeer(int self, int peer, const char* verb) const;
  absl::Status Send(int src, int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream);
  absl::Status Recv(int dst, int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream);
  // Waits until every message `rank` sent has been received (NCCL's semantics).
  absl::Status AwaitSent(int rank);
  absl::Status AllReduce(int rank, const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream);
  // Waits under `lock` until `done()`, the abort or the timeout; `what` describes the wait.
  absl::Status WaitLocked(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
                          const std::function<std::string()>& what);
  absl::Status AbortedLocked() const;
  // A staging buffer of `bytes` for `stream` to write: a free one of the pool once its last reads
  // have finished (`stream` waits for them), or a new one.
  absl::StatusOr<std::shared_ptr<uint8_t>> TakeStaging(int64_t bytes, backend::Stream* stream) const;
  // A copy of `t` the transport owns (in the backend's memory, or on the host for a host tensor);
  // *pooled: its buffer when it came from the staging pool.
  absl::StatusOr<ir::Tensor> Stage(const ir::Tensor& t, backend::Stream* stream,
                                   std::shared_ptr<uint8_t>* pooled) const;
  // dst = src on `stream`, wherever each lives (the host or the backend's memory).
  absl::Status CopyPlaced(const ir::Tensor& src, const ir::Tensor& dst, backend::Stream* stream) const;

  const int world_size_;
  const double timeout_s_;
  const std::shared_ptr<const backend::Backend> backend_;
  const std::shared_ptr<StagingPool> staging_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Message>> mailbox_;                       // per destination rank
  std::map<std::vector<int>, std::vector<int64_t>> reduce_calls_;  // per group, per member: calls so far
  std::map<ReductionKey, Reduction> reductions_;
  absl::Status abort_;
  std::vector<int64_t> sent_, received_;  // bytes per rank
  bool nccl_semantics_ = false;
  std::vector<int64_t> unreceived_;  // per sender: its messages not yet received
};

}  // namespace onnxpipe::comm
