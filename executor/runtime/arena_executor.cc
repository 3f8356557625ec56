// The zero-copy planned executor. Slots is one run's OutputAllocator over the runner's buffers; the
// run loop feeds operands as views of their slots and checks that each output landed in its own.
#include "executor/runtime/arena_executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::runtime {
namespace {

using partitioner::MemoryRegion;

using ir::AlignUp;

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

class PlannedRunner::Slots : public ir::OutputAllocator {
 public:
  Slots(const ir::Graph& g, const PlannedRunner& r) : g_(g), r_(r), plan_(r.plan_) {}

  // The buffer holding value v's region, or null when v is not stored in one of the runner's
  // buffers (constants, absent values).
  const std::shared_ptr<uint8_t>* Buffer(ir::ValueId v) const {
    switch (plan_.values[v].region) {
      case MemoryRegion::kArena: return &r_.arena_.back();
      case MemoryRegion::kGradients: return &r_.grads_.back();
      case MemoryRegion::kParameters: return &r_.params_.back();
      case MemoryRegion::kOptimizerState: return &r_.opt_state_.back();
      default: return nullptr;
    }
  }
  const void* SlotAddress(ir::ValueId v) const {
    const std::shared_ptr<uint8_t>* b = Buffer(v);
    return b ? b->get() + plan_.values[v].offset : nullptr;
  }

  // A view of v's slot with `dims` (checked against the plan), zero-filled when `zero`. `node`
  // names the writer in errors (null: a graph input).
  absl::StatusOr<ir::Tensor> Slot(ir::ValueId v, ir::DType dtype, const std::vector<int64_t>& dims,
                                  const ir::Node* node, bool zero) {
    const ir::Value& val = g_.value(v);
    const partitioner::ValueMemory& m = plan_.values[v];
    const std::shared_ptr<uint8_t>* b = Buffer(v);
    auto who = [&] { return node ? "node '" + node->name + "' output" : std::string("input"); };
    if (b == nullptr) {
      return FAILED_PRECONDITION() << who() << " '" << val.name << "' has no planned slot (region "
                                   << partitioner::MemoryRegionName(m.region) << ")";
    }
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    if (dtype != val.dtype || n * ir::DTypeSize(dtype) != m.bytes) {
      return FAILED_PRECONDITION() << who() << " '" << val.name << "' is " << ir::DTypeName(dtype)
                                   << DimsString(dims) << " but the memory plan has "
                                   << ir::DTypeName(val.dtype) << ir::ShapeToString(val.shape) << " ("
                                   << m.bytes << " bytes)";
    }
    if (m.region == MemoryRegion::kArena) {
      arena_high_water_ = std::max(arena_high_water_, m.offset + AlignUp(m.bytes, r_.alignment_));
    }
    ir::Tensor t = ir::Tensor::View(dtype, dims, *b, m.offset);
    if (zero && m.bytes > 0) std::memset(t.raw(), 0, m.bytes);
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
    return Slot(v, dtype, dims, &node, /*zero=*/true);
  }

  bool SharesInputBuffer(const ir::Node& node, int index) const override {
    if (node.inputs.empty() || node.inputs[0] == ir::kNoValue) return false;
    const ir::ValueId v = node.outputs[index];
    return v != ir::kNoValue && plan_.values[v].buffer != v &&
           plan_.values[v].buffer == plan_.values[node.inputs[0]].buffer;
  }

  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    const int64_t aligned = AlignUp(bytes, r_.alignment_);
    if (aligned > plan_.workspace_bytes) {
      return FAILED_PRECONDITION() << "node '" << node.name << "' (" << ir::OpName(node.op) << ") needs "
                                   << bytes << " bytes of workspace but the memory plan reserved "
                                   << plan_.workspace_bytes
                                   << " (plan with the backend's workspace function)";
    }
    workspace_high_water_ = std::max(workspace_high_water_, aligned);
    return static_cast<void*>(r_.workspace_.get());
  }

  int64_t arena_high_water() const { return arena_high_water_; }
  int64_t workspace_high_water() const { return workspace_high_water_; }

 private:
  const ir::Graph& g_;
  const PlannedRunner& r_;
  const partitioner::MemoryPlan& plan_;
  int64_t arena_high_water_ = 0, workspace_high_water_ = 0;
};

PlannedRunner::PlannedRunner(std::vector<ir::NodeId> order, partitioner::MemoryPlan plan,
                             int64_t alignment)
    : order_(std::move(order)), plan_(std::move(plan)), alignment_(alignment) {
  workspace_ = Allocate(plan_.workspace_bytes, /*nan_fill=*/false);
}

