// Dispatch: arity and presence checks common to every op, then the registered kernel. Kernels can
// rely on inputs[i].defined() for i < the op's min_inputs.
//
// Half precision: the kernels compute in f32/f64. A node reading bf16/f16 activations whose kernel
// only moves or converts elements (HalfNative) runs as it is; any other is evaluated through f32
// copies of its half inputs, and each float output the kernel makes in f32 is rounded to the half
// type (except those ir::KeepsF32Output names: normalisation statistics stay f32). That is the
// arithmetic of the GPU kernels (f32 inside, half in memory), one mechanism for every op. The f32
// copies are scratch outside the memory plan (the plan holds the half values).
#include "executor/cpu/cpu_evaluator.h"

#include <optional>

#include "executor/cpu/half.h"
#include "executor/cpu/kernel_util.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cpu {
namespace {

// Kernels that take every dtype as raw elements of its size (data movement, masks, zeros) or
// convert it (Cast): they read and write half-precision tensors directly.
bool HalfNative(ir::OpKind op) {
  switch (op) {
    case ir::OpKind::kGather:
    case ir::OpKind::kTranspose:
    case ir::OpKind::kReshape:
    case ir::OpKind::kFlatten:
    case ir::OpKind::kSqueeze:
    case ir::OpKind::kUnsqueeze:
    case ir::OpKind::kConcat:
    case ir::OpKind::kSplit:
    case ir::OpKind::kSlice:
    case ir::OpKind::kShape:
    case ir::OpKind::kConstant:
    case ir::OpKind::kConstantOfShape:
    case ir::OpKind::kCast:
    case ir::OpKind::kWhere:
    case ir::OpKind::kExpand:
    case ir::OpKind::kIdentity:
    case ir::OpKind::kTrilu:
    case ir::OpKind::kGatherElements:
    case ir::OpKind::kGatherND:
    case ir::OpKind::kReshapeLike:
    case ir::OpKind::kZerosLike:
    case ir::OpKind::kSliceGrad:
    case ir::OpKind::kConcatGrad:
      return true;
    default:
      return false;
  }
}

// Whether the kernel's output `index` of `dtype` is an f32 stand-in for a half output.
bool RoundsToHalf(const ir::Node& node, int index, ir::DType dtype) {
  return dtype == ir::DType::kF32 && !ir::KeepsF32Output(node, index);
}

// What a kernel computing a half node in f32 allocates through under a planned executor: the
// outputs that RoundsToHalf are fresh f32 tensors; the others (f32 statistics, a Dropout mask) and
// the workspace are the executor's.
class F32Outputs : public ir::OutputAllocator {
 public:
  explicit F32Outputs(ir::OutputAllocator* planned) : planned_(planned) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    if (RoundsToHalf(node, index, dtype)) return ir::Tensor(dtype, dims);
    return planned_->Allocate(node, index, dtype, dims);
  }
  bool SharesInputBuffer(const ir::Node&, int) const override { return false; }
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    return planned_->Workspace(node, bytes);
  }

 private:
  ir::OutputAllocator* planned_;
};

absl::StatusOr<std::vector<ir::Tensor>> EvaluateInF32(CpuKernelFn fn, const ir::Node& node,
                                                      const std::vector<ir::Tensor>& inputs, ir::DType half,
                                                      const EvalContext& ctx) {
  std::vector<ir::Tensor> wide = inputs;
  for (ir::Tensor& t : wide) {
    if (!t.defined() || !ir::IsHalf(t.dtype())) continue;
    if (!t.has_data()) {
      t = ir::Tensor::DimsOnly(ir::DType::kF32, t.dims());
      continue;
    }
    ir::Tensor f(ir::DType::kF32, t.dims());
    WidenHalf(t, f);
    t = std::move(f);
  }
  F32Outputs f32_outputs(ctx.outputs);
  EvalContext inner = ctx;
  if (ctx.outputs != nullptr) inner.outputs = &f32_outputs;
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> outs, fn(node, wide, inner));
  for (size_t i = 0; i < outs.size() && i < node.outputs.size(); ++i) {
    if (!outs[i].defined() || !RoundsToHalf(node, static_cast<int>(i), outs[i].dtype())) continue;
    ASSIGN_OR_RETURN(ir::Tensor h, AllocOutput(node, ctx, static_cast<int>(i), half, outs[i].dims()));
    RoundToHalf(outs[i], h);
    outs[i] = std::move(h);
  }
  return outs;
}

// The half dtype of the node's first bf16/f16 input, if the node computes through f32.
std::optional<ir::DType> ComputesThroughF32(const ir::Node& node, const std::vector<ir::Tensor>& inputs) {
  if (HalfNative(node.op)) return std::nullopt;
  for (const ir::Tensor& t : inputs) {
    if (t.defined() && ir::IsHalf(t.dtype())) return t.dtype();
  }
  return std::nullopt;
}

}  // namespace

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
  const std::optional<ir::DType> half = ComputesThroughF32(node, inputs);
  ASSIGN_OR_RETURN(std::vector<ir::Tensor> outs,
                   half ? EvaluateInF32(fn, node, inputs, *half, ctx) : fn(node, inputs, ctx));
  // Kernels may compute optional outputs the node does not have (LayerNorm's Mean, ...).
  outs.resize(n_out);
  return outs;
}

}  // namespace onnxpipe::cpu
