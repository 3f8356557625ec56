// Small queries about layout ops (ops that move or relabel elements without computing), shared by
// the layout passes (AttentionLayout, RowLayoutMotion).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "frontend/ir/graph.h"

namespace onnxpipe::passes {

// The dims of `v` when its shape is known and concrete, else nullopt.
std::optional<std::vector<int64_t>> ConcreteDims(const ir::Graph& g, ir::ValueId v);

// Ops whose output is their data input's elements in the same order (Reshape, Flatten, Squeeze,
// Unsqueeze, Identity).
bool ReshapesData(ir::OpKind op);

// A Transpose's permutation of a rank-`rank` input (ONNX's default: the dims reversed).
std::vector<int64_t> TransposePerm(const ir::Node& n, size_t rank);

}  // namespace onnxpipe::passes
