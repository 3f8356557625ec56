// Float precision of a graph's computation: converting a whole graph between float types (f64 for
// gradient checks and bitwise references), the half types' helpers, and which op outputs keep f32
// when the op computes from half-precision inputs.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

// Every `from` value (inputs, constants, intermediates, Cast targets) becomes `to`. Outputs keep
// their new dtype; callers convert feeds with Tensor::CastTo.
absl::Status ConvertFloatPrecision(Graph& g, DType from, DType to);

// The `from` values of g that only compute integers: every use is a Cast to a non-float type or a node whose
// outputs are all such values, and each is a constant or made from constants, non-float values and such values
// (T5's relative-position buckets: positions cast to float32, a log, a scale, cast back to int). Never a graph
// input or output.
std::vector<bool> IndexArithmetic(const Graph& g, DType from);

// ConvertFloatPrecision for a graph that is to compute in `to`, before anything is folded (so that folding
// computes in `to` as well: a rotary table from positions, a constant scale), except its index arithmetic, which
// keeps `from`: the integers a model makes through floats (a floor of a float32 log) stay the ones it exports.
absl::Status ConvertComputePrecision(Graph& g, DType from, DType to);

inline bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

// Output `index` of `node` stays f32 when the node reads half-precision activations: the
// normalisation statistics (ONNX's stash_type, float by default): LayerNorm's Mean and InvStdDev,
// RMSNorm's InvStdDev, and Attention's Stats; a FusedMatMul's outputs under its `to`, and the column sums
// a GeluGrad or LayerNormGrad writes in its place (sums_to f32); and every
// output of SoftmaxCrossEntropyLoss, which computes in f32 from half logits (op.h).
// Every backend computing a half node keeps these outputs f32.
bool KeepsF32Output(const Node& node, int index);

// The largest finite magnitude of a float dtype (65504 for f16, 3.3895e38 for bf16).
double MaxFinite(DType t);

// `t` (any float dtype) converted to `to` with finite values clamped to to's largest finite
// magnitude before rounding, so a finite value never becomes an infinity (an additive mask's
// finfo(f32).min stays a very negative finite number); infinities and NaN stay what they are.
Tensor CastSaturating(const Tensor& t, DType to);

}  // namespace onnxpipe::ir
