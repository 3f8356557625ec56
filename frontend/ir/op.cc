#include "frontend/ir/op.h"

#include <array>

namespace onnxpipe::ir {

namespace {
constexpr std::array<OpInfo, static_cast<size_t>(OpKind::kNumOps)> kOpInfos = {{
#define V(e, name, min_in, max_in, min_out, max_out, props) {name, min_in, max_in, min_out, max_out, props},
    ONNXPIPE_OP_LIST(V)
#undef V
}};
}  // namespace

const OpInfo& GetOpInfo(OpKind op) { return kOpInfos[static_cast<size_t>(op)]; }

std::optional<OpKind> ParseOpKind(std::string_view name) {
  for (size_t i = 0; i < kOpInfos.size(); ++i) {
    if (kOpInfos[i].name == name) return static_cast<OpKind>(i);
  }
  return std::nullopt;
}

}  // namespace onnxpipe::ir
