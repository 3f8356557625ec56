#include "frontend/ir/graph.h"

#include <algorithm>
#include <sstream>

#include "frontend/ir/status.h"

namespace onnxpipe::ir {

std::string NodeLabel(const Node& n) { return "node '" + n.name + "' (" + std::string(OpName(n.op)) + ")"; }

std::string ScopeOfName(const std::string& node_name) {
  size_t pos = node_name.rfind('/');
  if (pos == std::string::npos || pos == 0) return "";
  return node_name.substr(0, pos);
}

bool Attrs::operator==(const Attrs& o) const {
  if (values_.size() != o.values_.size()) return false;
  for (const auto& [k, v] : values_) {
    auto it = o.values_.find(k);
    if (it == o.values_.end() || it->second.index() != v.index()) return false;
    if (!(v == it->second)) {
      return false;
    }
  }
  return true;
}

std::string Attrs::ToString() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [k, v] : values_) {
    os << (first ? "" : ", ") << k << "=";
    first = false;
    std::visit(
        [&os](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Tensor>) {
            os << x.DebugString();
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
            os << "[";
            for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
            os << "]";
          } else {
            os << x;
          }
        },
        v);
  }
  return os.str();
}

ValueId Graph::AddValue(std::string name, DType dtype, Shape shape, bool shape_known) {
  ValueId id = static_cast<ValueId>(values_.size());
  if (name.empty() || by_name_.count(name)) name = UniqueName(name.empty() ? "v" : name);
  Value v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.shape_known = shape_known;
  values_.push_back(std::move(v));
  by_name_[name] = id;
  return id;
}

ValueId Graph::AddConstant(std::string name, Tensor t, bool is_initializer) {
  ValueId id = AddValue(std::move(name), t.dtype(), FromInts(t.dims()));
  values_[id].constant = std::move(t);
  values_[id].is_initializer = is_initializer;
  return id;
}

ValueId Graph::FindValue(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? kNoValue : it->second;
}

std::string Graph::UniqueName(const std::string& base) {
  if (!by_name_.count(base)) return base;
  for (int64_t i = 1;; ++i) {
    std::string candidate = base + "_" + std::to_string(i);
    if (!by_name_.count(candidate)) return candidate;
  }
}

void Graph::RenameValue(ValueId id, const std::string& name) {
  by_name_.erase(values_[id].name);
  values_[id].name = name;
  by_name_[name] = id;
}

NodeId Graph::AddNode(OpKind op, std::string name, std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                      Attrs attrs) {
  NodeId id = static_cast<NodeId>(nodes_.size());
  Node n;
  n.op = op;
  n.scope = ScopeOfName(name);
  n.name = std::move(name);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attrs = std::move(attrs);
  for (size_t i = 0; i < n.outputs.size(); ++i) {
    if (n.outputs[i] == kNoValue) continue;
    values_[n.outputs[i]].producer = id;
    values_[n.outputs[i]].producer_output = static_cast<int>(i);
  }
  nodes_.push_back(std::move(n));
  return id;
}

std::vector<NodeId> Graph::LiveNodes() const {
  std::vector<NodeId> out;
  out.reserve(nodes_.size());
  for (NodeId i = 0; i < num_node_slots(); ++i)
    if (!nodes_[i].removed) out.push_back(i);
  return out;
}

int64_t Graph::num_live_nodes() const {
  return std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return !n.removed; });
}

void Graph::RemoveNode(NodeId id) {
  Node& n = nodes_[id];
  n.removed = true;
  for (ValueId v : n.outputs) {
    if (v != kNoValue && values_[v].producer == id) values_[v].producer = kNoNode;
  }
}

void Graph::ReplaceAllUses(ValueId from, ValueId to) {
  for (Node& n : nodes_) {
    if (n.removed) continue;
    for (ValueId& v : n.inputs)
      if (v == from) v = to;
  }
  for (ValueId& v : outputs_)
    if (v == from) v = to;
}

std::vector<std::vector<NodeId>> Graph::ComputeUses() const {
  std::vector<std::vector<NodeId>> uses(values_.size());
  for (NodeId i = 0; i < num_node_slots(); ++i) {
    if (nodes_[i].removed) continue;
    for (ValueId v : nodes_[i].inputs)
      if (v != kNoValue) uses[v].push_back(i);
  }
  return uses;
}

bool Graph::IsGraphOutput(ValueId v) const { return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end(); }

absl::Status Graph::TopoSort() {
  // Kahn's algorithm; ready nodes are taken in their current order so the sort is stable.
  const int32_t n = num_node_slots();
  std::vector<int> pending(n, 0);
  std::vector<std::vector<NodeId>> consumers(n);
  for (NodeId i = 0; i < n; ++i) {
    if (nodes_[i].removed) continue;
    for (ValueId v : nodes_[i].inputs) {
      if (v == kNoValue) continue;
      NodeId p = values_[v].producer;
      if (p == kNoNode || nodes_[p].removed) continue;
      ++pending[i];
      consumers[p].push_back(i);
    }
  }
  std::vector<NodeId> order;
  std::vector<NodeId> ready;  // min-heap by original index keeps the order stable
  for (NodeId i = 0; i < n; ++i)
    if (!nodes_[i].removed && pending[i] == 0) ready.push_back(i);
  std::make_heap(ready.begin(), ready.end(), std::greater<>());
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), std::greater<>());
    NodeId id = ready.back();
    ready.pop_back();
    order.push_back(id);
    for (NodeId c : consumers[id]) {
      if (--pending[c] == 0) {
        ready.push_back(c);
        std::push_heap(ready.begin(), ready.end(), std::greater<>());
      }
    }
  }
  const int64_t live = num_live_nodes();
  if (static_cast<int64_t>(order.size()) != live) {
    for (NodeId i = 0; i < n; ++i) {
      if (!nodes_[i].removed && pending[i] > 0) {
        return INVALID_ARGUMENT() << "graph has a cycle through node '" << nodes_[i].name << "' ("
                                  << OpName(nodes_[i].op) << ")";
      }
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(order.size());
  for (NodeId id : order) sorted.push_back(std::move(nodes_[id]));
  nodes_ = std::move(sorted);
  for (Value& v : values_) v.producer = kNoNode;
  for (NodeId i = 0; i < num_node_slots(); ++i) {
    for (size_t k = 0; k < nodes_[i].outputs.size(); ++k) {
      ValueId v = nodes_[i].outputs[k];
      if (v == kNoValue) continue;
      values_[v].producer = i;
      values_[v].producer_output = static_cast<int>(k);
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::ir
