// comm::Comm over NCCL, one process per GPU: what a multi-process run on GPUs uses for its tensors, with a TCP
// control plane (comm/tcp_comm.h) beside it for what NCCL cannot do — the start (the ranks meet at MASTER_ADDR and
// rank 0's ncclUniqueId reaches every rank through it), and failures: a peer that dies or aborts is seen on its TCP
// connection at once, and this rank then aborts its NCCL communicator (ncclCommAbort), which ends any NCCL kernel
// waiting for that peer; an asynchronous NCCL error (ncclCommGetAsyncError) aborts the world the same way.
//
// Semantics are comm.h's with NCCL's particulars:
// - Send/Recv are ncclSend/ncclRecv, matched by order per pair of ranks, not by tag (tags are ignored): callers
//   post a pair's sends and receives in the same order on both sides (and a receive buffer of the sender's size).
// - An NCCL send completes only with its receive, so sends are held (comm.h: copied at once on the caller's
//   stream) and go out with the next receive, group or Flush; a group's transfers are one ncclGroupStart/End. A
//   rank may send to itself (NCCL allows it within a group; a held send and its receive make one).
// - Transfers and collectives run on the communicator's own stream, ordered after the caller's stream's work by an
//   event, and the caller's stream waits for them; host tensors are staged through device memory.
// - AllReduce is ncclAllReduce (sum) over the world's communicator, or over a group's, made by PrepareGroups at
//   the start (ncclCommSplit of the world's, in the list's order on every rank); a group not prepared is an error.
//   NCCL's ring or tree order of the sum is not the serial left fold of the other comms: results agree to
//   rounding, not bit for bit.
// - NCCL_NVLS_ENABLE=0 is set before the communicator is made (no NVLink multicast on shared hosts).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "executor/comm/grouping_comm.h"
#include "executor/comm/tcp_comm.h"
#include "executor/cuda/cuda_backend.h"

namespace onnxpipe::cuda {

struct NcclCommOptions {
  comm::RendezvousOptions rendezvous;
  double timeout_s = 0, silence_s = 8;  // the control plane's (comm/tcp_comm.h)
  std::shared_ptr<const CudaBackend> backend;
  int device = 0;
};

class NcclComm : public comm::GroupingComm {
 public:
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(const NcclCommOptions& options);
  ~NcclComm() override;

  int rank() const override { return control_->rank(); }
  int size() const override { return control_->size(); }
  absl::Status AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) override;
  absl::Status PrepareGroups(const std::vector<std::vector<int>>& groups) override;
  void Abort(const absl::Status& reason) override;
  absl::Status abort_status() const override { return control_->abort_status(); }
  int64_t bytes_sent() const override { return sent_; }
  int64_t bytes_received() const override { return received_; }

 protected:
  absl::Status CheckPeer(int peer, const char* verb) const override;
  absl::Status SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) override;
  absl::Status RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) override;
  absl::Status IssueGroup(const std::vector<Grouped>& ops) override;
  bool HoldsSends() const override { return true; }
  absl::StatusOr<ir::Tensor> Own(const ir::Tensor& t, backend::Stream* stream) override;

 private:
  struct State;  // the NCCL communicator, the comm stream and the watcher (CUDA and NCCL types stay in the .cc)
  NcclComm() = default;
  // Runs `issue` (enqueuing NCCL work on the comm stream for the tensors' device buffers, in order) after the work
  // of the tensors' callers' streams and before their later work, with host tensors staged through device copies
  // (read back where `read_back`).
  struct Transfer {
    ir::Tensor tensor;
    backend::Stream* stream;
    bool read_back;
  };
  absl::Status Issue(const std::vector<Transfer>& transfers, const char* what,
                     const std::function<int(const std::vector<void*>& data)>& issue);
  std::unique_ptr<comm::TcpComm> control_;
  std::shared_ptr<const CudaBackend> backend_;
  std::unique_ptr<State> state_;
  std::atomic<int64_t> sent_{0}, received_{0};
};

}  // namespace onnxpipe::cuda
