// Workspace sizes per op and the Workspace buffer. The sizes here and the kernels' requests are
// the same functions of the same dims, so planned and used workspace agree exactly.
#include "executor/cpu/workspace.h"

#include <optional>

#include "executor/cpu/kernel_util.h"
#include "frontend/ir/attention_views.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::cpu {

absl::StatusOr<Workspace> Workspace::Get(const ir::Node& node, const EvalContext& ctx, int64_t bytes) {
  Workspace w;
  if (bytes <= 0) return w;
  if (ctx.outputs != nullptr) {
    ASSIGN_OR_RETURN(void* p, ctx.outputs->Workspace(node, bytes));
    w.data_ = static_cast<uint8_t*>(p);
  } else {
    w.owned_ = std::make_unique<uint8_t[]>(static_cast<size_t>(bytes));
    w.data_ = w.owned_.get();
  }
  return w;
}

AttentionWorkspace AttentionWorkspace::Forward(int64_t sq, int64_t sk, int64_t elem_size, bool dropout) {
  AttentionWorkspace w;
  w.probs = 0;
  w.keep = WorkspacePart(sq * sk * elem_size);
  w.total = w.keep + (dropout ? WorkspacePart(sq * sk) : 0);
  return w;
}

AttentionWorkspace AttentionWorkspace::Backward(int64_t sq, int64_t sk, int64_t elem_size, bool dropout,
                                                bool wants_dv) {
  AttentionWorkspace w;
  const int64_t matrix = WorkspacePart(sq * sk * elem_size);
  w.probs = 0;
  w.grad = matrix;
  w.keep = 2 * matrix;
  w.dropped = w.keep + (dropout ? WorkspacePart(sq * sk) : 0);
  w.total = w.dropped + (dropout && wants_dv ? matrix : 0);
  return w;
}

int64_t CpuWorkspaceBytes(const ir::Graph& g, const ir::Node& node) {
  auto dims = [&](size_t i) -> std::optional<std::vector<int64_t>> {
    if (i >= node.inputs.size() || node.inputs[i] == ir::kNoValue) return std::nullopt;
    const ir::Value& v = g.value(node.inputs[i]);
    if (!v.shape_known || !ir::IsConcrete(v.shape)) return std::nullopt;
    return ir::ToInts(v.shape);
  };
  // Attention's q and k are inputs 0, 1 (forward) or 1, 2 (backward, after dO).
  auto attention = [&](size_t q_index, bool backward) -> int64_t {
    const auto qb = dims(q_index), kb = dims(q_index + 1);
    if (!qb || !kb) return 0;
    // Q and K as read, through their views when the node has them.
    const absl::StatusOr<ir::StridedView> q = ir::AttentionOperandView(node, 0, *qb);
    const absl::StatusOr<ir::StridedView> k = ir::AttentionOperandView(node, 1, *kb);
    if (!q.ok() || !k.ok() || q->dims.size() < 2 || k->dims.size() < 2) return 0;
    const int64_t sq = q->dims[q->dims.size() - 2], sk = k->dims[k->dims.size() - 2];
    // Half inputs are computed in f32 (cpu_evaluator.cc): the probabilities are f32 then.
    const ir::DType dt = g.value(node.inputs[q_index]).dtype;
    const int64_t elem = ir::DTypeSize(ir::IsHalf(dt) ? ir::DType::kF32 : dt);
    const bool dropout = node.attrs.Get<double>("dropout", 0.0) > 0.0;
    return backward ? AttentionWorkspace::Backward(sq, sk, elem, dropout, ir::AttentionGradWanted(node, 2)).total
                    : AttentionWorkspace::Forward(sq, sk, elem, dropout).total;
  };
  switch (node.op) {
    case ir::OpKind::kAttention: return attention(0, /*backward=*/false);
    case ir::OpKind::kAttentionGrad: return attention(1, /*backward=*/true);
    case ir::OpKind::kLayerNormGrad:
    case ir::OpKind::kRMSNormGrad: {
      const auto x = dims(1);
      if (!x || x->empty()) return 0;
      const int64_t rank = static_cast<int64_t>(x->size());
      int64_t axis = node.attrs.Get<int64_t>("axis", -1);
      if (axis < 0) axis += rank;
      if (axis < 0 || axis >= rank) return 0;
      int64_t rows = 1;
      for (int64_t d = 0; d < axis; ++d) rows *= (*x)[d];
      return node.op == ir::OpKind::kLayerNormGrad ? LayerNormGradWorkspace(rows) : RMSNormGradWorkspace(rows);
    }
    default: return 0;
  }
}

}  // namespace onnxpipe::cpu
