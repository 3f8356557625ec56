// How Attention and AttentionGrad nodes (frontend/ir/op.h) read Q, K, V and write O through the
// optional strided views q_view, k_view, v_view, o_view: one reading for shape inference, the
// kernels, autodiff, the cost model and the ONNX writer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/strided_view.h"

namespace onnxpipe::ir {

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
// that is the gradient only when no operand whose gradient is wanted broadcasts over `batch` and the
// views into each wanted gradient output cover it exactly. `buffers`: the Q, K, V inputs' dims.
// InvalidArgument naming the operand or output otherwise; OK for a node without views.
absl::Status CheckAttentionViewGradients(const Node& node, const std::vector<int64_t>* const buffers[3],
                                         const std::vector<int64_t>& batch);

}  // namespace onnxpipe::ir
