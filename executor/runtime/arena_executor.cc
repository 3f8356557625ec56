#include "executor/runtime/arena_executor.h"

#include <cstring>
#include <map>

#include "frontend/ir/status.h"

namespace onnxpipe::runtime {
namespace {

using partitioner::MemoryRegion;

int64_t AlignUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

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
  // 0xFF bytes read as NaN in every float type: a value read before it is written shows.
  std::vector<uint8_t> arena(plan.arena_bytes, 0xFF), grads(plan.gradient_bytes, 0xFF);
  ArenaStats local;
  local.arena_bytes = plan.arena_bytes;
  local.gradient_bytes = plan.gradient_bytes;
  std::map<ir::ValueId, ir::Tensor> written_state;  // new parameter / optimizer-state values

  auto slot = [&](ir::ValueId v) -> uint8_t* {
    const partitioner::ValueMemory& m = plan.values[v];
    if (m.region == MemoryRegion::kArena) return arena.data() + m.offset;
    if (m.region == MemoryRegion::kGradients) return grads.data() + m.offset;
    return nullptr;
  };
  auto store = [&](ir::ValueId v, const ir::Tensor& t) -> absl::Status {
    const partitioner::ValueMemory& m = plan.values[v];
    const ir::Value& val = g.value(v);
    if (m.region == MemoryRegion::kParameters || m.region == MemoryRegion::kOptimizerState) {
      written_state[v] = t;  // in place over the state in a real executor
      return absl::OkStatus();
    }
    uint8_t* dst = slot(v);
    if (dst == nullptr) {
      return FAILED_PRECONDITION() << "value '" << val.name << "' has no planned storage ("
                                   << static_cast<int>(m.region) << ")";
    }
    RET_CHECK(t.num_bytes() == m.bytes) << "value '" << val.name << "' has " << t.num_bytes()
                                        << " bytes but the plan has " << m.bytes;
    if (m.buffer != v) {
      // An alias writes no new bytes: its buffer must already hold exactly these.
      RET_CHECK(std::memcmp(dst, t.raw(), m.bytes) == 0)
          << "alias '" << val.name << "' differs from its buffer '" << g.value(m.buffer).name << "'";
    } else if (m.bytes > 0) {
      std::memcpy(dst, t.raw(), m.bytes);
    }
    if (m.region == MemoryRegion::kArena) {
      local.arena_high_water = std::max(local.arena_high_water, m.offset + AlignUp(m.bytes, alignment));
    }
    return absl::OkStatus();
  };
  auto load = [&](ir::ValueId v) -> absl::StatusOr<ir::Tensor> {
    const ir::Value& val = g.value(v);
    if (auto it = written_state.find(v); it != written_state.end()) return it->second;
    if (val.constant) return *val.constant;
    const uint8_t* src = slot(v);
    if (src == nullptr) {
      return FAILED_PRECONDITION() << "value '" << val.name << "' has no planned storage";
    }
    ir::Tensor t(val.dtype, ir::ToInts(val.shape));
    RET_CHECK(t.num_bytes() == plan.values[v].bytes);
    if (t.num_bytes() > 0) std::memcpy(t.raw(), src, t.num_bytes());
    return t;
  };

  std::map<std::string, int64_t> bindings;
  for (size_t i = 0; i < inputs.size(); ++i) {
    RETURN_IF_ERROR(CheckInput(g, g.inputs()[i], inputs[i], &bindings));
    RETURN_IF_ERROR(store(g.inputs()[i], inputs[i]));
  }
  std::vector<ir::Tensor> operands;
  for (ir::NodeId id : order) {
    const ir::Node& n = g.node(id);
    operands.clear();
    for (ir::ValueId v : n.inputs) {
      if (v == ir::kNoValue) {
        operands.emplace_back();
        continue;
      }
      ASSIGN_OR_RETURN(ir::Tensor t, load(v));
      operands.push_back(std::move(t));
    }
    absl::StatusOr<std::vector<ir::Tensor>> out = ev.Evaluate(n, operands);
    if (!out.ok()) {
      return Annotate(out.status(), "node '" + n.name + "' (" + std::string(ir::OpName(n.op)) + ")");
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ir::ValueId v = n.outputs[k];
      if (v == ir::kNoValue) continue;
      if (options.check_numerics && !AllFinite((*out)[k])) {
        return FAILED_PRECONDITION() << "node '" << n.name << "' (" << ir::OpName(n.op)
                                     << ") produced a non-finite value in output '"
                                     << g.value(v).name << "'";
      }
      RETURN_IF_ERROR(Annotate(store(v, (*out)[k]), "node '" + n.name + "'"));
    }
  }
  StepResult r;
  for (ir::ValueId v : g.outputs()) {
    ASSIGN_OR_RETURN(ir::Tensor t, load(v));
    r.outputs.push_back(std::move(t));
  }
  for (const ir::Graph::StateUpdate& u : g.state_updates()) {
    auto it = written_state.find(u.new_value);
    if (it == written_state.end()) {
      ASSIGN_OR_RETURN(ir::Tensor t, load(u.new_value));
      r.state.push_back(std::move(t));
    } else {
      r.state.push_back(it->second);
    }
  }
  if (stats) *stats = local;
  return r;
}

}  // namespace onnxpipe::runtime
