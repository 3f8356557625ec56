// The stage executor's allocator of the optimizer phase (executor.cc).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/pipeline/stage_arena.h"
#include "frontend/ir/align.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

// The optimizer phase's outputs: a state update's new value (parameter, momentum, Adam moments) is
// written over its state, whose storage the stage owns alone (Create makes it so); the update ops
// are elementwise and read each element before writing it, so this needs no second copy and is
// not zero-filled first. Everything else (the norm, the sum of a tied parameter's gradient
// contributions) is a buffer of its own, counted as the phase's scratch: allocated in the first
// step and kept in `kept` for the next ones (no allocation in the step loop).
class PostSlots : public ir::OutputAllocator {
 public:
  PostSlots(const ir::Graph& g, const std::vector<ir::Graph::StateUpdate>& updates, const backend::Backend& be,
            backend::Stream* stream, StageArena& scratch, std::map<ir::ValueId, ir::Tensor>& kept)
      : g_(g), backend_(be), stream_(stream), scratch_(scratch), kept_(kept) {
    for (const ir::Graph::StateUpdate& u : updates) state_of_[u.new_value] = u.state;
  }
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    const ir::ValueId v = node.outputs.at(index);
    if (auto it = state_of_.find(v); it != state_of_.end()) {
      const ir::Value& s = g_.value(it->second);
      if (!s.constant || s.constant->dtype() != dtype || s.constant->dims() != dims) {
        return absl::InternalError("node '" + node.name + "' updates '" + s.name + "' with another dtype or shape");
      }
      return *s.constant;
    }
    ir::Tensor& t = kept_[v];
    if (t.has_data() && t.dtype() == dtype && t.dims() == dims) {
      RETURN_IF_ERROR(backend_.Fill(t, 0, stream_));
    } else {
      ASSIGN_OR_RETURN(t, backend_.Zeros(dtype, dims, stream_));
    }
    scratch_bytes_ += ir::AlignUp(t.num_bytes());
    return t;
  }
  bool SharesInputBuffer(const ir::Node&, int) const override { return false; }
  // The optimizer's kernels take the stage's planned kernel scratch (PlanStageLayout counts them).
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    return scratch_.Workspace(node, bytes);
  }
  int64_t scratch_bytes() const { return scratch_bytes_; }
  void set_scratch_bytes(int64_t bytes) { scratch_bytes_ = bytes; }

 private:
  const ir::Graph& g_;
  const backend::Backend& backend_;
  backend::Stream* stream_;
  StageArena& scratch_;
  std::map<ir::ValueId, ir::Tensor>& kept_;
  std::map<ir::ValueId, ir::ValueId> state_of_;
  int64_t scratch_bytes_ = 0;
};

}  // namespace onnxpipe::pipeline
