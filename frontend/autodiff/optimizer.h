// Optimizers as graph ops. AddOptimizer appends, after the backward pass that BuildGradients
// made, the nodes of one training step's update (Phase::kOptimizer):
//
//   with clip_norm > 0:
//     s_g        = SumSquares(g) attr to=f64                      per gradient g, with its parameter
//     grad_norm  = Sqrt(SumScalars(s_g over every gradient))      graph output kGradNormName
//     clip_scale = ClipScale(grad_norm) attr max_norm
//   per parameter p with gradient g:
//     SGD:   p', buf', s_g? = SGDUpdate(p, g, lr, buf?, clip_scale?)   (buf only with momentum != 0)
//     AdamW: p', m', v', s_g? = AdamWUpdate(p, g, m, v, lr, step, clip_scale?)
//   without clipping each update also outputs s_g (SumSquares(g), read while the update reads g: one pass
//   over the gradients, not two), and then
//     grad_norm  = Sqrt(SumScalars(s_g over every gradient))
//   with compute_copies, an update also outputs p's half-precision copy c' (see OptimizerOptions).
//
// and records (p, p'), (buf, buf'), (m, m'), (v, v'), (c, c') in Graph::state_updates(): after evaluating
// the graph, the caller stores each new value into its state's constant. Optimizer state (buf, m,
// v) is a new zero constant per parameter, named "<param>/momentum", "<param>/adam_m",
// "<param>/adam_v" (zero buffers reproduce PyTorch's first step exactly, see op.h).
//
// Scalar graph inputs fed every step: kLrName (f64, the step's learning rate from the host-side
// schedule) and, for AdamW, kStepName (i64, the 1-based update count). grad_norm is the norm before
// clipping, as clip_grad_norm_ returns it, so metrics read it from the outputs for free.
//
// Update nodes carry Node::origin = the parameter's name, so a partitioner keeps a parameter's
// update on the stage of its forward and backward nodes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

inline constexpr char kLrName[] = "optimizer/lr";
inline constexpr char kStepName[] = "optimizer/step";
inline constexpr char kGradNormName[] = "optimizer/grad_norm";

enum class OptimizerKind { kSGD, kAdamW };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSGD;
  double weight_decay = 0.0;
  // SGD (torch.optim.SGD, dampening 0).
  double momentum = 0.0;
  bool nesterov = false;
  // AdamW (torch.optim.AdamW, amsgrad off).
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_); 0 disables it.
  double clip_norm = 0.0;
  // A parameter the forward reads through Casts to a half dtype (mixed precision) gets its compute copy as
  // optimizer state: a constant named ComputeCopyName(param, dtype) replaces the Casts and the update writes it (op.h:
  // UpdateComputeCopyOutput), so each step reads the f32 master once, in the update, not again per Cast.
  bool compute_copies = true;
  // Keep the parameter gradients among the graph outputs (BuildGradients adds them there); by
  // default they are taken off so that an executor can free them after the update.
  bool keep_grad_outputs = false;
};

struct OptimizerGraphInfo {
  ir::ValueId lr = ir::kNoValue;          // graph input, f64 scalar
  ir::ValueId step = ir::kNoValue;        // graph input, i64 scalar (AdamW only)
  ir::ValueId grad_norm = ir::kNoValue;   // graph output, scalar of the gradients' dtype
  ir::ValueId clip_scale = ir::kNoValue;  // with clip_norm > 0
  std::vector<ir::ValueId> state;         // the optimizer-state constants created
  int64_t state_bytes = 0;                // their total size
};

// Fails naming the parameter when a parameter is not a float constant or its gradient does not
// match it in dtype and shape, and on invalid hyper-parameters (negative lr-independent values,
// betas outside [0, 1), nesterov without momentum).
absl::StatusOr<OptimizerGraphInfo> AddOptimizer(ir::Graph* g,
                                                const std::vector<ParamGrad>& param_grads,
                                                const OptimizerOptions& options);

// The name of a parameter's compute copy in `half` (OptimizerOptions::compute_copies): "<param>/compute_bf16".
std::string ComputeCopyName(const std::string& param, ir::DType half);

// "sgd" | "adamw".
absl::StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);

}  // namespace onnxpipe::autodiff
