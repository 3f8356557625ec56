// The one op list. Each entry: V(Enum, "Name", min_inputs, max_inputs, min_outputs, max_outputs).
// Adding an op touches this list, one importer (frontend/onnx), one shape rule
// (frontend/ir/infer_*.cc), one gradient rule (frontend/autodiff), one kernel per backend, one test.
//
// IR conventions (importers normalise ONNX's opset differences to these):
// - Operands that ONNX moved from attributes to inputs across opsets (Reduce* axes, Squeeze/Unsqueeze
//   axes, Split sizes) are attributes here: `axes` (ints), `split` (ints). Importers require those inputs
//   to be constant and say so otherwise. Dynamic shape operands (Reshape shape, Expand shape, Slice
//   starts/ends/axes/steps, Range, ConstantOfShape shape, Tile repeats) stay inputs, as in ONNX.
// - Attribute names and defaults follow the ONNX spec of the op (`axis`, `keepdims`, `perm`, ...).
//   Cast's `to` and ConstantOfShape's value are stored as an IR DType name / a Tensor attribute.
// - Min/Max take exactly two operands (numpy broadcasting); importers chain ONNX's variadic form.
//   ONNX Clip(x, min?, max?) is imported as Min(Max(x, min), max) (np.clip's order).
// - Sign (numeric: -1, 0 or 1 in X's dtype) and Ceil (float) have no gradient: autodiff stops there
//   (DeBERTa's relative-position buckets, computed from positions, use them).
// - Einsum is not an IR op: the importer lowers it to Transpose/Reshape/Mul/ReduceSum/MatMul.
// - Dropout: inputs (data), attrs `ratio` (float, default 0.5), `seed` (int, optional); outputs
//   (output, optional mask). It is active while training whatever ONNX's training_mode said, an
//   identity in inference (`onnxpipe run`).
// - CumSum: ONNX's axis input is the attribute `axis` here (the importer requires a constant);
//   attrs exclusive, reverse (0/1) as in ONNX.
// - GatherElements(data, indices) attr axis; GatherND(data, indices) attr batch_dims: as ONNX,
//   negative indices count from the end, an index out of range is an error.
// - ArgMax(X) attrs axis, keepdims (default 1), select_last_index (default 0) -> i64, as ONNX.
// Fused ops (frontend/passes/fusion):
// - Linear(X (..., K), W, bias?) attrs trans_b (0: W is (K, N); 1: W is (N, K)) -> Y (..., N).
// - LayerNorm(X, scale, bias?, residual?) attrs axis (default -1), epsilon -> Y, and optionally
//   Mean, InvStdDev as ONNX LayerNormalization (which imports straight to this op). With residual
//   (X's dims; the residual-norm fusion pass sets it) the normalised value is S = residual +
//   X', X' = X or, with the fused dropout attrs dropout (ratio) and rng_key, X kept and scaled or
//   zeroed exactly as that Dropout node would. S, in X's dtype, is optional output 3 (Sum) for the
//   residual stream's other readers; a backend computing a half-precision node in f32 may
//   normalise S before rounding it (the CPU), another after (the CUDA kernel, as Add stores it).
// - RMSNorm(X, scale, residual?) attrs axis (default -1), epsilon (default 1e-5) -> Y, and optionally
//   InvStdDev, Sum: over the dims [axis, rank), r = 1 / sqrt(mean(X^2) + epsilon), Y = X * r * scale
//   (ONNX RMSNormalization, the Llama/T5 norm); scale broadcasts to the normalised dims as
//   LayerNorm's; InvStdDev has X's dims with the normalised ones set to 1. With residual (X's dims;
//   the residual-norm fusion pass sets it) the normalised value is S = residual + X, output 2 (Sum)
//   for the residual stream's other readers, rounded as LayerNorm's S (no fused dropout here).
// - Gelu(X) attr approximate: "none" (erf) | "tanh"; optional fused dropout (the dropout-fusion
//   pass sets it for a Dropout that only reads the Gelu): attrs dropout (ratio, default 0) and
//   rng_key (the Dropout node's random-stream key): while training, each result is kept and scaled
//   by 1 / (1 - ratio) or zeroed exactly as that Dropout node would. Optional output 1 (KeepBits,
//   only with a fused dropout; autodiff asks for it): those keep decisions packed as bits, u8 of
//   ir::KeepBitsShape(X's dims) (X's last dim a multiple of 8): bit k (least significant first) of
//   flat byte j is the decision of flat element 8 j + k.
// - Attention(Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), mask?) attrs scale (float),
//   causal (int), dropout (float ratio, 0 = none), mask_kind "additive"|"bool" -> O (..., Sq, Dv).
//   softmax(scale * Q K^T + mask [causal: -inf above the diagonal]) then dropout, times V.
//   The mask broadcasts to (..., Sq, Sk). Grouped-query attention: K and V may have fewer heads
//   than Q, Q (..., Hq, Sq, Dh) with K (..., Hkv, Sk, Dh), V (..., Hkv, Sk, Dv), 1 < Hkv < Hq, Hkv
//   dividing Hq (ir::AttentionKvGroup): query head h reads K/V head h / (Hq / Hkv), as transformers'
//   repeat_kv lays them out (K/V head j serves query heads [j n_rep, (j + 1) n_rep)); O, the mask's
//   broadcast and Stats have Q's Hq heads. Optional strided views (frontend/ir/strided_view.h,
//   attribute form [offset, dim, stride, ...]; the last stride 1): q_view, k_view, v_view read that
//   operand in place from the input's buffer with the view's dims (Q, K, V may then be one value: a
//   packed projection); o_view writes O in place into an output of dims o_shape (required with
//   o_view), which the view covers exactly. The attention-layout pass sets them. Optional output
//   Stats: f32, O's dims through the views without the last ((..., Sq)), the natural-log
//   log-sum-exp of each row's scaled, masked scores over its visible keys (-inf for a row with
//   none); autodiff asks for it so that a backward may skip re-running the forward.
// - Rotary(X (..., D), cos (..., R), sin (..., R)) attrs rotary_dim (R, even, <= D), interleaved
//   (int, default 0) -> Y, X's dims and dtype: rotary position embedding, exactly the exporters'
//   arithmetic Y = X * cos + rot(X) * sin over the first R features of each row, the other D - R
//   passed through (partial rotary, GPT-NeoX/Phi). rot pairs feature i with i + R/2 (rotate-half,
//   Llama: rot(x)[i] = -x[i + R/2], rot(x)[i + R/2] = x[i] for i < R/2), or with interleaved = 1
//   feature 2i with 2i + 1 (GPT-J: rot(x)[2i] = -x[2i + 1], rot(x)[2i + 1] = x[2i]). cos and sin
//   have one shape and X's dtype; their last dim is R and the others broadcast to X's leading dims
//   right-aligned (numpy rules, cos's rank <= X's; each dim 1 or X's): Llama's (B, 1, S, R) tables
//   against X (B, H, S, D), GPT-J's (B, S, 1, R) against (B, S, H, D). No assumption is made about
//   the tables' values (cos[i] need not equal cos[i + R/2]).
// - GatedActivation(gate, up) attrs activation "silu" | "gelu", approximate ("none" (erf) | "tanh",
//   as Gelu's; gelu only, default "none") -> Y = act(gate) * up, gate's dims and dtype: the gated MLP
//   activation (SwiGLU: Llama, Qwen2, Mistral; GeGLU: Gemma), silu(x) = x * sigmoid(x) computed as
//   the exporters' Mul(x, Sigmoid(x)), gelu as Gelu. gate and up have one shape (no broadcast) and
//   one float dtype.
// Gradient and training ops (frontend/autodiff builds them; CPU kernels in executor/cpu/grad_*.cc).
// Inputs called `like` are SHAPE-ONLY: a kernel reads their dims (and dtype), never their data,
// so once symbols are bound a memory planner need not keep their buffers alive for them.
// - SoftmaxCrossEntropyLoss(scores (N, C, D1..Dk), labels (N, D1..Dk), weights (C)?) -> loss,
//   log_prob?, Stats? as ONNX's, plus attr label_smoothing (float, default 0), with the semantics
//   of PyTorch's CrossEntropyLoss(label_smoothing): target = (1-e) onehot + e/C. Half-precision
//   (bf16/f16) scores are read as they are and the loss computes in f32: its outputs are then f32
//   (ir::KeepsF32Output), and so are the weights (or in the scores' dtype). Optional output 2,
//   Stats (onnxpipe only; autodiff asks for it): the labels' dims + (2), f32 (f64 for f64 scores):
//   per position, the maximum m of its C scores and s = log(sum_c exp(x_c - m)), each rounded to
//   that dtype, so that log_prob = (x - m) - s evaluated in it is log_prob to the bit.
// - Sum(X0, X1, ...) -> elementwise sum with numpy broadcasting (accumulates gradients).
// - FusedMatMul(A, B) attrs trans_a, trans_b (0/1: transpose the last two dims), alpha (float,
//   default 1) -> alpha * op(A) @ op(B); ranks >= 2, batch dims broadcast as in MatMul.
//   Optional output KSum with attr k_sum "a" | "b" (rank-2 A and B only): the sums over k of
//   op(A)[m, k] (M values) or of op(B)[k, n] (N values), unscaled by alpha -- the bias gradient
//   that a weight-gradient GEMM over dY gets from its epilogue (dY's column sums). Optional attr
//   to ("f32" only): the outputs' dtype when the operands are bf16/f16 (a gradient GEMM writing
//   its f32 master's gradient: one rounding of the fp32 accumulation, no bf16 step between).
// - ReduceToShapeOf(X, like) -> X summed over the axes where like (right-aligned, numpy rules)
//   broadcasts to X's shape; the result has like's shape (the gradient of a broadcast).
// - ExpandLike(X, like) attrs axes (ints, optional), mean (int, default 0) -> X with size-1 dims
//   inserted at `axes` (positions in the output, as Unsqueeze) and broadcast to like's shape,
//   divided by numel(like)/numel(X) when mean=1 (the gradient of ReduceSum/ReduceMean).
// - ReshapeLike(X, like) -> X's data with like's shape (same element count).
// - ZerosLike(like) -> zeros of like's dtype and shape.
// - GatherGrad(dY, indices, like) attr axis -> zeros shaped like `like` with dY's slices
//   scatter-added at `indices` along axis (negative indices wrap as in Gather); deterministic.
// - GatherElementsGrad(dY, indices, like) attr axis, GatherNDGrad(dY, indices, like) attr
//   batch_dims -> zeros shaped like `like` (the forward's data) with dY scatter-added where the
//   forward read; deterministic.
// - SliceGrad(dY, like, starts, ends, axes?, steps?) -> zeros shaped like `like`, dY written into
//   the region Slice(like, starts, ends, axes, steps) selects.
// - ConcatGrad(dY, like_0, ..., like_{n-1}) attr axis -> n outputs, dY split along axis into
//   pieces of like_i's extent (the gradient of Concat; works with symbolic extents).
// - ReluGrad(dY, Y) -> dY * (Y > 0).
// - SoftmaxGrad(dY, Y) attr axis -> Y * (dY - sum(dY * Y, axis)); Y = Softmax output.
// - LogSoftmaxGrad(dY, Y) attr axis -> dY - exp(Y) * sum(dY, axis); Y = LogSoftmax output.
// - GeluGrad(dY, X, keep_bits?) attr approximate ("none" | "tanh") -> dX = dY * Gelu'(X), dXSums?;
//   with the forward's dropout and rng_key, dY is first kept and scaled, or zeroed, by the forward's
//   mask: read from keep_bits (the forward's KeepBits) when given, else regenerated from the stream.
//   Optional output 1, dXSums (X's last dim; dtype attr sums_to, default X's): the sums of dX as
//   stored over all its other dims, accumulated in at least f32 -- the following Linear's bias
//   gradient, formed while dX is written (passes/ksum_from_producer.h) instead of by a GEMM epilogue.
// - LayerNormGrad(dY, X, scale, mean?, inv_std_dev?, dresidual?, dY2?) attrs axis, epsilon -> dX,
//   dScale?, dBias?, dXDropped?. mean/inv_std_dev are LayerNorm's optional outputs; when absent the kernel
//   recomputes them. dresidual (X's dtype and shape) is added to dX, each rounded to X's dtype first
//   as an Add after it would: the other gradient of a fused residual's sum (the residual stream's).
//   dY2 (dY's dtype and shape) is a second addend of the incoming gradient: the kernel reads dY + dY2,
//   the Sum it replaces (passes/sum_into_norm_grad.h); in f32 for a half dtype on the CPU backend,
//   rounded to it by the CUDA kernel (as the Sum would store it).
//   dScale and dBias both have scale's shape. Optional output 3, dXDropped (with attrs dropout and
//   rng_key: a fused residual's LayerNorm with its dropout, the forward's): DropoutGrad of dX (output 0,
//   which it needs) by the forward's mask regenerated from its stream, the gradient of the operand the
//   forward dropped; one pass instead of a DropoutGrad reading dX again.
//   Optional outputs 4, dXSums, and 5, dXDroppedSums (X's last dim; dtype attr sums_to, default X's):
//   the sums of dX (output 0) or of dXDropped (output 3) as stored over all their other dims, as
//   GeluGrad's dXSums (a Linear's bias gradient, passes/ksum_from_producer.h).
// - RMSNormGrad(dY, X, scale, inv_std_dev?, dY2?) attrs axis, epsilon -> dX, dScale?. With x^ = X r
//   and g = dY * scale over a row of n: dX = r (g - x^ mean(g x^)); dScale = sum over rows of
//   dY x^ in scale's shape. inv_std_dev is RMSNorm's optional output; absent, it is recomputed.
//   dY2 as LayerNormGrad's (NormGradDy2Input gives its index in either op). RMSNormGrad(dY, S, scale,
//   inv_std_dev?, dY2?, dresidual?): with a fused residual X is the forward's Sum and dresidual is
//   added to dX as LayerNormGrad's.
// - DropoutGrad(dY, mask?) attr ratio -> dY * mask / (1 - ratio); mask = Dropout's bool output,
//   or without it the forward's mask regenerated from its random stream (attr rng_key = the
//   forward's rng_key, else its name; as AttentionGrad), so the forward keeps no mask.
// - AttentionGrad(dO, Q, K, V, mask?, O?, Stats?) attrs as the forward Attention -> dQ, dK, dV,
//   dMask?. O and Stats are the forward's outputs (O read through o_view, as dO): a kernel may take
//   the probabilities from them (cuDNN's backward) or recompute them from Q, K and the mask (the
//   CPU and flash kernels); with dropout > 0 it regenerates the forward's dropout mask from the same
//   random stream: attr rng_key (string) = the forward's rng_key, else the forward node's name.
//   dMask (an additive mask's gradient, in the mask's shape: the scores' gradient summed over the
//   dims the mask broadcasts) is there when the mask is a learned bias (T5's relative positions).
//   Views as the forward's: dO is read through o_view; each gradient has its input's dims and is
//   written through that input's view; grouped K and V (fewer heads) get dK and dV with their
//   Hkv heads, each the sum over its group's query heads, summed in the kernel. Inputs that are one value, each through
//   a view, share one gradient: the first of them (ir::AttentionGradSlot) carries it, the views covering it exactly.
// - RotaryGrad(dY, cos, sin) attrs as the forward Rotary -> dX: the transpose of Rotary's linear
//   map, dX = dY * cos + rot^T(dY * sin) on the first R features (rot^T = -rot, applied after the
//   table: dX[i] = dY[i] cos[i] + dY[i + R/2] sin[i + R/2], dX[i + R/2] = dY[i + R/2] cos[i + R/2] -
//   dY[i] sin[i] for rotate-half, likewise for the pairs (2i, 2i + 1)), dY passed through on the
//   rest. It is Rotary with -sin whenever sin repeats over each pair (as every exporter's table does).
//   cos and sin get no gradient (autodiff requires that they reach only constants and inputs).
// - GatedActivationGrad(dY, gate, up) attrs as the forward GatedActivation -> dGate, dUp, each
//   optional (absent when autodiff wants no gradient there): dGate = dY * up * act'(gate), dUp =
//   dY * act(gate), computed from the forward's inputs (nothing saved). silu'(x) = s (1 + x (1 - s)),
//   s = sigmoid(x); gelu' as GeluGrad's.
// - SoftmaxCrossEntropyLossGrad(dLoss, X, labels, weights?, Stats?) attrs reduction,
//   ignore_index, label_smoothing as the forward -> dScores in X's dtype and dims. With Stats (the
//   forward's output 2) X is the forward's scores (any float dtype: half scores give half dScores,
//   computed in f32) and log_prob is recomputed from them as (x - m) - s, so the forward keeps one
//   pair of numbers per position instead of log_prob; without, X is the forward's log_prob.
// Optimizer ops (frontend/autodiff/optimizer.h builds them; kernels executor/cpu/optimizer_kernels.cc).
// Their outputs are the next values of parameters and optimizer state, recorded in
// Graph::state_updates(); `lr` is an f64 scalar and `step` an i64 scalar graph input fed per step;
// `scale` is the optional gradient-clipping factor (ClipScale's output) multiplied into the grad.
// - SumSquares(X0, X1, ...) attr to (dtype name, default X0's dtype) -> scalar: sum of x^2 over every
//   element of every input, accumulated in double (input after input, each input's sum formed on its
//   own first), rounded to `to`. The optimizer makes one per gradient with to = f64, on the gradient's
//   stage, and adds them with SumScalars on the coordinator: only scalars cross stages.
// - SumScalars(S0, S1, ...) attr to (dtype name, default S0's dtype) -> scalar: ((0 + S0) + S1) + ...
//   in double, in input order, rounded to `to`. Sqrt of SumScalars(SumSquares(g_i) for every
//   gradient g_i) is the global gradient norm, the same bits for every stage count.
// - ClipScale(norm) attrs max_norm (float), eps (float, default 1e-6) -> min(1, max_norm/(norm+eps))
//   (torch.nn.utils.clip_grad_norm_).
// - SGDUpdate(param, grad, lr, momentum_buf?, scale?) attrs momentum, nesterov (int), weight_decay
//   -> param', momentum_buf' (both present iff momentum != 0), torch.optim.SGD without dampening:
//   d = g*scale + wd*p; buf' = momentum*buf + d; d = nesterov ? d + momentum*buf' : buf';
//   p' = p - lr*d. A zero-initialised buffer gives PyTorch's first step (buf = d) exactly.
// - AdamWUpdate(param, grad, m, v, lr, step, scale?) attrs beta1, beta2, eps, weight_decay
//   -> param', m', v', torch.optim.AdamW: p *= 1 - lr*wd; m' = b1*m + (1-b1)*g;
//   v' = b2*v + (1-b2)*g*g; p' = p - lr/(1-b1^step) * m' / (sqrt(v')/sqrt(1-b2^step) + eps);
//   `step` is the 1-based count of updates including this one.
// - Both updates have two more optional outputs (absent ones before a present one are kNoValue):
//   at UpdateSumSquaresOutput (SGDUpdate 2, AdamWUpdate 3), SumSquares(grad) with to = f64, the
//   unscaled gradient's, summed in SumSquares' order: the global norm's term of this gradient, formed
//   while the update reads it (without clipping nothing has to wait for the norm); at
//   UpdateComputeCopyOutput (SGDUpdate 3, AdamWUpdate 4), Cast(param') to that output's half dtype:
//   the compute copy a mixed-precision forward reads, written by the update instead of a Cast per step.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace onnxpipe::ir {

