// The IR graph: SSA values produced by at most one node, nodes with typed attributes, graph
// inputs/outputs, and constant values (initializers and folded constants) carrying their data.
// Nodes are kept in a vector in a valid topological order; passes that insert or remove nodes
// call TopoSort() and Compact() (removed nodes are tombstoned until then). Value and node ids
// stay stable until Compact().
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "frontend/ir/attrs.h"
#include "frontend/ir/dtype.h"
#include "frontend/ir/op.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::ir {

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;
constexpr NodeId kNoNode = -1;

enum class Phase : uint8_t { kForward, kBackward, kOptimizer };

// Whether a float initializer is trained. Undecided until the trainable-parameter rule
// (autodiff/trainable.h, run first in the forward pipeline) or the user's --freeze/--train-only
// decides; a kFrozen initializer (a buffer or an exporter constant) is a constant for fusion and
// autodiff. Meaningless for other values.
enum class ParamState : uint8_t { kUndecided, kTrainable, kFrozen };

// What the exporter recorded an initializer as, when the file records it: torch's dynamo exporter
// stores torch.export's graph signature (which module state is a parameter, which a registered
// buffer or lifted tensor constant) in the graph's metadata, and the loader copies it here.
// kExporterMade: the file has a signature that names none of this initializer, so the exporter
// made it (a lifted literal, or a value it folded, e.g. a weight's transpose or a table gathered at
// fixed positions). kUnrecorded: the file has no signature (the TorchScript exporter, others).
enum class ExportedAs : uint8_t { kUnrecorded, kParameter, kBuffer, kExporterMade };

struct Value {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  bool shape_known = false;  // false until import or shape inference sets it
  NodeId producer = kNoNode;
  int producer_output = 0;
  std::optional<Tensor> constant;                    // initializers and folded constants hold their data
  bool is_initializer = false;                       // came from an ONNX initializer (parameter candidate)
  ParamState param_state = ParamState::kUndecided;   // float initializers: trained or frozen
  ExportedAs exported_as = ExportedAs::kUnrecorded;  // initializers: the exporter's record
  std::string external_file;                         // initializer loaded from this side file (for reports)
};

struct Node {
  OpKind op = OpKind::kIdentity;
  std::string name;              // ONNX node name, e.g. "/layers.3/self_attn/MatMul"
  std::string scope;             // layer scope derived from the name, e.g. "/layers.3/self_attn"
  std::vector<ValueId> inputs;   // kNoValue marks an absent optional input
  std::vector<ValueId> outputs;  // kNoValue marks an unused optional output
  Attrs attrs;
  Phase phase = Phase::kForward;
  // Backward and optimizer nodes: the name of the forward node (or parameter value) they belong to,
  // so that the partitioner keeps a forward op, its gradient ops and its parameters' updates on one
  // stage. Empty for forward nodes.
  std::string origin;
  bool removed = false;
};

// "node 'NAME' (Op)": how an error names a node.
std::string NodeLabel(const Node& n);

// Scope of an ONNX node name: everything before the last '/', e.g.
// "/layers.3/self_attn/MatMul_1" -> "/layers.3/self_attn"; "" when the name has none.
std::string ScopeOfName(const std::string& node_name);

class Graph {
 public:
  // --- values ---
  ValueId AddValue(std::string name, DType dtype, Shape shape, bool shape_known = true);
  ValueId AddConstant(std::string name, Tensor t, bool is_initializer = false);
  Value& value(ValueId id) { return values_[id]; }
  const Value& value(ValueId id) const { return values_[id]; }
  int32_t num_values() const { return static_cast<int32_t>(values_.size()); }
  // Lookup by name (kNoValue if absent). Names are unique.
  ValueId FindValue(const std::string& name) const;
  // A name not used by any value yet, derived from `base`.
  std::string UniqueName(const std::string& base);
  void RenameValue(ValueId id, const std::string& name);

  // --- nodes ---
  NodeId AddNode(OpKind op, std::string name, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                 Attrs attrs = {});
  Node& node(NodeId id) { return nodes_[id]; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  int32_t num_node_slots() const { return static_cast<int32_t>(nodes_.size()); }
  // Live (not removed) node ids in the stored order.
  std::vector<NodeId> LiveNodes() const;
  int64_t num_live_nodes() const;
  // Tombstones the node and clears its outputs' producer.
  void RemoveNode(NodeId id);
  // Rewires every use of `from` (node inputs and graph outputs) to `to`.
  void ReplaceAllUses(ValueId from, ValueId to);
  // For each value, the live nodes that consume it (a node appears once per operand use).
  std::vector<std::vector<NodeId>> ComputeUses() const;

  // Reorders nodes topologically (stable w.r.t. the current order) and drops tombstones,
  // renumbering node ids. Fails naming a node on a cycle.
  absl::Status TopoSort();

  // --- graph interface ---
  std::vector<ValueId>& inputs() { return inputs_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  std::vector<ValueId>& outputs() { return outputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  bool IsGraphOutput(ValueId v) const;

  // State updates of a training graph: after a step, each `new_value` is copied (or aliased) into
  // `state` (a parameter or optimizer-state constant). Empty for forward graphs.
  struct StateUpdate {
    ValueId state = kNoValue;
    ValueId new_value = kNoValue;
  };
  std::vector<StateUpdate>& state_updates() { return state_updates_; }
  const std::vector<StateUpdate>& state_updates() const { return state_updates_; }

  // --- metadata ---
  std::string name;
  std::string producer_name, producer_version;
  int64_t opset = 0;  // default-domain opset version the model was exported with
  int64_t ir_version = 0;
  std::string source_path;                         // the file this graph was imported from
  std::map<std::string, int64_t> symbol_bindings;  // bound symbolic dims ("B" -> 32)

 private:
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<ValueId> inputs_, outputs_;
  std::vector<StateUpdate> state_updates_;
  std::map<std::string, ValueId> by_name_;
};

}  // namespace onnxpipe::ir
