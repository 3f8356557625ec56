// The buffers of one pipeline stage, allocated once from its StageLayout (memory.h) and reused by
// every step: one saved slot per micro-batch in flight, the transient region all micro-batches
// share, the gradient accumulators and the kernels' workspace. As the ir::OutputAllocator of the
// stage's kernels it hands out the planned slot of each output of the selected micro-batch, and it
// measures what it hands out, so a run reports the high-water of exactly the planned bytes.
//
// The buffers come from the stage's backend (device memory on a device backend); the arena only
// computes addresses in them and never touches their bytes itself (fills go through the backend).
//
// A micro-batch takes the lowest free saved slot when its first value arrives (Acquire) and gives
// it back after its backward (Release); taking more slots than the layout's in-flight bound is an
// error (the schedule keeps more micro-batches in flight than the plan). A layout without a split
// (one micro-batch in flight) has empty slots: every value is in the transient region. Slots are zero-filled when
// handed out to a kernel (AllocOutput's contract); the buffers start as 0xFF bytes (NaN in every
// float type), so a value read before it is written shows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/pipeline/memory.h"
#include "frontend/ir/evaluator.h"

namespace onnxpipe::pipeline {

struct StageArenaStats {
  int64_t slots_high_water = 0;  // over the saved slots: slot index x slot size + highest byte in it
  int64_t transient_high_water = 0;
  int64_t accumulator_high_water = 0;
  int64_t workspace_high_water = 0;
  int64_t arena_high_water() const { return slots_high_water + transient_high_water; }
};

class StageArena : public ir::OutputAllocator {
 public:
  // Fills (the initial poison, zeroed slots) are issued on `stream`, the stage's, in order with its
  // kernels.
  static absl::StatusOr<std::unique_ptr<StageArena>> Create(const StageLayout& layout, int32_t stage,
                                                            const backend::Backend& be,
                                                            backend::Stream* stream);

  absl::Status Acquire(int32_t microbatch);
  void Release(int32_t microbatch);
  // The micro-batch whose outputs Allocate hands out.
  void Select(int32_t microbatch) { selected_ = microbatch; }

  // Where value v of micro-batch m lives, or null when it is not stored in a stage buffer
  // (constants, values of another stage, values the plan gives no storage).
  uint8_t* Address(ir::ValueId v, int32_t m) const;
  // A view of v's slot for micro-batch m, checked against the plan; zero-filled when `zero`.
  absl::StatusOr<ir::Tensor> Slot(ir::ValueId v, int32_t m, ir::DType dtype, const std::vector<int64_t>& dims,
                                  const std::string& who, bool zero);
  // The accumulator of an accumulated value (a view of its persistent slot).
  ir::Tensor Accumulator(ir::ValueId v) const;

  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override;
  absl::StatusOr<ir::Tensor> AllocateUninitialized(const ir::Node& node, int index, ir::DType dtype,
                                                   const std::vector<int64_t>& dims) override;
  bool SharesInputBuffer(const ir::Node& node, int index) const override;
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override;

  const StageLayout& layout() const { return layout_; }
  const StageArenaStats& stats() const { return stats_; }
  void ResetStats() { stats_ = StageArenaStats(); }
  // Raises the high-water marks to `seen`'s (work replayed from a graph allocates nothing here).
  void MergeStats(const StageArenaStats& seen);

 private:
  StageArena(const StageLayout& layout, int32_t stage, const backend::Backend& be, backend::Stream* stream);
  absl::StatusOr<ir::Tensor> Output(const ir::Node& node, int index, ir::DType dtype, const std::vector<int64_t>& dims,
                                    bool zero);

  const StageLayout& layout_;
  const int32_t stage_;
  const backend::Backend& backend_;
  backend::Stream* stream_;
  std::shared_ptr<uint8_t> saved_, transient_, accumulators_, workspace_;
  std::vector<int32_t> slot_owner_;  // micro-batch holding each saved slot, -1 when free
  std::vector<int32_t> slot_of_;     // saved slot of each micro-batch, -1 when none
  int32_t selected_ = -1;
  StageArenaStats stats_;
};

}  // namespace onnxpipe::pipeline
