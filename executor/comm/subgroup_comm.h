// A view of a communicator over some of its ranks, renumbered (what ncclCommSplit gives): rank i of
// the view is rank members[i] of the base. A pipeline replica's stages talk through such a view of
// the world (stage s = the world rank of stage s in this replica), so the stage executor addresses
// its neighbours by stage index whatever the data-parallel layout. Abort aborts the base: a failure
// anywhere stops the whole world.
#pragma once

#include <vector>

#include "executor/comm/comm.h"

namespace onnxpipe::comm {

class SubgroupComm : public Comm {
 public:
  // `base` must outlive the view and be a member of `members` (distinct base ranks).
  SubgroupComm(Comm& base, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  absl::Status Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) override;
  absl::Status Recv(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) override;
  absl::Status GroupStart() override { return base_.GroupStart(); }
  absl::Status GroupEnd() override { return base_.GroupEnd(); }
  absl::Status Flush() override { return base_.Flush(); }
  absl::Status AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) override;
  void Abort(const absl::Status& reason) override { base_.Abort(reason); }
  absl::Status abort_status() const override { return base_.abort_status(); }
  int64_t bytes_sent() const override { return base_.bytes_sent(); }
  int64_t bytes_received() const override { return base_.bytes_received(); }

 private:
  absl::StatusOr<int> Base(int rank, const char* verb) const;
  Comm& base_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace onnxpipe::comm
