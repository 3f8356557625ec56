// A planned executor's allocator for the CUDA kernel tests: outputs from the backend, a workspace of
// exactly `reserved` bytes (asking for more is the error a real plan gives), views when `share` is
// set. Memory a kernel must write before reading is poisoned with 0xFF bytes (NaN in every float
// dtype): the workspace, unzeroed outputs (AllocateUninitialized), and with `poison_outputs` every
// output, so an element the kernel forgets shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "executor/backend/backend.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda::testing {

class PlannedOutputs : public ir::OutputAllocator {
 public:
  PlannedOutputs(const backend::Backend& be, int64_t reserved, bool share = false, bool poison_outputs = false)
      : be_(be), reserved_(reserved), share_(share), poison_outputs_(poison_outputs) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node&, int, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    return Poisoned(dtype, dims, poison_outputs_);
  }
  absl::StatusOr<ir::Tensor> AllocateUninitialized(const ir::Node&, int, ir::DType dtype,
                                                   const std::vector<int64_t>& dims) override {
    return Poisoned(dtype, dims, true);
  }
  bool SharesInputBuffer(const ir::Node&, int) const override { return share_; }
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    if (bytes > reserved_) {
      return FAILED_PRECONDITION() << ir::OpName(node.op) << " asked for " << bytes << " bytes of workspace, "
                                   << reserved_ << " reserved";
    }
    if (buffer_ == nullptr) {
      ASSIGN_OR_RETURN(buffer_, be_.Allocate(std::max<int64_t>(reserved_, 1)));
      RETURN_IF_ERROR(be_.Fill(ir::Tensor::View(ir::DType::kU8, {reserved_}, buffer_, 0, be_.placement()), 0xff));
    }
    return buffer_.get();
  }

 private:
  absl::StatusOr<ir::Tensor> Poisoned(ir::DType dtype, const std::vector<int64_t>& dims, bool poison) const {
    ASSIGN_OR_RETURN(ir::Tensor t, be_.Zeros(dtype, dims));
    if (poison && t.num_bytes() > 0) RETURN_IF_ERROR(be_.Fill(t, 0xff));
    return t;
  }

  const backend::Backend& be_;
  const int64_t reserved_;
  const bool share_, poison_outputs_;
  std::shared_ptr<uint8_t> buffer_;
};

}  // namespace onnxpipe::cuda::testing