constexpr int kVariadic = 1 << 20;

// Op properties, the last column of ONNXPIPE_OP_LIST (one place, read by the memory planner, the
// cost model and the recompute rules):
// - kOpView: output 0 may be a view of input 0's buffer (same bytes, other dims): the planner aliases it.
// - kOpGemm: GEMM-class work (matrix products on the tensor cores): the roofline's GEMM peak.
// - kOpCostly: not cheap to recompute: the selective rule keeps its outputs.
// - OpShapeOnly(i): operand i is read for its dims only (never its data), so it does not keep the value
//   alive; with kOpShapeOnlyRest every operand after the lowest ShapeOnly one is too (variadic ops).
enum OpProp : uint32_t { kOpView = 1u << 0, kOpGemm = 1u << 1, kOpCostly = 1u << 2, kOpShapeOnlyRest = 1u << 3 };
constexpr uint32_t OpShapeOnly(int i) { return 1u << (8 + i); }

#define ONNXPIPE_OP_LIST(V)                                                                  \
  /* Primitive ONNX ops */                                                                   \
  V(Gather, "Gather", 2, 2, 1, 1, 0)                                                         \
  V(MatMul, "MatMul", 2, 2, 1, 1, kOpGemm | kOpCostly)                                       \
  V(Gemm, "Gemm", 2, 3, 1, 1, kOpGemm | kOpCostly)                                           \
  V(Add, "Add", 2, 2, 1, 1, 0)                                                               \
  V(Sub, "Sub", 2, 2, 1, 1, 0)                                                               \
  V(Mul, "Mul", 2, 2, 1, 1, 0)                                                               \
  V(Div, "Div", 2, 2, 1, 1, 0)                                                               \
  V(Pow, "Pow", 2, 2, 1, 1, 0)                                                               \
  V(Sqrt, "Sqrt", 1, 1, 1, 1, 0)                                                             \
  V(Reciprocal, "Reciprocal", 1, 1, 1, 1, 0)                                                 \
  V(Neg, "Neg", 1, 1, 1, 1, 0)                                                               \
  V(Exp, "Exp", 1, 1, 1, 1, 0)                                                               \
  V(Log, "Log", 1, 1, 1, 1, 0)                                                               \
  V(Erf, "Erf", 1, 1, 1, 1, 0)                                                               \
  V(Tanh, "Tanh", 1, 1, 1, 1, 0)                                                             \
  V(Relu, "Relu", 1, 1, 1, 1, 0)                                                             \
  V(Sigmoid, "Sigmoid", 1, 1, 1, 1, 0)                                                       \
  V(Sin, "Sin", 1, 1, 1, 1, 0)                                                               \
  V(Cos, "Cos", 1, 1, 1, 1, 0)                                                               \
  V(Abs, "Abs", 1, 1, 1, 1, 0)                                                               \
  V(Sign, "Sign", 1, 1, 1, 1, 0)                                                             \
  V(Ceil, "Ceil", 1, 1, 1, 1, 0)                                                             \
  V(Min, "Min", 2, 2, 1, 1, 0)                                                               \
  V(Max, "Max", 2, 2, 1, 1, 0)                                                               \
  V(Softmax, "Softmax", 1, 1, 1, 1, 0)                                                       \
  V(LogSoftmax, "LogSoftmax", 1, 1, 1, 1, 0)                                                 \
  V(ReduceMean, "ReduceMean", 1, 1, 1, 1, 0)                                                 \
  V(ReduceSum, "ReduceSum", 1, 1, 1, 1, 0)                                                   \
  V(ReduceMax, "ReduceMax", 1, 1, 1, 1, 0)                                                   \
  V(Transpose, "Transpose", 1, 1, 1, 1, 0)                                                   \
  V(Reshape, "Reshape", 2, 2, 1, 1, kOpView)                                                 \
  V(Flatten, "Flatten", 1, 1, 1, 1, kOpView)                                                 \
  V(Squeeze, "Squeeze", 1, 1, 1, 1, kOpView)                                                 \
  V(Unsqueeze, "Unsqueeze", 1, 1, 1, 1, kOpView)                                             \
  V(Concat, "Concat", 1, kVariadic, 1, 1, 0)                                                 \
  V(Split, "Split", 1, 1, 1, kVariadic, 0)                                                   \
  V(Slice, "Slice", 3, 5, 1, 1, 0)                                                           \
  V(Shape, "Shape", 1, 1, 1, 1, OpShapeOnly(0))                                              \
  V(Constant, "Constant", 0, 0, 1, 1, 0)                                                     \
  V(ConstantOfShape, "ConstantOfShape", 1, 1, 1, 1, 0)                                       \
  V(Cast, "Cast", 1, 1, 1, 1, 0)                                                             \
  V(Where, "Where", 3, 3, 1, 1, 0)                                                           \
  V(Equal, "Equal", 2, 2, 1, 1, 0)                                                           \
  V(Less, "Less", 2, 2, 1, 1, 0)                                                             \
  V(Greater, "Greater", 2, 2, 1, 1, 0)                                                       \
  V(Not, "Not", 1, 1, 1, 1, 0)                                                               \
  V(And, "And", 2, 2, 1, 1, 0)                                                               \
  V(Mod, "Mod", 2, 2, 1, 1, 0)                                                               \
  V(Expand, "Expand", 2, 2, 1, 1, 0)                                                         \
  V(Identity, "Identity", 1, 1, 1, 1, kOpView)                                               \
  V(Dropout, "Dropout", 1, 1, 1, 2, 0)                                                       \
  V(Range, "Range", 3, 3, 1, 1, 0)                                                           \
  V(Trilu, "Trilu", 1, 2, 1, 1, 0)                                                           \
  V(GreaterOrEqual, "GreaterOrEqual", 2, 2, 1, 1, 0)                                         \
  V(LessOrEqual, "LessOrEqual", 2, 2, 1, 1, 0)                                               \
  V(IsNaN, "IsNaN", 1, 1, 1, 1, 0)                                                           \
  V(CumSum, "CumSum", 1, 1, 1, 1, 0)                                                         \
  V(GatherElements, "GatherElements", 2, 2, 1, 1, 0)                                         \
  V(GatherND, "GatherND", 2, 2, 1, 1, 0)                                                     \
  V(ArgMax, "ArgMax", 1, 1, 1, 1, 0)                                                         \
  V(SoftmaxCrossEntropyLoss, "SoftmaxCrossEntropyLoss", 2, 3, 1, 3, kOpCostly)               \
  /* Fused ops */                                                                            \
  V(Linear, "Linear", 2, 3, 1, 1, kOpGemm | kOpCostly)                                       \
  V(LayerNorm, "LayerNorm", 2, 4, 1, 4, 0)                                                   \
  V(RMSNorm, "RMSNorm", 2, 3, 1, 3, 0)                                                       \
  V(Gelu, "Gelu", 1, 1, 1, 2, 0)                                                             \
  V(Attention, "Attention", 3, 4, 1, 2, kOpGemm | kOpCostly)                                 \
  /* Gradient and training ops */                                                            \
  V(Sum, "Sum", 1, kVariadic, 1, 1, 0)                                                       \
  V(FusedMatMul, "FusedMatMul", 2, 2, 1, 2, kOpGemm | kOpCostly)                             \
  V(ReduceToShapeOf, "ReduceToShapeOf", 2, 2, 1, 1, OpShapeOnly(1))                          \
  V(ExpandLike, "ExpandLike", 2, 2, 1, 1, OpShapeOnly(1))                                    \
  V(ReshapeLike, "ReshapeLike", 2, 2, 1, 1, kOpView | OpShapeOnly(1))                        \
  V(ZerosLike, "ZerosLike", 1, 1, 1, 1, OpShapeOnly(0))                                      \
  V(GatherGrad, "GatherGrad", 3, 3, 1, 1, OpShapeOnly(2))                                    \
  V(GatherElementsGrad, "GatherElementsGrad", 3, 3, 1, 1, 0)                                 \
  V(GatherNDGrad, "GatherNDGrad", 3, 3, 1, 1, 0)                                             \
  V(SliceGrad, "SliceGrad", 4, 6, 1, 1, OpShapeOnly(1))                                      \
  V(ConcatGrad, "ConcatGrad", 2, kVariadic, 1, kVariadic, OpShapeOnly(1) | kOpShapeOnlyRest) \
  V(ReluGrad, "ReluGrad", 2, 2, 1, 1, 0)                                                     \
  V(SoftmaxGrad, "SoftmaxGrad", 2, 2, 1, 1, 0)                                               \
  V(LogSoftmaxGrad, "LogSoftmaxGrad", 2, 2, 1, 1, 0)                                         \
  V(GeluGrad, "GeluGrad", 2, 3, 1, 2, 0)                                                     \
  V(LayerNormGrad, "LayerNormGrad", 3, 7, 1, 6, 0)                                           \
  V(RMSNormGrad, "RMSNormGrad", 3, 6, 1, 2, 0)                                               \
  V(DropoutGrad, "DropoutGrad", 1, 2, 1, 1, 0)                                               \
  V(AttentionGrad, "AttentionGrad", 4, 7, 3, 4, kOpGemm | kOpCostly)                         \
  V(SoftmaxCrossEntropyLossGrad, "SoftmaxCrossEntropyLossGrad", 3, 5, 1, 1, 0)               \
  V(SumSquares, "SumSquares", 1, kVariadic, 1, 1, 0)                                         \
  V(ClipScale, "ClipScale", 1, 1, 1, 1, 0)                                                   \
  V(SGDUpdate, "SGDUpdate", 3, 5, 1, 4, 0)                                                   \
  V(AdamWUpdate, "AdamWUpdate", 6, 7, 3, 5, 0)                                               \
  V(SumScalars, "SumScalars", 1, kVariadic, 1, 1, 0)                                         \
  V(Rotary, "Rotary", 3, 3, 1, 1, 0)                                                         \
  V(RotaryGrad, "RotaryGrad", 3, 3, 1, 1, 0)                                                 \
  V(GatedActivation, "GatedActivation", 2, 2, 1, 1, 0)                                       \
  V(GatedActivationGrad, "GatedActivationGrad", 3, 3, 1, 2, 0)

