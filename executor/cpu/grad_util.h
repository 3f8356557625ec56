// Helpers shared by the backward kernels (grad_*.cc).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {

// Sums float tensor x over the axes along which `target` (right-aligned, numpy rules) broadcasts
// to x's dims; the result has `target` dims. Each output element is a sum in a fixed order,
// accumulated in double, so the result does not depend on the thread count. InvalidArgument
// naming the node when `target` does not broadcast to x. The result is output `index` of the node
// (AllocOutput).
absl::StatusOr<ir::Tensor> ReduceToDims(const ir::Node& node, const EvalContext& ctx, int index,
                                        const ir::Tensor& x, const std::vector<int64_t>& target);

}  // namespace onnxpipe::cpu
