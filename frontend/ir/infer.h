// Shape and dtype inference over the IR, for every op in the op list (primitive and fused).
// It is the project's own (libonnx 1.12 knows opsets <= 17 only), works on symbolic dims, reads
// constant operands (Reshape's shape, Slice's starts, ...) where present, and reports a shape
// contradiction naming the node. Rules live in infer_*.cc by op family.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::ir {

struct TypeAndShape {
  DType dtype = DType::kF32;
  Shape shape;
};

// Infers the outputs of one node from its inputs' types and shapes (and constant data).
absl::StatusOr<std::vector<TypeAndShape>> InferNode(const Graph& g, const Node& n);

// Runs InferNode over the graph in order and stores the results in the output values. Where an
// output already has a known shape (from the ONNX file), the two must agree (symbolic dims in the
// file may be refined by the inferred ones).
absl::Status InferShapes(Graph& g);

// Replaces symbols ("B", "S") in every value's shape with bound sizes and records the bindings.
// Fails naming the value when a bound dim contradicts a constant's data. Re-run InferShapes after.
absl::Status BindSymbols(Graph& g, const std::map<std::string, int64_t>& bindings);

// The named symbols ("B", "S"; not the unknown "?k" ones) in the graph inputs' shapes: what a
// user can bind.
std::set<std::string> CollectSymbols(const Graph& g);

// The elements of the integer value `v` when they are known before the graph runs: constants and
// the shape arithmetic exporters build from them (Shape of concrete dims, Concat, Slice, Transpose,
// Reshape, Cast, Gather, ...; at most 64 elements). nullopt when any element is not. Shapes must be
// inferred first.
std::optional<std::vector<int64_t>> KnownInts(const Graph& g, ValueId v);

// True when the op has a shape rule (every op in the op list should).
bool HasShapeRule(OpKind op);

}  // namespace onnxpipe::ir
