// The state side of the pipeline executor (executor.h): the trained parameters, a stage's
// constants and the optimizer state as host snapshots, and SetState. Kept apart from the step
// driver (executor.cc).
#include <cstdio>
#include <cstdlib>

#include "executor/comm/inprocess_comm.h"
#include "executor/pipeline/executor.h"
#include "executor/pipeline/stage_executor.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {

ir::Tensor PipelineExecutor::HostCopy(const ir::Tensor& t) const {
  // Host memory is shared, not copied: while the caller holds it, the next Step gives the stage storage of its own
  // before updating it (copy on write), so a checkpoint or --save does not duplicate the state.
  if (t.on_host() && backend_->placement().host()) return t;
  // After the stages' work on it (a state set by SetState is cloned on its stage's stream).
  absl::Status synced = absl::OkStatus();
  for (const std::unique_ptr<StageExecutor>& stage : stages_)
    if (stage != nullptr && stage->stream() != nullptr && synced.ok()) synced = stage->stream()->Synchronize();
  absl::StatusOr<ir::Tensor> h = synced.ok() ? backend_->ToHost(t) : absl::StatusOr<ir::Tensor>(synced);
  if (!h.ok()) {  // the device failed: no state can be trusted any more
    std::fprintf(stderr, "onnxpipe: copying a state tensor to the host failed: %s\n",
                 std::string(h.status().message()).c_str());
    std::abort();
  }
  return *std::move(h);
}

std::map<std::string, ir::Tensor> PipelineExecutor::Parameters() const {
  std::map<std::string, ir::Tensor> out;
  for (const auto& [v, s] : program_.parameter_owner) {
    if (!is_local(s)) continue;
    const ir::Value& val = program_.stages[s].graph.value(v);
    if (val.constant) out[val.name] = HostCopy(*val.constant);
  }
  return out;
}

std::optional<ir::Tensor> PipelineExecutor::StageConstant(int32_t stage, const std::string& name) const {
  if (stage < 0 || stage >= program_.num_stages || !is_local(stage)) return std::nullopt;
  const ir::Graph& g = program_.stages[stage].graph;
  const ir::ValueId v = g.FindValue(name);
  if (v == ir::kNoValue || !g.value(v).constant) return std::nullopt;
  return HostCopy(*g.value(v).constant);
}

std::map<std::string, ir::Tensor> PipelineExecutor::State() const {
  std::map<std::string, ir::Tensor> out;
  for (const StageProgram& sp : program_.stages) {
    if (!is_local(sp.stage)) continue;
    for (const ir::Graph::StateUpdate& u : sp.state_updates) {
      const ir::Value& v = sp.graph.value(u.state);
      if (v.constant && !out.count(v.name)) out[v.name] = HostCopy(*v.constant);
    }
  }
  return out;
}

const ir::Value* PipelineExecutor::LocalValue(const std::string& name) const {
  for (const StageProgram& sp : program_.stages) {
    if (!is_local(sp.stage)) continue;
    if (const ir::ValueId v = sp.graph.FindValue(name); v != ir::kNoValue) return &sp.graph.value(v);
  }
  return nullptr;
}

std::map<std::string, ir::Tensor> PipelineExecutor::StateShapes() const { return facts_.state_shapes; }

absl::Status PipelineExecutor::SetState(const std::string& name, const ir::Tensor& value) {
  if (!facts_.state_shapes.count(name)) return NOT_FOUND() << "no stage updates a state named '" << name << "'";
  // A copy per holder (the optimizer phase updates each stage's states in place), set once all are made.
  std::vector<std::pair<ir::Value*, ir::Tensor>> copies;
  for (size_t s = 0; s < program_.stages.size(); ++s) {
    if (!is_local(static_cast<int32_t>(s))) continue;  // another process sets its own
    StageProgram& sp = program_.stages[s];
    const ir::ValueId v = sp.graph.FindValue(name);
    if (v == ir::kNoValue || !sp.graph.value(v).constant) continue;
    const ir::Tensor& held = *sp.graph.value(v).constant;
    if (value.dtype() != held.dtype() || value.dims() != held.dims()) {
      return INVALID_ARGUMENT() << "state '" << name << "' is " << comm::DescribeTensor(held) << " on stage "
                                << sp.stage << ", not " << comm::DescribeTensor(value);
    }
    ASSIGN_OR_RETURN(ir::Tensor c, backend_->Clone(value, stages_[s]->stream()));
    copies.emplace_back(&sp.graph.value(v), std::move(c));
  }
  for (auto& [holder, c] : copies) holder->constant = std::move(c);
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
