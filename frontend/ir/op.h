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
// - Dropout: inputs (data), attrs `ratio` (float, default 0.5), `seed` (int, optional); outputs
//   (output, optional mask). It is active while training whatever ONNX's training_mode said, an
//   identity in inference (`onnxpipe run`).
// Fused ops (frontend/passes/fusion):
// - Linear(X (..., K), W, bias?) attrs trans_b (0: W is (K, N); 1: W is (N, K)) -> Y (..., N).
// - LayerNorm(X, scale, bias?) attrs axis (default -1), epsilon -> Y, and optionally Mean,
//   InvStdDev as ONNX LayerNormalization (which imports straight to this op).
// - Gelu(X) attr approximate: "none" (erf) | "tanh".
// - Attention(Q (..., Sq, Dh), K (..., Sk, Dh), V (..., Sk, Dv), mask?) attrs scale (float),
//   causal (int), dropout (float ratio, 0 = none), mask_kind "additive"|"bool" -> O (..., Sq, Dv).
//   softmax(scale * Q K^T + mask [causal: -inf above the diagonal]) then dropout, times V.
//   The mask broadcasts to (..., Sq, Sk).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace onnxpipe::ir {

constexpr int kVariadic = 1 << 20;

#define ONNXPIPE_OP_LIST(V)                                  \
  /* Primitive ONNX ops */                                   \
  V(Gather, "Gather", 2, 2, 1, 1)                            \
  V(MatMul, "MatMul", 2, 2, 1, 1)                            \
  V(Gemm, "Gemm", 2, 3, 1, 1)                                \
  V(Add, "Add", 2, 2, 1, 1)                                  \
  V(Sub, "Sub", 2, 2, 1, 1)                                  \
  V(Mul, "Mul", 2, 2, 1, 1)                                  \
  V(Div, "Div", 2, 2, 1, 1)                                  \
  V(Pow, "Pow", 2, 2, 1, 1)                                  \
  V(Sqrt, "Sqrt", 1, 1, 1, 1)                                \
  V(Reciprocal, "Reciprocal", 1, 1, 1, 1)                    \
  V(Neg, "Neg", 1, 1, 1, 1)                                  \
  V(Exp, "Exp", 1, 1, 1, 1)                                  \
  V(Log, "Log", 1, 1, 1, 1)                                  \
  V(Erf, "Erf", 1, 1, 1, 1)                                  \
  V(Tanh, "Tanh", 1, 1, 1, 1)                                \
  V(Relu, "Relu", 1, 1, 1, 1)                                \
  V(Sigmoid, "Sigmoid", 1, 1, 1, 1)                          \
  V(Softmax, "Softmax", 1, 1, 1, 1)                          \
  V(LogSoftmax, "LogSoftmax", 1, 1, 1, 1)                    \
  V(ReduceMean, "ReduceMean", 1, 1, 1, 1)                    \
  V(ReduceSum, "ReduceSum", 1, 1, 1, 1)                      \
  V(ReduceMax, "ReduceMax", 1, 1, 1, 1)                      \
  V(Transpose, "Transpose", 1, 1, 1, 1)                      \
  V(Reshape, "Reshape", 2, 2, 1, 1)                          \
  V(Flatten, "Flatten", 1, 1, 1, 1)                          \
  V(Squeeze, "Squeeze", 1, 1, 1, 1)                          \
  V(Unsqueeze, "Unsqueeze", 1, 1, 1, 1)                      \
  V(Concat, "Concat", 1, kVariadic, 1, 1)                    \
  V(Split, "Split", 1, 1, 1, kVariadic)                      \
  V(Slice, "Slice", 3, 5, 1, 1)                              \
  V(Shape, "Shape", 1, 1, 1, 1)                              \
  V(Constant, "Constant", 0, 0, 1, 1)                        \
  V(ConstantOfShape, "ConstantOfShape", 1, 1, 1, 1)          \
  V(Cast, "Cast", 1, 1, 1, 1)                                \
  V(Where, "Where", 3, 3, 1, 1)                              \
  V(Equal, "Equal", 2, 2, 1, 1)                              \
  V(Less, "Less", 2, 2, 1, 1)                                \
  V(Greater, "Greater", 2, 2, 1, 1)                          \
  V(Not, "Not", 1, 1, 1, 1)                                  \
  V(And, "And", 2, 2, 1, 1)                                  \
  V(Mod, "Mod", 2, 2, 1, 1)                                  \
  V(Expand, "Expand", 2, 2, 1, 1)                            \
  V(Identity, "Identity", 1, 1, 1, 1)                        \
  V(Dropout, "Dropout", 1, 1, 1, 2)                          \
  V(Range, "Range", 3, 3, 1, 1)                              \
  V(Trilu, "Trilu", 1, 2, 1, 1)                              \
  V(SoftmaxCrossEntropyLoss, "SoftmaxCrossEntropyLoss", 2, 3, 1, 2) \
  /* Fused ops */                                            \
  V(Linear, "Linear", 2, 3, 1, 1)                            \
  V(LayerNorm, "LayerNorm", 2, 3, 1, 3)                      \
  V(Gelu, "Gelu", 1, 1, 1, 1)                                \
  V(Attention, "Attention", 3, 4, 1, 1)

enum class OpKind : uint16_t {
#define V(e, name, min_in, max_in, min_out, max_out) k##e,
  ONNXPIPE_OP_LIST(V)
#undef V
      kNumOps
};

struct OpInfo {
  std::string_view name;
  int min_inputs, max_inputs, min_outputs, max_outputs;
};

const OpInfo& GetOpInfo(OpKind op);
inline std::string_view OpName(OpKind op) { return GetOpInfo(op).name; }
std::optional<OpKind> ParseOpKind(std::string_view name);

}  // namespace onnxpipe::ir
