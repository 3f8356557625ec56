// In-process implementation of comm::Comm: the ranks of a group are threads of one process, each
// holding the Comm endpoint of its rank. Messages are queued per destination (unbounded; the
// pipeline schedule bounds how many are in flight) and hand the sender's tensor storage to the
// receiver without a copy. One lock and one condition variable serve the whole group: stages
// exchange a few messages per micro-batch, far too few for contention to matter, and a single
// condition variable makes Abort trivially wake every waiter.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "executor/comm/comm.h"

namespace onnxpipe::comm {

class InProcessGroup : public std::enable_shared_from_this<InProcessGroup> {
 public:
  // `recv_timeout_s` > 0: a Recv that waits longer fails with DeadlineExceeded (a hang detector
  // for tests and debugging); 0 waits without limit.
  static std::shared_ptr<InProcessGroup> Create(int world_size, double recv_timeout_s = 0);

  int size() const { return world_size_; }
  // The endpoint of `rank` (0 <= rank < size()); several endpoints of one rank share its mailbox.
  std::unique_ptr<Comm> Endpoint(int rank);

  void Abort(const absl::Status& reason);
  absl::Status abort_status() const;
  // Messages sent and not yet received, over all ranks (0 after a clean step).
  int64_t pending_messages() const;

 private:
  friend class InProcessComm;
  struct Message {
    int src;
    uint64_t tag;
    ir::Tensor tensor;
    std::shared_ptr<backend::Event> ready;
  };
  InProcessGroup(int world_size, double recv_timeout_s);
  // `ready`: the sender's event after the work producing t (null: none), handed to the receiver.
  absl::Status Send(int src, int dst, uint64_t tag, const ir::Tensor& t, std::shared_ptr<backend::Event> ready);
  absl::StatusOr<ir::Tensor> Recv(int dst, int src, uint64_t tag, std::shared_ptr<backend::Event>* ready);

  const int world_size_;
  const double recv_timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Message>> mailbox_;  // per destination rank
  absl::Status abort_;
  std::vector<int64_t> sent_, received_;  // bytes per rank
};

}  // namespace onnxpipe::comm
