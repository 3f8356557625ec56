// Internal to shape inference (frontend/ir/infer*.cc): the per-node context handed to the rules,
// the dim algebra the rules share (broadcast, unify, symbolic sums), compile-time data of small
// integer tensors (shape arithmetic), and the registration hooks of the per-family rule files.
// Not part of the IR's public interface: include infer.h instead.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/status.h"

namespace onnxpipe::ir::infer_internal {

// ---------------------------------------------------------------------------------------------
// Dim algebra.

// How much a dim says: 2 concrete, 1 named symbols only ("B", "4*B*S"), 0 contains an unknown.
int Specificity(const Dim& d);
inline bool IsOne(const Dim& d) { return d.is_concrete() && d.value() == 1; }

// The dim two dims that must be equal denote: the more specific of the two (the first when equally
// specific); nullopt when both are concrete and differ.
std::optional<Dim> UnifyDims(const Dim& a, const Dim& b);

// numpy broadcasting of two dims: equal dims stay, a concrete 1 yields the other, a concrete dim >
// 1 wins over a symbolic one (the symbol must be 1 or equal to it), a named symbol wins over an
// unknown one, two different named symbols give a fresh unknown. nullopt: two different concrete
// dims > 1.
std::optional<Dim> BroadcastDims(const Dim& a, const Dim& b);

// a + b and a - b where expressible (equal symbol sets add factors; a concrete 0 is neutral); a
// fresh unknown otherwise. A negative factor on a symbolic result also gives an unknown.
Dim AddDims(const Dim& a, const Dim& b);
Dim SubDims(const Dim& a, const Dim& b);

// ---------------------------------------------------------------------------------------------
// Compile-time data of small integer tensors: constants, Constant nodes, and the shape arithmetic
// exporters emit (Shape -> Gather -> Unsqueeze -> Concat, Mul/Div of dims, Where(Equal(s,-1))...).

struct KnownData {
  std::vector<int64_t> dims;  // the tensor's (concrete) shape
  std::vector<Dim> elems;     // row-major elements; unknown dims where an element is not derivable

  bool AllConcrete() const;
  std::vector<int64_t> Ints() const;  // requires AllConcrete()
};

// Largest tensor whose data is tracked.
constexpr int64_t kMaxKnownElements = 64;

// The data of value `v` as far as it is derivable from constants and already-inferred shapes:
// nullopt when not even its (concrete, small) shape is known; unknown elements where only the
// shape is. Only integer and bool tensors are tracked.
std::optional<KnownData> ComputeKnownData(const Graph& g, ValueId v);

// The tensor behind `v` when it is a constant value or the output of a live Constant node.
std::optional<Tensor> ConstantTensor(const Graph& g, ValueId v);

// The tensor stored in a Constant node's attributes (`value`, or ONNX's
// value_int(s)/value_float(s)).
std::optional<Tensor> ConstantNodeTensor(const Node& n);

// ---------------------------------------------------------------------------------------------
// The context of one node.

class InferContext {
 public:
  InferContext(const Graph& g, const Node& n) : g_(g), n_(n) {}

  const Graph& graph() const { return g_; }
  const Node& node() const { return n_; }
  const Attrs& attrs() const { return n_.attrs; }
  int num_inputs() const { return static_cast<int>(n_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(n_.outputs.size()); }
  bool has_input(int i) const { return i < num_inputs() && n_.inputs[i] != kNoValue; }
  bool has_output(int i) const { return i < num_outputs() && n_.outputs[i] != kNoValue; }

  // Requires has_input(i) (InferNode checks the op's required inputs before calling a rule).
  const Value& input(int i) const { return g_.value(n_.inputs[i]); }
  const Shape& shape(int i) const { return input(i).shape; }
  int64_t rank(int i) const { return static_cast<int64_t>(shape(i).size()); }
  DType dtype(int i) const { return input(i).dtype; }
  std::optional<KnownData> data(int i) const { return ComputeKnownData(g_, n_.inputs[i]); }

  // An InvalidArgument status builder whose message starts "node 'NAME' (Op): ".
  StatusBuilder Error() const;

  // Normalises a possibly negative axis into [0, rank) ([0, rank] when `allow_rank`), or fails
  // naming the attribute.
  absl::StatusOr<int64_t> Axis(int64_t axis, int64_t rank, std::string_view what,
                               bool allow_rank = false) const;
  // Normalises a list of axes (unique) into [0, rank).
  absl::StatusOr<std::vector<int64_t>> Axes(const std::vector<int64_t>& axes, int64_t rank,
                                            std::string_view what) const;

  // dtype checks that fail naming the input.
  absl::Status ExpectFloat(int i) const;
  absl::Status ExpectInteger(int i) const;  // i32 or i64 (indices, shapes)
  absl::Status ExpectBool(int i) const;
  absl::Status ExpectSameDType(int i, int j) const;
  // Requires rank(i) >= min_rank.
  absl::Status ExpectRankAtLeast(int i, int64_t min_rank) const;

  // "input 1 'name' (f32, (B, S, 64))" for messages.
  std::string Describe(int i) const;

 private:
  const Graph& g_;
  const Node& n_;
};

// Inputs i and j must have the same shape (up to symbolic refinement): the unified shape, or an
// error naming both.
absl::StatusOr<Shape> SameShape(const InferContext& ctx, int i, int j);
// numpy broadcasting of several shapes; fails naming the node and the shapes.
absl::StatusOr<Shape> BroadcastShapes(const InferContext& ctx, const std::vector<Shape>& shapes);

// The shapes of an Attention / AttentionGrad node's Q, K, V (inputs first..first+2) as the kernels
// read them: through their views (frontend/ir/attention_views.h; the input's shape must then be
// concrete), else the inputs' shapes.
absl::StatusOr<std::vector<Shape>> AttentionOperandShapes(const InferContext& ctx, int first);

// ---------------------------------------------------------------------------------------------
// Rules and their registration.

using Outputs = std::vector<TypeAndShape>;
using InferFn = absl::StatusOr<Outputs> (*)(const InferContext&);
using RuleTable = std::array<InferFn, static_cast<size_t>(OpKind::kNumOps)>;

inline void SetRule(RuleTable& t, OpKind op, InferFn fn) { t[static_cast<size_t>(op)] = fn; }

void RegisterElementwiseRules(RuleTable& t);  // infer_elementwise.cc
void RegisterShapeOpRules(RuleTable& t);      // infer_shape_ops.cc
void RegisterIndexingRules(RuleTable& t);     // infer_indexing.cc
void RegisterNnRules(RuleTable& t);           // infer_nn.cc
void RegisterGradRules(RuleTable& t);         // infer_grad.cc
void RegisterTrainRules(RuleTable& t);        // infer_train.cc (optimizer ops)

// One output of the given type and shape.
inline Outputs One(DType dtype, Shape shape) {
  return Outputs{TypeAndShape{dtype, std::move(shape)}};
}

}  // namespace onnxpipe::ir::infer_internal
