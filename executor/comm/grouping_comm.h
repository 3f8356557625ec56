// What every Comm implementation shares between the caller and its transport: the argument checks of Send and
// Recv, ncclGroupStart/End's grouping (comm.h's contract: grouped calls only check, GroupEnd issues the sends
// first, then the receives) and the holding of sends for a comm whose sends wait for their receives. An
// implementation supplies the peer check and the transfers themselves.
#pragma once

#include <vector>

#include "executor/comm/comm.h"

namespace onnxpipe::comm {

class GroupingComm : public Comm {
 public:
  absl::Status Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) final;
  absl::Status Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) final;
  absl::Status GroupStart() final;
  absl::Status GroupEnd() final;
  absl::Status Flush() final;

 protected:
  struct Grouped {
    bool send;
    int peer;
    uint64_t tag;
    ir::Tensor tensor;
    backend::Stream* stream;
  };
  // Issues a group's transfers (GroupEnd, a receive with held sends, Flush): by default the sends (SendNow), then
  // the receives (RecvNow), then AwaitSends when the group sent anything and the comm holds sends. NCCL issues them
  // as one ncclGroupStart/End instead.
  virtual absl::Status IssueGroup(const std::vector<Grouped>& ops);
  // Whether sends are held until the next group, receive or Flush (comm.h), and for those: a copy of t the comm
  // owns (taken on `stream` as the Send is made), and the wait until the sends a group issued have been received.
  virtual bool HoldsSends() const { return false; }
  virtual absl::StatusOr<ir::Tensor> Own(const ir::Tensor& t, backend::Stream* stream) { return t; }
  virtual absl::Status AwaitSends() { return absl::OkStatus(); }
  // An error when `peer` cannot be reached from this rank ("rank 0 sends to rank 9 ...").
  virtual absl::Status CheckPeer(int peer, const char* verb) const = 0;
  // The transfers, arguments checked.
  virtual absl::Status SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) = 0;
  virtual absl::Status RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) = 0;
  // FailedPrecondition inside a group (where AllReduce is not allowed).
  absl::Status CheckNotGrouped(const char* call) const;

 private:
  int depth_ = 0;
  std::vector<Grouped> grouped_, held_;
};

}  // namespace onnxpipe::comm