std::shared_ptr<uint8_t> PlannedRunner::Allocate(int64_t bytes, bool nan_fill) {
  ++buffer_allocations_;
  std::shared_ptr<uint8_t> b = ir::Tensor::AllocateBuffer(bytes);
  // 0xFF bytes read as NaN in every float type: a value read before it is written shows.
  if (nan_fill && bytes > 0) std::memset(b.get(), 0xFF, bytes);
  return b;
}

void PlannedRunner::Claim(Pool& pool, int64_t bytes, bool nan_fill) {
  // A use count of 1 is the pool's own reference: no view is left, and none can appear meanwhile.
  auto free = std::find_if(pool.begin(), pool.end(),
                           [](const std::shared_ptr<uint8_t>& b) { return b.use_count() == 1; });
  if (free != pool.end()) {
    std::rotate(free, free + 1, pool.end());
    return;
  }
  constexpr size_t kPooled = 2;  // the state applied to the graph, and the next one
  if (pool.size() == kPooled) pool.erase(pool.begin());
  pool.push_back(Allocate(bytes, nan_fill));
}

absl::StatusOr<StepResult> PlannedRunner::Run(const ir::Graph& g, const ir::OpEvaluator& ev,
                                              const std::vector<ir::Tensor>& inputs,
                                              const InterpreterOptions& options, ArenaStats* stats) {
  RET_CHECK(static_cast<int32_t>(plan_.values.size()) == g.num_values())
      << "the plan was made for another graph";
  if (inputs.size() != g.inputs().size()) {
    return INVALID_ARGUMENT() << "the model has " << g.inputs().size() << " inputs but "
                              << inputs.size() << " were given";
  }
  const int64_t allocations_before = ir::Tensor::num_allocations();
  Claim(arena_, plan_.arena_bytes, /*nan_fill=*/true);
  Claim(grads_, plan_.gradient_bytes, /*nan_fill=*/false);
  Claim(params_, plan_.parameter_bytes, /*nan_fill=*/false);
  Claim(opt_state_, plan_.optimizer_state_bytes, /*nan_fill=*/false);
  Slots slots(g, *this);
  std::vector<ir::Tensor> values(g.num_values());

  std::map<std::string, int64_t> bindings;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::ValueId v = g.inputs()[i];
    RETURN_IF_ERROR(CheckInput(g, v, inputs[i], &bindings));
    ASSIGN_OR_RETURN(values[v], slots.Slot(v, inputs[i].dtype(), inputs[i].dims(), /*node=*/nullptr,
                                           /*zero=*/false));
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
  for (ir::NodeId id : order_) {
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
      const ir::ValueId root = plan_.values[v].buffer;
      // Where the plan puts v: its own slot, or (a view) wherever its buffer's owner lives.
      const void* want = slots.SlotAddress(v);
      if (want == nullptr && root != v && g.value(root).constant) want = g.value(root).constant->raw();
      if (t.num_bytes() > 0 && t.raw() != want) {
        return FAILED_PRECONDITION() << "node '" << n.name << "' (" << ir::OpName(n.op)
                                     << ") returned output '" << g.value(v).name
                                     << "' outside its planned slot (region "
                                     << partitioner::MemoryRegionName(plan_.values[v].region)
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
    stats->arena_bytes = plan_.arena_bytes;
    stats->gradient_bytes = plan_.gradient_bytes;
    stats->state_bytes = plan_.parameter_bytes + plan_.optimizer_state_bytes;
    stats->arena_high_water = slots.arena_high_water();
    stats->workspace_bytes = plan_.workspace_bytes;
    stats->workspace_high_water = slots.workspace_high_water();
    stats->off_plan_allocations = ir::Tensor::num_allocations() - allocations_before;
  }
  return r;
}

absl::StatusOr<StepResult> InterpretPlanned(const ir::Graph& g, const std::vector<ir::NodeId>& order,
                                            const partitioner::MemoryPlan& plan,
                                            const ir::OpEvaluator& ev,
                                            const std::vector<ir::Tensor>& inputs,
                                            const InterpreterOptions& options, ArenaStats* stats,
                                            int64_t alignment) {
  PlannedRunner runner(order, plan, alignment);
  return runner.Run(g, ev, inputs, options, stats);
}

}  // namespace onnxpipe::runtime
