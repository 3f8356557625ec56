// The interface between the autodiff driver (autodiff.cc) and the gradient rules (grad_*.cc, one
// file per op family), after ONNX Runtime's gradient builder: a rule sees one forward node, the
// gradients of its outputs (GO), which inputs need a gradient, and emits backward nodes whose
// results it hands back as input gradients (SetGI). The driver accumulates contributions, names
// parameter gradients and reports errors with the node's name and op.
//
// Every node a rule emits gets Phase::kBackward, origin = the forward node's name and the forward
// node's scope. Emitted values get their dtype and shape computed here (the rules know them), so
// the training graph is typed without re-running shape inference; where an operand's shape is
// unknown the result is marked shape_known = false for ir::InferShapes to fill.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::autodiff {

struct ValueType {
  ir::DType dtype = ir::DType::kF32;
  ir::Shape shape;
  bool shape_known = true;
};

// Numpy broadcasting of two shapes; fails when two dims are neither equal nor 1.
absl::StatusOr<ir::Shape> BroadcastShapes(const ir::Shape& a, const ir::Shape& b);
// Normalises a possibly negative axis against `rank`; fails when out of range.
absl::StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank);

class GradBuilder {
 public:
  GradBuilder(ir::Graph* g, ir::NodeId fwd, std::vector<ir::ValueId> output_grads, std::vector<bool> needs_input_grad);

  // --- the forward node (a copy: emitting nodes may move the graph's node storage) ---
  const ir::Node& node() const { return node_; }
  ir::Graph& graph() { return *g_; }
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  int num_outputs() const { return static_cast<int>(node_.outputs.size()); }
  // Input / output value ids (kNoValue when absent).
  ir::ValueId I(int i) const { return i < num_inputs() ? node_.inputs[i] : ir::kNoValue; }
  ir::ValueId O(int i) const { return i < num_outputs() ? node_.outputs[i] : ir::kNoValue; }
  ValueType TypeOf(ir::ValueId v) const;
  int64_t Rank(ir::ValueId v) const { return static_cast<int64_t>(g_->value(v).shape.size()); }
  // Gradient flowing into output i (kNoValue when none reaches the loss through it).
  ir::ValueId GO(int i) const { return i < static_cast<int>(go_.size()) ? go_[i] : ir::kNoValue; }
  // Whether the driver wants a gradient for input i.
  bool NeedsGI(int i) const { return i < static_cast<int>(needs_.size()) && needs_[i]; }
  // Hands back the gradient of input i (ignored when NeedsGI(i) is false). Its dtype and shape
  // must be those of the input.
  void SetGI(int i, ir::ValueId grad);
  // Input i is the same value as input j, and the gradient handed back for j already holds i's
  // contribution (a fused op writing the gradients of both uses into one buffer).
  void SetGIIncludedIn(int i, int j);
  bool GIIncluded(int i) const { return i < static_cast<int>(included_.size()) && included_[i]; }
  const std::vector<ir::ValueId>& input_grads() const { return gi_; }

  // An error naming the forward node and op.
  absl::Status Error(const std::string& what) const;

  // --- emission ---
  // Adds a backward node with one output of type `out`; returns the output.
  ir::ValueId Emit(ir::OpKind op, std::vector<ir::ValueId> inputs, const ValueType& out, ir::Attrs attrs = {});
  // Adds a backward node with several outputs; an output whose type is nullopt is left absent.
  std::vector<ir::ValueId> EmitMulti(ir::OpKind op, std::vector<ir::ValueId> inputs,
                                     const std::vector<std::optional<ValueType>>& outs, ir::Attrs attrs = {});
  // The outputs of a backward node that gives inputs 0..n-1 their gradients in order: input i's
  // type where NeedsGI(i), else absent (nullopt); trailing absent ones dropped (one kept), for EmitMulti.
  std::vector<std::optional<ValueType>> InputGradTypes(int n) const;
  // Hands back output i of such a node as input i's gradient for every i that needs one.
  void SetInputGrads(const std::vector<ir::ValueId>& grads);
  // A scalar constant of the given dtype.
  ir::ValueId Scalar(double v, ir::DType dtype);
  // Makes forward output i exist (creating it with type `t` when the node had it absent), so a
  // rule can use what the forward kernel saves (Dropout's mask, the loss's log-probabilities).
  ir::ValueId EnsureForwardOutput(int i, const ValueType& t);

