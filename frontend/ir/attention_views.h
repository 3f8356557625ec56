// How Attention and AttentionGrad nodes (frontend/ir/op.h) read Q, K, V and write O through the
// optional strided views q_view, k_view, v_view, o_view: one reading for shape inference, the
// kernels, autodiff, the cost model and the ONNX writer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/shape.h"
#include "frontend/ir/strided_view.h"

namespace onnxpipe::ir {

// Grouped-query attention (op.h): the number of query heads that share one K/V head, Hq / Hkv, when
// Q (..., Hq, Sq, Dh), K (..., Hkv, Sk, Dh) and V (..., Hkv, Sk, Dv) (as read, through their views)
// have one rank >= 3, concrete head dims (dim -3) with Hkv < Hq and Hkv dividing Hq, and K's equal
// to V's; 1 otherwise (the batch dims then broadcast by numpy's rules). Multi-query attention (Hkv = 1)
// is the group of all heads: its gradient is summed by the kernel, also under views (a packed
// projection's one K/V head). Query head h reads K/V head h / group (transformers' repeat_kv order).
int64_t AttentionKvGroup(const Shape& q, const Shape& k, const Shape& v);
int64_t AttentionKvGroup(const std::vector<int64_t>& q, const std::vector<int64_t>& k, const std::vector<int64_t>& v);
// `batch` (an operand's dims without the last two) with its last dim multiplied by `group`: a grouped
// K's or V's batch dims as they broadcast against Q's.
template <typename D>
std::vector<D> UngroupedBatch(std::vector<D> batch, int64_t group) {
  if (group > 1 && !batch.empty()) batch.back() = batch.back() * D(group);
  return batch;
}

// The attribute naming operand i's view: 0 q_view, 1 k_view, 2 v_view, 3 o_view.
const char* AttentionViewAttr(int operand);
// Whether the node has operand i's view.
bool HasAttentionView(const Node& node, int operand);
bool HasAttentionViews(const Node& node);

// Operand i (0 Q, 1 K, 2 V) as read from a buffer of `buffer_dims`: its view, or the whole buffer.
// InvalidArgument naming the node when the view does not fit the buffer or its last stride is not 1.
absl::StatusOr<StridedView> AttentionOperandView(const Node& node, int operand,
                                                 const std::vector<int64_t>& buffer_dims);
// O as written into an output buffer of `output_dims` (o_shape when o_view is set).
absl::StatusOr<StridedView> AttentionOutputView(const Node& node, const std::vector<int64_t>& output_dims);
// The dims of the Attention node's output value: o_shape with o_view, else `o_dims` (O's own).
std::vector<int64_t> AttentionOutputDims(const Node& node, const std::vector<int64_t>& o_dims);

// For operand i (0 Q, 1 K, 2 V) of an Attention or AttentionGrad node: the operand whose gradient
// output carries i's gradient: the first operand j <= i that is the same value, both read through
// views (a packed projection's pieces), else i itself.
int AttentionGradSlot(const Node& node, int operand);
// Whether an AttentionGrad node computes operand i's gradient (its slot's output is present).
bool AttentionGradWanted(const Node& node, int operand);
// Under views an AttentionGrad node writes each gradient through its operand's view, never summing:
// that is the gradient only when no operand whose gradient is wanted broadcasts over `batch` (grouped K
// and V do not: ir::AttentionKvGroup, their kernels sum each group) and the
// views into each wanted gradient output cover it exactly. `buffers`: the Q, K, V inputs' dims.
// InvalidArgument naming the operand or output otherwise; OK for a node without views.
absl::Status CheckAttentionViewGradients(const Node& node, const std::vector<int64_t>* const buffers[3],
                                         const std::vector<int64_t>& batch);

}  // namespace onnxpipe::ir
