// The zero-copy planned executor. Slots is the OutputAllocator over the plan's regions; the run
// loop feeds operands as views of their slots and checks that each output landed in its own.
#include "executor/runtime/arena_executor.h"

#include <cstring>

#include "frontend/ir/status.h"

namespace onnxpipe::runtime {
namespace {

using partitioner::MemoryRegion;

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

class Slots : public ir::OutputAllocator {
 public:
  Slots(const ir::Graph& g, const partitioner::MemoryPlan& plan, int64_t alignment)
      : g_(g), plan_(plan), alignment_(alignment) {
    arena_ = ir::Tensor::AllocateBuffer(plan.arena_bytes);
    // 0xFF bytes read as NaN in every float type: a value read before it is written shows.
    std::memset(arena_.get(), 0xFF, plan.arena_bytes);
    grads_ = ir::Tensor::AllocateBuffer(plan.gradient_bytes);
    params_ = ir::Tensor::AllocateBuffer(plan.parameter_bytes);
    opt_state_ = ir::Tensor::AllocateBuffer(plan.optimizer_state_bytes);
    workspace_ = ir::Tensor::AllocateBuffer(plan.workspace_bytes);
  }

  // The buffer holding value v's region, or null when v is not stored in one of the buffers this
  // executor owns (constants, absent values).
  const std::shared_ptr<uint8_t>* Buffer(ir::ValueId v) const {
    switch (plan_.values[v].region) {
      case MemoryRegion::kArena: return &arena_;
      case MemoryRegion::kGradients: return &grads_;
      case MemoryRegion::kParameters: return &params_;
      case MemoryRegion::kOptimizerState: return &opt_state_;
      default: return nullptr;
    }
  }
  const void* SlotAddress(ir::ValueId v) const {
    const std::shared_ptr<uint8_t>* b = Buffer(v);
    return b ? b->get() + plan_.values[v].offset : nullptr;
  }

  // A zeroed view of v's slot with `dims` (checked against the plan).
  absl::StatusOr<ir::Tensor> Slot(ir::ValueId v, ir::DType dtype, const std::vector<int64_t>& dims,
                                  const std::string& who) {
    const ir::Value& val = g_.value(v);
    const partitioner::ValueMemory& m = plan_.values[v];
    const std::shared_ptr<uint8_t>* b = Buffer(v);
    if (b == nullptr) {
      return FAILED_PRECONDITION() << who << " '" << val.name << "' has no planned slot (region "
                                   << partitioner::MemoryRegionName(m.region) << ")";
    }
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (dtype != val.dtype || n * ir::DTypeSize(dtype) != m.bytes) {
      return FAILED_PRECONDITION() << who << " '" << val.name << "' is " << ir::DTypeName(dtype)
                                   << DimsString(dims) << " but the memory plan has "
                                   << ir::DTypeName(val.dtype) << ir::ShapeToString(val.shape) << " ("
                                   << m.bytes << " bytes)";
    }
    if (m.region == MemoryRegion::kArena) {
      arena_high_water_ = std::max(arena_high_water_, m.offset + AlignUp(m.bytes, alignment_));
    }
    ir::Tensor t = ir::Tensor::View(dtype, dims, *b, m.offset);
    if (m.bytes > 0) std::memset(t.raw(), 0, m.bytes);
    return t;
  }

  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    RET_CHECK(index >= 0 && index < static_cast<int>(node.outputs.size()) &&
              node.outputs[index] != ir::kNoValue)
        << "node '" << node.name << "' asked for output " << index << ", which it does not have";
    const ir::ValueId v = node.outputs[index];
    const partitioner::ValueMemory& m = plan_.values[v];
    // A slot shared with another value is only written by the value owning it, or in place over
    // a state by its update.
    RET_CHECK(m.buffer == v || m.region == MemoryRegion::kParameters ||
              m.region == MemoryRegion::kOptimizerState)
        << "node '" << node.name << "' writes output '" << g_.value(v).name
        << "', which the plan makes a view of '" << g_.value(m.buffer).name << "'";
    return Slot(v, dtype, dims, "node '" + node.name + "' output");
  }

  bool SharesInputBuffer(const ir::Node& node, int index) const override {
    if (node.inputs.empty() || node.inputs[0] == ir::kNoValue) return false;
    const ir::ValueId v = node.outputs[index];
    return v != ir::kNoValue && plan_.values[v].buffer != v &&
           plan_.values[v].buffer == plan_.values[node.inputs[0]].buffer;
  }

  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    const int64_t aligned = AlignUp(bytes, alignment_);
    if (aligned > plan_.workspace_bytes) {
      return FAILED_PRECONDITION() << "node '" << node.name << "' (" << ir::OpName(node.op) << ") needs "
                                   << bytes << " bytes of workspace but the memory plan reserved "
                                   << plan_.workspace_bytes
                                   << " (plan with the backend's workspace function)";
    }
    workspace_high_water_ = std::max(workspace_high_water_, aligned);
    return static_cast<void*>(workspace_.get());
  }

  int64_t arena_high_water() const { return arena_high_water_; }
  int64_t workspace_high_water() const { return workspace_high_water_; }