enum class OpKind : uint16_t {
#define V(e, name, min_in, max_in, min_out, max_out, props) k##e,
  ONNXPIPE_OP_LIST(V)
#undef V
      kNumOps
};

struct OpInfo {
  std::string_view name;
  int min_inputs, max_inputs, min_outputs, max_outputs;
  uint32_t props;  // OpProp bits and ShapeOnly operands
};

const OpInfo& GetOpInfo(OpKind op);
inline std::string_view OpName(OpKind op) { return GetOpInfo(op).name; }
inline bool HasProp(OpKind op, OpProp p) { return (GetOpInfo(op).props & p) != 0; }
// Operand `i` of an `op` node is read for its dims only.
inline bool IsShapeOnlyOperand(OpKind op, int i) {
  const uint32_t props = GetOpInfo(op).props;
  if (i < 24 && (props & OpShapeOnly(i)) != 0) return true;
  if ((props & kOpShapeOnlyRest) == 0) return false;
  for (int j = 0; j < i && j < 24; ++j)
    if ((props & OpShapeOnly(j)) != 0) return true;
  return false;
}
std::optional<OpKind> ParseOpKind(std::string_view name);
// The index of a LayerNormGrad's or RMSNormGrad's optional dY2 input (the incoming gradient's second
// addend); -1 for any other op.
constexpr int NormGradDy2Input(OpKind op) {
  return op == OpKind::kLayerNormGrad ? 6 : op == OpKind::kRMSNormGrad ? 4 : -1;
}
// A LayerNorm's or RMSNorm's fused residual: its input index, the index of its Sum output, and the
// index of the gradient's dresidual input; -1 for any other op.
constexpr int NormResidualInput(OpKind op) {
  return op == OpKind::kLayerNorm ? 3 : op == OpKind::kRMSNorm ? 2 : -1;
}
constexpr int NormSumOutput(OpKind op) { return NormResidualInput(op); }
// The index of an SGDUpdate's or AdamWUpdate's optional gradient sum of squares output; -1 for any other op.
constexpr int UpdateSumSquaresOutput(OpKind op) {
  return op == OpKind::kSGDUpdate ? 2 : op == OpKind::kAdamWUpdate ? 3 : -1;
}
// The index of an SGDUpdate's or AdamWUpdate's optional half-precision copy of param'; -1 for any other op.
constexpr int UpdateComputeCopyOutput(OpKind op) {
  return op == OpKind::kSGDUpdate ? 3 : op == OpKind::kAdamWUpdate ? 4 : -1;
}
constexpr int NormGradResidualInput(OpKind op) {
  return op == OpKind::kLayerNormGrad || op == OpKind::kRMSNormGrad ? 5 : -1;
}
// The output where a gradient op writes the column sums of its output `k` (GeluGrad's dXSums,
// LayerNormGrad's dXSums and dXDroppedSums); -1 where it has none.
constexpr int ColumnSumsOutput(OpKind op, int k) {
  if (op == OpKind::kGeluGrad) return k == 0 ? 1 : -1;
  if (op == OpKind::kLayerNormGrad) return k == 0 ? 4 : k == 3 ? 5 : -1;
  return -1;
}
// Whether output `index` of a node of `op` is such a column sum.
constexpr bool IsColumnSumsOutput(OpKind op, int index) {
  return index >= 0 && (index == ColumnSumsOutput(op, 0) || index == ColumnSumsOutput(op, 3));
}

}  // namespace onnxpipe::ir
