#include "executor/backend/backend_evaluator.h"

#include "frontend/ir/status.h"

namespace onnxpipe::backend {

absl::StatusOr<std::unique_ptr<BackendEvaluator>> BackendEvaluator::Resident(std::shared_ptr<const Backend> backend,
                                                                             const ir::Graph& g, ExecContext ctx) {
  auto ev = std::make_unique<BackendEvaluator>(std::move(backend), ctx);
  ev->resident_ = true;
  ev->host_values_.insert(g.outputs().begin(), g.outputs().end());
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.num_values()); ++v) {
    const std::optional<ir::Tensor>& c = g.value(v).constant;
    if (!c || !c->has_data() || !c->on_host() || ev->constants_.count(c->raw())) continue;
    ASSIGN_OR_RETURN(ir::Tensor d, ev->backend_->Upload(*c, ctx.stream));
    ev->constants_.emplace(c->raw(), std::move(d));
  }
  return ev;
}

absl::StatusOr<ir::Tensor> BackendEvaluator::OnBackend(const ir::Tensor& t) const {
  if (!t.has_data() || !t.on_host()) return t;
  if (auto it = constants_.find(t.raw());
      it != constants_.end() && it->second.dtype() == t.dtype() && it->second.dims() == t.dims()) {
    return it->second;
  }
  return backend_->Upload(t, ctx_.stream);
}

absl::StatusOr<std::vector<ir::Tensor>> BackendEvaluator::Evaluate(const ir::Node& node,
                                                                   const std::vector<ir::Tensor>& inputs) const {
  std::vector<ir::Tensor> on_device;
  on_device.reserve(inputs.size());
  for (const ir::Tensor& t : inputs) {
    ASSIGN_OR_RETURN(ir::Tensor d, OnBackend(t));
    on_device.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> out, backend_->Run(node, on_device, ctx_, nullptr));
  for (size_t i = 0; i < out.size(); ++i) {
    ir::Tensor& t = out[i];
    if (!t.has_data() || t.on_host()) continue;
    if (resident_ && (i >= node.outputs.size() || !host_values_.count(node.outputs[i]))) continue;
    ASSIGN_OR_RETURN(t, backend_->ToHost(t, ctx_.stream));
  }
  return out;
}

}  // namespace onnxpipe::backend
