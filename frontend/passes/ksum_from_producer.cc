#include "frontend/passes/ksum_from_producer.h"

#include <string>

#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// The value whose rows the rank-2 `flat` is: `flat` itself, or the input of the Flatten that made it
// when that keeps its input's last dim as the columns.
ValueId FlattenedRows(const ir::Graph& g, ValueId flat) {
  const ir::Node* f = ProducerOf(g, flat, OpKind::kFlatten);
  if (f == nullptr) return g.value(flat).shape_known && g.value(flat).shape.size() == 2 ? flat : ir::kNoValue;
  if (f->inputs.empty()) return ir::kNoValue;
  const ir::Value& in = g.value(f->inputs[0]);
  const ir::Value& out = g.value(flat);
  if (!in.shape_known || !out.shape_known || in.shape.empty() || out.shape.size() != 2) return ir::kNoValue;
  const int64_t axis = f->attrs.Get<int64_t>("axis", 1);
  if (axis != static_cast<int64_t>(in.shape.size()) - 1 && axis != -1) return ir::kNoValue;
  return in.shape.back() == out.shape[1] ? f->inputs[0] : ir::kNoValue;
}

bool Move(ir::Graph* g, const UseInfo&, NodeId id) {
  const ir::Node& mm = g->node(id);
  if (mm.op != OpKind::kFusedMatMul || mm.outputs.size() < 2 || mm.outputs[1] == ir::kNoValue) return false;
  const std::string of = mm.attrs.Get<std::string>("k_sum", "");
  const bool of_a = of == "a";
  if (!of_a && of != "b") return false;
  const bool along_rows = of_a ? mm.attrs.Get<int64_t>("trans_a", 0) != 0 : mm.attrs.Get<int64_t>("trans_b", 0) == 0;
  if (!along_rows) return false;
  const ValueId dy = FlattenedRows(*g, mm.inputs[of_a ? 0 : 1]);
  const NodeId pid = ProducerId(*g, dy);
  if (dy == ir::kNoValue || pid == ir::kNoNode) return false;
  const ir::Node& producer = g->node(pid);
  const int k = ir::ColumnSumsOutput(producer.op, g->value(dy).producer_output);
  if (k < 0) return false;
  if (static_cast<int>(producer.outputs.size()) > k && producer.outputs[k] != ir::kNoValue) return false;
  const ValueId sums = mm.outputs[1];
  const ir::DType to = g->value(sums).dtype;
  ir::Node& p = g->node(pid);
  if (to != g->value(dy).dtype) p.attrs.Set("sums_to", std::string(ir::DTypeName(to)));
  if (static_cast<int>(p.outputs.size()) <= k) p.outputs.resize(k + 1, ir::kNoValue);
  ir::Node& m = g->node(id);
  m.outputs.resize(1);
  m.attrs.Erase("k_sum");
  SetOutput(g, pid, k, sums);
  return true;
}

}  // namespace

absl::StatusOr<bool> KSumFromProducer::Run(ir::Graph* g) { return RewriteEachNode(g, Move); }

}  // namespace onnxpipe::passes
