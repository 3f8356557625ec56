// Dispatch: arity and presence checks common to every op, then the registered kernel. Kernels can
// rely on inputs[i].defined() for i < the op's min_inputs.
#include "executor/cpu/cpu_evaluator.h"

#include "executor/cpu/kernel_util.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cpu {

absl::StatusOr<std::vector<ir::Tensor>> CpuEvaluator::Evaluate(
    const ir::Node& node, const std::vector<ir::Tensor>& inputs) const {
  return Evaluate(node, inputs, ctx_);
}

absl::StatusOr<std::vector<ir::Tensor>> CpuEvaluator::EvaluateInto(
    const ir::Node& node, const std::vector<ir::Tensor>& inputs, ir::OutputAllocator* outputs) const {
  EvalContext ctx = ctx_;
  ctx.outputs = outputs;
  return Evaluate(node, inputs, ctx);
}

absl::StatusOr<std::vector<ir::Tensor>> CpuEvaluator::Evaluate(const ir::Node& node,
                                                               const std::vector<ir::Tensor>& inputs,
                                                               const EvalContext& ctx) const {
  const ir::OpInfo& info = ir::GetOpInfo(node.op);
  CpuKernelFn fn = FindCpuKernel(node.op);
  if (fn == nullptr) {
    return UNIMPLEMENTED() << Describe(node) << ": the CPU backend has no kernel for op "
                           << info.name;
  }
  const int n_in = static_cast<int>(inputs.size());
  if (n_in < info.min_inputs || n_in > info.max_inputs) {
    return INVALID_ARGUMENT() << Describe(node) << ": got " << n_in << " inputs, expected "
                              << info.min_inputs << ".." << info.max_inputs;
  }
  for (int i = 0; i < info.min_inputs; ++i) {
    if (!inputs[i].defined()) {
      return INVALID_ARGUMENT() << Describe(node) << ": required input " << i << " is missing";
    }
  }
  const size_t n_out = node.outputs.size();
  if (static_cast<int>(n_out) < info.min_outputs || static_cast<int>(n_out) > info.max_outputs) {
    return INVALID_ARGUMENT() << Describe(node) << ": has " << n_out << " outputs, expected "
                              << info.min_outputs << ".." << info.max_outputs;
  }
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> outs, fn(node, inputs, ctx));
  // Kernels may compute optional outputs the node does not have (LayerNorm's Mean, ...).
  outs.resize(n_out);
  return outs;
}

}  // namespace onnxpipe::cpu
