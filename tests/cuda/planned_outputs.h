// Graph-level helpers of the CUDA backend tests. A planned executor's allocator for the CUDA kernel tests: outputs from
// the backend, a workspace of exactly `reserved` bytes (asking for more is the error a real plan gives), views when
// `share` is set. Memory a kernel must write before reading is poisoned with 0xFF bytes (NaN in every float dtype): the
// workspace, unzeroed outputs (AllocateUninitialized), and with `poison_outputs` every output, so an element the kernel
// forgets shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "frontend/ir/graph.h"
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

// Adds `op` to `g` on fresh values typed as `inputs` (undefined inputs become absent ones), with
// `num_outputs` outputs of inputs[1]'s dtype and unknown shape, absent at the indices in `absent`.
// same_as (empty or one entry per input): input i reads the value of input same_as[i] <= i (the
// packed operands of an attention node reading one value through views).
inline const ir::Node& AddTypedNode(ir::Graph& g, ir::OpKind op, const std::string& name,
                                    const std::vector<ir::Tensor>& inputs, const ir::Attrs& attrs, int num_outputs,
                                    const std::vector<int>& absent = {}, const std::vector<int>& same_as = {}) {
  std::vector<ir::ValueId> in_ids, out_ids;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!same_as.empty() && same_as[i] != static_cast<int>(i)) {
      in_ids.push_back(in_ids[same_as[i]]);
      continue;
    }
    if (!inputs[i].defined()) {
      in_ids.push_back(ir::kNoValue);
      continue;
    }
    const ir::Tensor& t = inputs[i];
    in_ids.push_back(g.AddValue("in" + std::to_string(i), t.dtype(), ir::Shape(t.dims().begin(), t.dims().end())));
  }
  for (int k = 0; k < num_outputs; ++k) {
    const bool gone = std::find(absent.begin(), absent.end(), k) != absent.end();
    out_ids.push_back(gone ? ir::kNoValue
                           : g.AddValue("out" + std::to_string(k), inputs[1].dtype(), {}, /*shape_known=*/false));
  }
  return g.node(g.AddNode(op, name, in_ids, out_ids, attrs));
}

}  // namespace onnxpipe::cuda::testing