  // --- typed helpers (shapes computed here) ---
  absl::StatusOr<ir::ValueId> Add(ir::ValueId a, ir::ValueId b);
  absl::StatusOr<ir::ValueId> Sub(ir::ValueId a, ir::ValueId b);
  absl::StatusOr<ir::ValueId> Mul(ir::ValueId a, ir::ValueId b);
  absl::StatusOr<ir::ValueId> Div(ir::ValueId a, ir::ValueId b);
  absl::StatusOr<ir::ValueId> Pow(ir::ValueId a, ir::ValueId b);
  ir::ValueId Unary(ir::OpKind op, ir::ValueId x);  // Neg, Exp, Log, Sqrt, ... (same type)
  ir::ValueId Cast(ir::ValueId x, ir::DType to);
  // Sums `grad` down to `like`'s shape (the gradient of a broadcast); no node when the shapes
  // already agree.
  ir::ValueId ReduceToShapeOf(ir::ValueId grad, ir::ValueId like);
  ir::ValueId ReshapeLike(ir::ValueId x, ir::ValueId like);
  ir::ValueId ZerosLike(ir::ValueId like);
  // x unsqueezed at `axes` (sorted, non-negative, in output positions) and broadcast to like.
  ir::ValueId ExpandLike(ir::ValueId x, ir::ValueId like, const std::vector<int64_t>& axes, bool mean);
  ir::ValueId Unsqueeze(ir::ValueId x, const std::vector<int64_t>& axes);
  // Flatten(x, axis): (prod(d[:axis]), prod(d[axis:])).
  ir::ValueId Flatten(ir::ValueId x, int64_t axis);
  // Rank >= 2 operands.
  absl::StatusOr<ir::ValueId> FusedMatMul(ir::ValueId a, ir::ValueId b, bool trans_a, bool trans_b, double alpha = 1.0);
  // FusedMatMul of rank-2 operands with its KSum output (op.h): {product, sums over k of op(A) when
  // k_sum is 'a', of op(B) when 'b'}.
  absl::StatusOr<std::pair<ir::ValueId, ir::ValueId>> FusedMatMulWithKSum(ir::ValueId a, ir::ValueId b, bool trans_a,
                                                                          bool trans_b, char k_sum);

 private:
  std::string NextNodeName(ir::OpKind op);
  absl::StatusOr<std::vector<ir::ValueId>> EmitFusedMatMul(ir::ValueId a, ir::ValueId b, bool trans_a, bool trans_b,
                                                           double alpha, char k_sum);
  absl::StatusOr<ir::ValueId> Binary(ir::OpKind op, ir::ValueId a, ir::ValueId b);

  ir::Graph* g_;
  ir::NodeId fwd_id_;
  ir::Node node_;
  std::vector<ir::ValueId> go_;
  std::vector<bool> needs_;
  std::vector<ir::ValueId> gi_;
  std::vector<bool> included_;
  int emitted_ = 0;
};

// A gradient rule. Returns OK after SetGI for every input with NeedsGI(i).
using GradRule = std::function<absl::Status(GradBuilder&)>;

struct GradRuleInfo {
  // Null: the op has no gradient (its outputs never carry one; it cuts the graph).
  GradRule rule;
  // Inputs no gradient flows into (ORT's STOP_GRADIENT_EDGES): indices, shapes, masks.
  std::vector<int> stop_inputs;
  // True for ops registered as non-differentiable on purpose (Shape, comparisons, ...).
  bool no_gradient = false;
};

class GradRegistry {
 public:
  static const GradRegistry& Get();
  // nullptr when the op has no entry (no rule written: an error if it lies on the loss path).
  const GradRuleInfo* Find(ir::OpKind op) const;

  void Register(ir::OpKind op, GradRule rule, std::vector<int> stop_inputs = {});
  void RegisterNoGradient(ir::OpKind op);

 private:
  GradRegistry();
  std::vector<std::optional<GradRuleInfo>> rules_;
};

// Whether input i of n carries a gradient: present, float, and not a stop edge of n's rule. An op
// with no entry counts as differentiable (the autodiff names it if it lies on the loss path).
bool CarriesGradient(const GradRegistry& reg, const ir::Graph& g, const ir::Node& n, int i);

// One per family file; GradRegistry's constructor calls them (explicit calls rather than static
// initialisers, which a static library would drop).
void RegisterElementwiseGradients(GradRegistry& r);
void RegisterMatMulGradients(GradRegistry& r);
void RegisterShapeGradients(GradRegistry& r);
void RegisterReduceGradients(GradRegistry& r);
void RegisterNormActivationGradients(GradRegistry& r);
void RegisterAttentionGradients(GradRegistry& r);
void RegisterGatherDropoutLossGradients(GradRegistry& r);
void RegisterMathGradients(GradRegistry& r);  // grad_math.cc: Sin, Cos, Abs, Min, Max
void RegisterRotaryGradients(GradRegistry& r);  // grad_rotary.cc
void RegisterGatedActivationGradients(GradRegistry& r);  // grad_gated_activation.cc

}  // namespace onnxpipe::autodiff
