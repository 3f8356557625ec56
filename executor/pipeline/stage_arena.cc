#include "executor/pipeline/stage_arena.h"

#include <algorithm>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

using partitioner::MemoryRegion;

using ir::AlignUp;

// `bytes` of the backend's memory, every byte 0xFF (filled on `stream`).
absl::StatusOr<std::shared_ptr<uint8_t>> Filled(const backend::Backend& be, int64_t bytes, backend::Stream* stream) {
  ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> b, be.Allocate(bytes));
  if (bytes > 0) {
    RETURN_IF_ERROR(be.Fill(ir::Tensor::View(ir::DType::kU8, {bytes}, b, 0, be.placement()), 0xFF, stream));
  }
  return b;
}

}  // namespace

StageArena::StageArena(const StageLayout& layout, int32_t stage, const backend::Backend& be, backend::Stream* stream)
    : layout_(layout), stage_(stage), backend_(be), stream_(stream), slot_owner_(layout.in_flight, -1) {}

absl::StatusOr<std::unique_ptr<StageArena>> StageArena::Create(const StageLayout& layout, int32_t stage,
                                                               const backend::Backend& be, backend::Stream* stream) {
  std::unique_ptr<StageArena> a(new StageArena(layout, stage, be, stream));
  ASSIGN_OR_RETURN(a->saved_, Filled(be, layout.saved_region * layout.in_flight, stream));
  ASSIGN_OR_RETURN(a->transient_, Filled(be, layout.transient, stream));
  ASSIGN_OR_RETURN(a->accumulators_, Filled(be, layout.accumulators, stream));
  ASSIGN_OR_RETURN(a->workspace_, Filled(be, layout.workspace, stream));
  return a;
}

absl::Status StageArena::Acquire(int32_t m) {
  if (m >= static_cast<int32_t>(slot_of_.size())) slot_of_.resize(m + 1, -1);
  if (slot_of_[m] >= 0) return absl::OkStatus();
  auto free = std::find(slot_owner_.begin(), slot_owner_.end(), -1);
  if (free == slot_owner_.end()) {
    return FAILED_PRECONDITION() << "stage " << stage_ << ", micro-batch " << m << ": all " << layout_.in_flight
                                 << " saved-activation slots of the memory plan are taken (the schedule keeps more "
                                    "micro-batches in flight than planned)";
  }
  *free = m;
  slot_of_[m] = static_cast<int32_t>(free - slot_owner_.begin());
  return absl::OkStatus();
}

void StageArena::Release(int32_t m) {
  if (m < 0 || m >= static_cast<int32_t>(slot_of_.size()) || slot_of_[m] < 0) return;
  slot_owner_[slot_of_[m]] = -1;
  slot_of_[m] = -1;
}

uint8_t* StageArena::Address(ir::ValueId v, int32_t m) const {
  const partitioner::ValueMemory& vm = layout_.plan(m).values[v];
  switch (vm.region) {
    case MemoryRegion::kArena:
      if (vm.offset < layout_.saved_region) {
        if (m < 0 || m >= static_cast<int32_t>(slot_of_.size()) || slot_of_[m] < 0) return nullptr;
        return saved_.get() + slot_of_[m] * layout_.saved_region + vm.offset;
      }
      return transient_.get() + (vm.offset - layout_.saved_region);
    case MemoryRegion::kGradients: return accumulators_.get() + vm.offset;
    default: return nullptr;
  }
}

