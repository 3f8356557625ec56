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
  return SendNow(dst, tag, t, stream);
}

absl::Status GroupingComm::Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckPeer(src, "receives from"));
  if (!into.has_data()) {
    return INVALID_ARGUMENT() << "rank " << rank() << " receives message " << tag << " from rank " << src
                              << " into a buffer without storage";
  }
  if (depth_ > 0) {
    grouped_.push_back({false, src, tag, into, stream});
    return absl::OkStatus();
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
  std::vector<Grouped> ops = std::move(grouped_);
  grouped_.clear();
  for (const Grouped& op : ops) {
    if (op.send) RETURN_IF_ERROR(SendNow(op.peer, op.tag, op.tensor, op.stream));
  }
  for (const Grouped& op : ops) {
    if (!op.send) RETURN_IF_ERROR(RecvNow(op.peer, op.tag, op.tensor, op.stream));
  }
  return absl::OkStatus();
}

absl::Status GroupingComm::CheckNotGrouped(const char* call) const {
  if (depth_ > 0)
    return FAILED_PRECONDITION() << "rank " << rank() << ": " << call << " between GroupStart and GroupEnd";
  return absl::OkStatus();
}

}  // namespace onnxpipe::comm
