// The prelude shared by the CPU LayerNorm and RMSNorm kernels and their gradients (norm.cc,
// grad_activation.cc): the split of X into rows of the normalised dims [axis, rank), a scale or
// bias expanded to those dims, and the optional outputs.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {

// X normalised over dims [axis, rank): `rows` rows of `n` contiguous elements.
struct NormShape {
  int64_t rows = 1;
  int64_t n = 1;
  double eps = 1e-5;               // attr epsilon
  std::vector<int64_t> norm_dims;  // X's dims [axis, rank)
  std::vector<int64_t> stat_dims;  // X's dims with [axis, rank) set to 1: Mean and InvStdDev
};

// The NormShape of `x` (named `x_name` in errors; rank >= 1) at the node's attr axis.
absl::StatusOr<NormShape> GetNormShape(const ir::Node& node, const ir::Tensor& x, std::string_view x_name);

// `t` as shape.n contiguous values: exact-size operands are used as is, smaller ones that broadcast
// to the normalised dims are expanded once (a temporary outside any memory plan: such models are
// rare, exports give scale and bias the normalised shape). `what` names `t` in errors.
absl::StatusOr<ir::Tensor> AsNormalizedShape(const ir::Node& node, const ir::Tensor& t, const NormShape& shape,
                                             std::string_view what);

// Output `index` (AllocOutput) when the node wants it, else an undefined tensor.
absl::StatusOr<ir::Tensor> OptionalOutput(const ir::Node& node, const EvalContext& ctx, int index, ir::DType dtype,
                                          const std::vector<int64_t>& dims);

// Rows per ParallelFor task for rows of n elements.
inline int64_t NormRowGrain(int64_t n) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)); }

// A parameter gradient's sum over rows, of the normalised dims: output `index` itself when
// `direct` (scale has the normalised dims), else a temporary that FinishParamGrad reduces.
absl::StatusOr<ir::Tensor> ParamGradSum(const ir::Node& node, const EvalContext& ctx, int index, ir::DType dtype,
                                        const NormShape& shape, bool direct);
// Output `index` from its ParamGradSum: the sum itself when `direct`, else reduced to `dims`.
absl::StatusOr<ir::Tensor> FinishParamGrad(const ir::Node& node, const EvalContext& ctx, int index,
                                           const ir::Tensor& sum, const std::vector<int64_t>& dims, bool direct);

}  // namespace onnxpipe::cpu
