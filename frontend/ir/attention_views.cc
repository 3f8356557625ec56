#include "frontend/ir/attention_views.h"

#include "absl/strings/str_cat.h"

namespace onnxpipe::ir {
namespace {

// The value id of operand i (0 Q, 1 K, 2 V): AttentionGrad's inputs start with dO.
ValueId OperandValue(const Node& node, int operand) {
  const size_t at = static_cast<size_t>(operand) + (node.op == OpKind::kAttentionGrad ? 1 : 0);
  return at < node.inputs.size() ? node.inputs[at] : kNoValue;
}

absl::StatusOr<StridedView> ViewOf(const Node& node, int operand, const std::vector<int64_t>& buffer_dims) {
  const char* attr = AttentionViewAttr(operand);
  if (!node.attrs.Has(attr)) return ContiguousView(buffer_dims);
  const std::string what = absl::StrCat(std::string(OpName(node.op)), " node '", node.name, "' attribute ", attr);
  absl::StatusOr<StridedView> v =
      ViewFromInts(node.attrs.Get<std::vector<int64_t>>(attr), ElementCount(buffer_dims), what);
  if (!v.ok()) return v.status();
  if (v->dims.size() < 2 || v->strides.back() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected rank >= 2 with the last stride 1"));
  }
  return v;
}

}  // namespace

int64_t AttentionKvGroup(const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() < 3 || k.size() != q.size() || v.size() != q.size()) return 1;
  const Dim &hq = q.end()[-3], &hk = k.end()[-3], &hv = v.end()[-3];
  if (!hq.is_concrete() || !hk.is_concrete() || hk != hv) return 1;
  const int64_t nq = hq.value(), nk = hk.value();
  return nk >= 1 && nq > nk && nq % nk == 0 ? nq / nk : 1;
}

int64_t AttentionKvGroup(const std::vector<int64_t>& q, const std::vector<int64_t>& k, const std::vector<int64_t>& v) {
  return AttentionKvGroup(FromInts(q), FromInts(k), FromInts(v));
}

const char* AttentionViewAttr(int operand) {
  static const char* const kNames[] = {"q_view", "k_view", "v_view", "o_view"};
  return kNames[operand];
}

bool HasAttentionView(const Node& node, int operand) { return node.attrs.Has(AttentionViewAttr(operand)); }

bool HasAttentionViews(const Node& node) {
  for (int i = 0; i < 4; ++i)
    if (HasAttentionView(node, i)) return true;
  return false;
}

absl::StatusOr<StridedView> AttentionOperandView(const Node& node, int operand,
                                                 const std::vector<int64_t>& buffer_dims) {
  return ViewOf(node, operand, buffer_dims);
}

absl::StatusOr<StridedView> AttentionOutputView(const Node& node, const std::vector<int64_t>& output_dims) {
  return ViewOf(node, 3, output_dims);
}

std::vector<int64_t> AttentionOutputDims(const Node& node, const std::vector<int64_t>& o_dims) {
  if (!HasAttentionView(node, 3)) return o_dims;
  return node.attrs.Get<std::vector<int64_t>>("o_shape", o_dims);
}

int AttentionGradSlot(const Node& node, int operand) {
  if (!HasAttentionView(node, operand)) return operand;
  const ValueId v = OperandValue(node, operand);
  for (int j = 0; j < operand; ++j)
    if (HasAttentionView(node, j) && OperandValue(node, j) == v) return j;
  return operand;
}

bool AttentionGradWanted(const Node& node, int operand) {
  const size_t slot = static_cast<size_t>(AttentionGradSlot(node, operand));
  return slot < node.outputs.size() && node.outputs[slot] != kNoValue;
}

absl::Status CheckAttentionViewGradients(const Node& node, const std::vector<int64_t>* const buffers[3],
                                         const std::vector<int64_t>& batch) {
  if (!HasAttentionViews(node)) return absl::OkStatus();
  // Grouped K and V (fewer heads than Q) are not broadcast: their gradient sums its group in the kernel.
  StridedView read[3];
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<StridedView> v = AttentionOperandView(node, i, *buffers[i]);
    if (!v.ok()) return v.status();
    read[i] = *std::move(v);
  }
  const int64_t group = AttentionKvGroup(read[0].dims, read[1].dims, read[2].dims);
  for (int slot = 0; slot < 3; ++slot) {
    if (AttentionGradSlot(node, slot) != slot || !AttentionGradWanted(node, slot)) continue;
    std::vector<StridedView> views;
    for (int i = slot; i < 3; ++i) {
      if (AttentionGradSlot(node, i) != slot) continue;
      const StridedView* v = &read[i];
      const std::vector<int64_t> own(v->dims.begin(), v->dims.end() - 2);
      if ((i == 0 ? own : UngroupedBatch(own, group)) != batch) {
        return absl::InvalidArgumentError(absl::StrCat(std::string(OpName(node.op)), " node '", node.name,
                                                       "': operand ", i, " is read through a view and broadcast; ",
                                                       "its gradient would be written, not summed, over the batch"));
      }
      views.push_back(*v);
    }
    if (!CoversExactly(ElementCount(*buffers[slot]), views)) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(OpName(node.op)), " node '", node.name,
                                                     "': the views into gradient output ", slot,
                                                     " do not cover it exactly once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::ir
