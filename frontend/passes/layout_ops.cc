#include "frontend/passes/layout_ops.h"

#include "frontend/ir/shape.h"

namespace onnxpipe::passes {

std::optional<std::vector<int64_t>> ConcreteDims(const ir::Graph& g, ir::ValueId v) {
  if (v == ir::kNoValue || !g.value(v).shape_known || !ir::IsConcrete(g.value(v).shape)) return std::nullopt;
  return ir::ToInts(g.value(v).shape);
}

bool ReshapesData(ir::OpKind op) {
  return op == ir::OpKind::kReshape || op == ir::OpKind::kFlatten || op == ir::OpKind::kSqueeze ||
         op == ir::OpKind::kUnsqueeze || op == ir::OpKind::kIdentity;
}

std::vector<int64_t> TransposePerm(const ir::Node& n, size_t rank) {
  std::vector<int64_t> perm = n.attrs.Get<std::vector<int64_t>>("perm", {});
  if (perm.empty())
    for (size_t d = rank; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  return perm;
}

}  // namespace onnxpipe::passes
