// The CPU transport: comm::Comm between processes (on one host or several) over TCP, for CPU ranks
// and for stages that share one GPU through host memory. A rendezvous (rendezvous.h) gives every
// rank the others' addresses; the ranks then connect as a full mesh (rank i dials every j < i), and
// one reader thread per peer drains its connection into this rank's mailbox, so a Send never waits
// for the receiver (as comm.h requires) and a dead peer is noticed at once.
//
// Semantics are comm.h's, with these particulars:
// - Tensors on a device backend travel through host memory: Send copies to the host on the
//   caller's stream (after the work issued before it), Recv copies into the caller's buffer on its
//   stream. Host tensors are sent as they are.
// - AllReduce over `ranks`: the members send their tensors to ranks[0], which folds them in the
//   list's order with the backend's Accumulate ((t0 + t1) + t2 ...) and sends the sum back, so every
//   member gets the same bits as the in-process comm's serial sum.
// - Abort(reason) is sent to every peer: each one's calls then fail carrying "rank R: reason".
//   A peer whose connection ends without its goodbye (killed, crashed, unplugged) aborts the group
//   with an error naming that rank. A Recv from a peer that said goodbye fails instead of waiting.
// - timeout_s > 0: a Recv or AllReduce that waits longer fails with DeadlineExceeded.
// - Every rank sends each peer a heartbeat every second from a thread of its own; a peer not heard from for
//   silence_s (stopped, frozen or cut off from the network: a busy rank still beats) aborts the group naming it.
//   A peer in the middle of sending a frame counts as heard.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/grouping_comm.h"
#include "executor/comm/rendezvous.h"
#include "executor/comm/socket.h"

namespace onnxpipe::comm {

struct TcpCommOptions {
  RendezvousOptions rendezvous;
  double timeout_s = 0;
  std::shared_ptr<const backend::Backend> backend;  // null: the CPU backend
  double silence_s = 8;                             // 0: never give up on a silent peer
};

class TcpComm : public GroupingComm {
 public:
  // Rendezvous, then the mesh; fails (never hangs past the rendezvous timeout) naming what is missing.
  static absl::StatusOr<std::unique_ptr<TcpComm>> Create(const TcpCommOptions& options);
  // Says goodbye to every peer and waits (briefly) for theirs before closing.
  ~TcpComm() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  absl::Status AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) override;
  void Abort(const absl::Status& reason) override;
  absl::Status abort_status() const override;
  int64_t bytes_sent() const override;
  int64_t bytes_received() const override;

 private:
  enum class Kind : uint64_t {
    kMessage = 1,
    kError = 2,
    kAbort = 3,
    kBye = 4,
    kReduceIn = 5,
    kReduceOut = 6,
    kHeartbeat = 7
  };
  struct Incoming {
    Kind kind;
    uint64_t tag;
    ir::Tensor tensor;  // kMessage, kReduce*: on the host
    std::string text;   // kError
  };
  struct Peer {
    Socket socket;
    std::mutex write_mu;
    std::thread reader;
    std::deque<Incoming> mailbox;                 // guarded by mu_
    bool left = false;                            // said goodbye (guarded by mu_)
    bool closed = false;                          // its connection ended (guarded by mu_)
    bool mid_frame = false;                       // reading one of its frames (guarded by mu_)
    std::chrono::steady_clock::time_point heard;  // its last frame (guarded by mu_)
  };

  TcpComm(int rank, int world, const TcpCommOptions& options);
  void ReadLoop(int src);
  void HeartbeatLoop();
  absl::Status WriteFrame(int dst, Kind kind, uint64_t tag, const ir::Tensor* t, const std::string& text);
  absl::Status DoSend(int dst, Kind kind, uint64_t tag, const ir::Tensor& t, backend::Stream* stream);
  // Waits for the frame (kind, tag) from src (or a kError with that tag) and takes it from the mailbox.
  absl::StatusOr<Incoming> Take(int src, Kind kind, uint64_t tag, const std::string& what);
  // Copies a received host tensor into `into` (checking dtype and dims) on `stream`.
  absl::Status Land(const ir::Tensor& host, const ir::Tensor& into, backend::Stream* stream,
                    const std::string& what) const;
  absl::Status CheckPeer(int peer, const char* verb) const override;
  absl::Status SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) override;
  absl::Status RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) override;
  absl::Status AbortedLocked() const;
  void AbortLocally(const absl::Status& reason);
  void TellPeers();  // sends this rank's abort reason to every peer

  const int rank_;
  const double timeout_s_, silence_s_;
  std::thread heartbeat_;
  bool stopping_ = false;  // guarded by mu_
  const std::shared_ptr<const backend::Backend> backend_;
  const std::shared_ptr<const backend::Backend> host_;  // folds all-reduces of host tensors
  std::vector<std::unique_ptr<Peer>> peers_;            // by rank; this rank's entry has no socket
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::Status abort_;
  std::map<std::vector<int>, int64_t> reduce_calls_;
  int64_t sent_ = 0, received_ = 0;  // guarded by mu_
};

}  // namespace onnxpipe::comm
