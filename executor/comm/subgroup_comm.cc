#include "executor/comm/subgroup_comm.h"

#include <algorithm>

#include "frontend/ir/status.h"

namespace onnxpipe::comm {

SubgroupComm::SubgroupComm(Comm& base, std::vector<int> members) : base_(base), members_(std::move(members)) {
  const auto it = std::find(members_.begin(), members_.end(), base.rank());
  rank_ = it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

absl::StatusOr<int> SubgroupComm::Base(int rank, const char* verb) const {
  if (rank < 0 || rank >= size() || rank == rank_) {
    return INVALID_ARGUMENT() << "rank " << rank_ << " " << verb << " rank " << rank << " of a group of " << size();
  }
  return members_[rank];
}

absl::Status SubgroupComm::Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  ASSIGN_OR_RETURN(const int to, Base(dst, "sends to"));
  return base_.Send(to, tag, t, stream);
}

absl::Status SubgroupComm::Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  ASSIGN_OR_RETURN(const int from, Base(src, "receives from"));
  return base_.Recv(from, tag, into, stream);
}

absl::Status SubgroupComm::AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) {
  std::vector<int> mapped;
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      return INVALID_ARGUMENT() << "rank " << rank_ << ": all-reduce over rank " << r << " of a group of " << size();
    }
    mapped.push_back(members_[r]);
  }
  return base_.AllReduce(t, mapped, stream);
}

}  // namespace onnxpipe::comm
