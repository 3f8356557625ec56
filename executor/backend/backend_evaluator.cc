#include "executor/backend/backend_evaluator.h"

#include "frontend/ir/status.h"

namespace onnxpipe::backend {

absl::StatusOr<std::vector<ir::Tensor>> BackendEvaluator::Evaluate(const ir::Node& node,
                                                                   const std::vector<ir::Tensor>& inputs) const {
  std::vector<ir::Tensor> on_device;
  on_device.reserve(inputs.size());
  for (const ir::Tensor& t : inputs) {
    ASSIGN_OR_RETURN(ir::Tensor d, backend_->Upload(t, ctx_.stream));
    on_device.push_back(std::move(d));
  }
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> out, backend_->Run(node, on_device, ctx_, nullptr));
  for (ir::Tensor& t : out) {
    if (!t.has_data() || t.on_host()) continue;
    ASSIGN_OR_RETURN(t, backend_->ToHost(t, ctx_.stream));
  }
  return out;
}

}  // namespace onnxpipe::backend
