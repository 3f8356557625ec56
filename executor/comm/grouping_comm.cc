#include "executor/comm/grouping_comm.h"

#include "frontend/ir/status.h"

namespace onnxpipe::comm {

absl::Status GroupingComm::Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckPeer(dst, "sends to"));
  if (!t.has_data()) return INVALID_ARGUMENT() << "rank " << rank() << " sends message " << tag << " without data";
  if (depth_ > 0) {
    grouped_.push_back({true, dst, tag, t, stream});
    return absl::OkStatus();
  }
  if (HoldsSends()) {
    ASSIGN_OR_RETURN(ir::Tensor own, Own(t, stream));
    held_.push_back({true, dst, tag, std::move(own), stream});
    return absl::OkStatus();
  }
  return SendNow(dst, tag, t, stream);
}

absl::Status GroupingComm::Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckPeer(src, "receives from"));
  if (!into.has_data()) {
    return INVALID_ARGUMENT() << "rank " << rank() << " receives message " << tag << " from rank " << src
                              << " into a buffer without storage";
  }
  if (depth_ > 0 || !held_.empty()) {  // a receive takes the held sends along, as one group
    RETURN_IF_ERROR(GroupStart());
    grouped_.push_back({false, src, tag, into, stream});
    return GroupEnd();
  }
  return RecvNow(src, tag, into, stream);
}

absl::Status GroupingComm::GroupStart() {
  ++depth_;
  return absl::OkStatus();
}

absl::Status GroupingComm::GroupEnd() {
  if (depth_ == 0) return FAILED_PRECONDITION() << "rank " << rank() << ": GroupEnd without GroupStart";
  if (--depth_ > 0) return absl::OkStatus();
  std::vector<Grouped> ops = std::move(held_);
  held_.clear();
  ops.insert(ops.end(), grouped_.begin(), grouped_.end());
  grouped_.clear();
  return IssueGroup(ops);
}

absl::Status GroupingComm::IssueGroup(const std::vector<Grouped>& ops) {
  bool sends = false;
  for (const Grouped& op : ops) {
    if (!op.send) continue;
    RETURN_IF_ERROR(SendNow(op.peer, op.tag, op.tensor, op.stream));
    sends = true;
  }
  for (const Grouped& op : ops) {
    if (!op.send) RETURN_IF_ERROR(RecvNow(op.peer, op.tag, op.tensor, op.stream));
  }
  return sends && HoldsSends() ? AwaitSends() : absl::OkStatus();
}

absl::Status GroupingComm::Flush() {
  if (depth_ > 0) return FAILED_PRECONDITION() << "rank " << rank() << ": Flush between GroupStart and GroupEnd";
  if (held_.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(GroupStart());
  return GroupEnd();
}

absl::Status GroupingComm::CheckNotGrouped(const char* call) const {
  if (depth_ > 0)
    return FAILED_PRECONDITION() << "rank " << rank() << ": " << call << " between GroupStart and GroupEnd";
  return absl::OkStatus();
}

}  // namespace onnxpipe::comm