 private:
  const ir::Graph& g_;
  const partitioner::MemoryPlan& plan_;
  const int64_t alignment_;
  std::shared_ptr<uint8_t> arena_, grads_, params_, opt_state_, workspace_;
  int64_t arena_high_water_ = 0, workspace_high_water_ = 0;
};

}  // namespace

absl::StatusOr<StepResult> InterpretPlanned(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                            const partitioner::MemoryPlan& plan,
                                            const ir::OpEvaluator& ev,
                                            const std::vector<ir::Tensor>& inputs,
                                            const InterpreterOptions& options, ArenaStats* stats,
                                            int64_t alignment) {
  RET_CHECK(static_cast<int32_t>(plan.values.size()) == g.num_values())
      << "the plan was made for another graph";
  if (inputs.size() != g.inputs().size()) {
    return INVALID_ARGUMENT() << "the model has " << g.inputs().size() << " inputs but "
                              << inputs.size() << " were given";
  }
  const int64_t allocations_before = ir::Tensor::num_allocations();
  Slots slots(g, plan, alignment);
  std::vector<ir::Tensor> values(g.num_values());

  std::map<std::string, int64_t> bindings;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::ValueId v = g.inputs()[i];
    RETURN_IF_ERROR(CheckInput(g, v, inputs[i], &bindings));
    ASSIGN_OR_RETURN(values[v], slots.Slot(v, inputs[i].dtype(), inputs[i].dims(), "input"));
    if (inputs[i].num_bytes() > 0) std::memcpy(values[v].raw(), inputs[i].raw(), inputs[i].num_bytes());
  }
  auto operand = [&](const ir::Node& n, size_t i) -> absl::StatusOr<ir::Tensor> {
    const ir::ValueId v = n.inputs[i];
    if (v == ir::kNoValue) return ir::Tensor();
    const ir::Value& val = g.value(v);
    if (val.constant) return *val.constant;
    const ir::Tensor& t = values[v];
    RET_CHECK(t.defined()) << "value '" << val.name << "' used by node '" << n.name
                           << "' was never computed";
    // The plan lets a shape-only operand's bytes be reused before this read: pass dims only.
    if (partitioner::IsShapeOnlyOperand(n, static_cast<int>(i))) {
      return ir::Tensor::DimsOnly(t.dtype(), t.dims());
    }
    return t;
  };
  std::vector<ir::Tensor> operands;
  for (ir::NodeId id : order) {
    const ir::Node& n = g.node(id);
    operands.clear();
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      ASSIGN_OR_RETURN(ir::Tensor t, operand(n, i));
      operands.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<ir::Tensor>> out = ev.EvaluateInto(n, operands, &slots);
    if (!out.ok()) {
      return Annotate(out.status(), "node '" + n.name + "' (" + std::string(ir::OpName(n.op)) + ")");
    }
    RET_CHECK(out->size() >= n.outputs.size()) << "kernel for " << ir::OpName(n.op)
                                               << " returned too few outputs";
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ir::ValueId v = n.outputs[k];
      if (v == ir::kNoValue) continue;
      ir::Tensor& t = (*out)[k];
      const ir::ValueId root = plan.values[v].buffer;
      // Where the plan puts v: its own slot, or (a view) wherever its buffer's owner lives.
      const void* want = slots.SlotAddress(v);
      if (want == nullptr && root != v && g.value(root).constant) want = g.value(root).constant->raw();
      if (t.num_bytes() > 0 && t.raw() != want) {
        return FAILED_PRECONDITION() << "node '" << n.name << "' (" << ir::OpName(n.op)
                                     << ") returned output '" << g.value(v).name
                                     << "' outside its planned slot (region "
                                     << partitioner::MemoryRegionName(plan.values[v].region)
                                     << "): its kernel must take outputs from AllocOutput/ViewOutput";
      }
      if (options.check_numerics && !AllFinite(t)) {
        return FAILED_PRECONDITION() << "node '" << n.name << "' (" << ir::OpName(n.op)
                                     << ") produced a non-finite value in output '"
                                     << g.value(v).name << "'";
      }
      values[v] = std::move(t);
    }
  }
  auto result_of = [&](ir::ValueId v) -> absl::StatusOr<ir::Tensor> {
    if (g.value(v).constant) return *g.value(v).constant;
    RET_CHECK(values[v].defined()) << "'" << g.value(v).name << "' was never computed";
    return values[v];
  };
  StepResult r;
  for (ir::ValueId v : g.outputs()) {
    ASSIGN_OR_RETURN(ir::Tensor t, result_of(v));
    r.outputs.push_back(std::move(t));
  }
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    ASSIGN_OR_RETURN(ir::Tensor t, result_of(u.new_value));
    r.state.push_back(std::move(t));
  }
  if (stats) {
    stats->arena_bytes = plan.arena_bytes;
    stats->gradient_bytes = plan.gradient_bytes;
    stats->state_bytes = plan.parameter_bytes + plan.optimizer_state_bytes;
    stats->arena_high_water = slots.arena_high_water();
    stats->workspace_bytes = plan.workspace_bytes;
    stats->workspace_high_water = slots.workspace_high_water();
    stats->off_plan_allocations = ir::Tensor::num_allocations() - allocations_before;
  }
  return r;
}

}  // namespace onnxpipe::runtime
