#include "frontend/passes/cast_into_gemm.h"

#include <vector>

#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::DType;
using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

// The Cast to f32 that is the only reader of `v`, else kNoNode.
NodeId OnlyF32Cast(const ir::Graph& g, const UseInfo& uses, ValueId v) {
  if (!uses.HasSingleUse(v)) return ir::kNoNode;
  const std::vector<NodeId> readers = uses.Consumers(v);
  if (readers.size() != 1) return ir::kNoNode;
  const ir::Node& c = g.node(readers[0]);
  if (c.op != OpKind::kCast || g.value(c.outputs[0]).dtype != DType::kF32) return ir::kNoNode;
  return readers[0];
}

bool Fuse(ir::Graph* g, const UseInfo& uses, NodeId id) {
  const ir::Node& mm = g->node(id);
  if (mm.op != OpKind::kFusedMatMul || mm.attrs.Has("to")) return false;
  if (g->value(mm.inputs[0]).dtype != DType::kBF16) return false;
  std::vector<std::pair<int, NodeId>> casts;
  for (int k = 0; k < static_cast<int>(mm.outputs.size()); ++k) {
    if (mm.outputs[k] == ir::kNoValue) continue;
    const NodeId c = OnlyF32Cast(*g, uses, mm.outputs[k]);
    if (c == ir::kNoNode) return false;
    casts.emplace_back(k, c);
  }
  g->node(id).attrs.Set("to", std::string(ir::DTypeName(DType::kF32)));
  for (const auto& [k, c] : casts) {
    const ValueId f32 = g->node(c).outputs[0];
    g->RemoveNode(c);
    SetOutput(g, id, k, f32);
  }
  return true;
}

}  // namespace

absl::StatusOr<bool> CastIntoGemm::Run(ir::Graph* g) { return RewriteEachNode(g, Fuse); }

}  // namespace onnxpipe::passes