absl::StatusOr<ir::Tensor> StageArena::Slot(ir::ValueId v, int32_t m, ir::DType dtype,
                                            const std::vector<int64_t>& dims, const std::string& who, bool zero) {
  const ir::Value& val = layout_.graph.value(v);
  const partitioner::ValueMemory& vm = layout_.plan(m).values[v];
  uint8_t* at = Address(v, m);
  if (at == nullptr) {
    return FAILED_PRECONDITION() << "stage " << stage_ << ", micro-batch " << m << ": " << who << " '" << val.name
                                 << "' has no planned slot (region " << partitioner::MemoryRegionName(vm.region) << ")";
  }
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (dtype != val.dtype || n * ir::DTypeSize(dtype) != vm.bytes) {
    return FAILED_PRECONDITION() << "stage " << stage_ << ", micro-batch " << m << ": " << who << " '" << val.name
                                 << "' is " << ir::DTypeName(dtype) << " with " << n << " elements but the memory plan has "
                                 << ir::DTypeName(val.dtype) << ir::ShapeToString(val.shape) << " (" << vm.bytes
                                 << " bytes)";
  }
  const int64_t top = vm.offset + AlignUp(vm.bytes);
  if (vm.region == MemoryRegion::kGradients) {
    stats_.accumulator_high_water = std::max(stats_.accumulator_high_water, top);
  } else if (vm.offset < layout_.saved_region) {
    stats_.slots_high_water = std::max(stats_.slots_high_water, slot_of_[m] * layout_.saved_region + top);
  } else {
    stats_.transient_high_water = std::max(stats_.transient_high_water, top - layout_.saved_region);
  }
  const std::shared_ptr<uint8_t>& buffer =
      vm.region == MemoryRegion::kGradients ? accumulators_ : vm.offset < layout_.saved_region ? saved_ : transient_;
  ir::Tensor t = ir::Tensor::View(dtype, dims, buffer, at - buffer.get(), backend_.placement());
  if (zero && vm.bytes > 0) RETURN_IF_ERROR(backend_.Fill(t, 0, stream_));
  return t;
}

ir::Tensor StageArena::Accumulator(ir::ValueId v) const {
  const ir::Value& val = layout_.graph.value(v);
  std::vector<int64_t> dims;
  for (const ir::Dim& d : val.shape) dims.push_back(d.value());
  return ir::Tensor::View(val.dtype, dims, accumulators_, layout_.accumulator_offset.at(v), backend_.placement());
}

absl::StatusOr<ir::Tensor> StageArena::Allocate(const ir::Node& node, int index, ir::DType dtype,
                                                const std::vector<int64_t>& dims) {
  return Output(node, index, dtype, dims, /*zero=*/true);
}

absl::StatusOr<ir::Tensor> StageArena::AllocateUninitialized(const ir::Node& node, int index, ir::DType dtype,
                                                             const std::vector<int64_t>& dims) {
  return Output(node, index, dtype, dims, /*zero=*/false);
}

absl::StatusOr<ir::Tensor> StageArena::Output(const ir::Node& node, int index, ir::DType dtype,
                                              const std::vector<int64_t>& dims, bool zero) {
  RET_CHECK(index >= 0 && index < static_cast<int>(node.outputs.size()) && node.outputs[index] != ir::kNoValue)
      << "node '" << node.name << "' asked for output " << index << ", which it does not have";
  const ir::ValueId v = node.outputs[index];
  const partitioner::ValueMemory& vm = layout_.plan(selected_).values[v];
  RET_CHECK(vm.buffer == v) << "node '" << node.name << "' writes output '" << layout_.graph.value(v).name
                            << "', which the plan makes a view of '" << layout_.graph.value(vm.buffer).name << "'";
  return Slot(v, selected_, dtype, dims, "node '" + node.name + "' output", zero);
}

bool StageArena::SharesInputBuffer(const ir::Node& node, int index) const {
  if (node.inputs.empty() || node.inputs[0] == ir::kNoValue) return false;
  const ir::ValueId v = node.outputs[index];
  const partitioner::MemoryPlan& plan = layout_.plan(selected_);
  return v != ir::kNoValue && plan.values[v].buffer != v && plan.values[v].buffer == plan.values[node.inputs[0]].buffer;
}

absl::StatusOr<void*> StageArena::Workspace(const ir::Node& node, int64_t bytes) {
  const int64_t aligned = AlignUp(bytes);
  if (aligned > layout_.workspace) {
    return FAILED_PRECONDITION() << "stage " << stage_ << ": node '" << node.name << "' (" << ir::OpName(node.op)
                                 << ") needs " << bytes << " bytes of workspace but the memory plan reserved "
                                 << layout_.workspace;
  }
  stats_.workspace_high_water = std::max(stats_.workspace_high_water, aligned);
  return static_cast<void*>(workspace_.get());
}

void StageArena::MergeStats(const StageArenaStats& seen) {
  stats_.slots_high_water = std::max(stats_.slots_high_water, seen.slots_high_water);
  stats_.transient_high_water = std::max(stats_.transient_high_water, seen.transient_high_water);
  stats_.accumulator_high_water = std::max(stats_.accumulator_high_water, seen.accumulator_high_water);
  stats_.workspace_high_water = std::max(stats_.workspace_high_water, seen.workspace_high_water);
}

}  // namespace onnxpipe::pipeline
