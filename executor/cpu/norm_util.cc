#include "executor/cpu/norm_util.h"

#include "executor/cpu/grad_util.h"

namespace onnxpipe::cpu {

absl::StatusOr<NormShape> GetNormShape(const ir::Node& node, const ir::Tensor& x, std::string_view x_name) {
  if (x.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": " << x_name << " must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", -1), x.rank()));
  NormShape s;
  s.eps = node.attrs.Get<double>("epsilon", 1e-5);
  s.norm_dims.assign(x.dims().begin() + axis, x.dims().end());
  for (int64_t d = 0; d < x.rank(); ++d) (d < axis ? s.rows : s.n) *= x.dims()[d];
  s.stat_dims = x.dims();
  for (int64_t d = axis; d < x.rank(); ++d) s.stat_dims[d] = 1;
  return s;
}

absl::StatusOr<ir::Tensor> AsNormalizedShape(const ir::Node& node, const ir::Tensor& t, const NormShape& shape,
                                             std::string_view what) {
  if (t.num_elements() == shape.n) return t;
  const std::vector<int64_t>& norm_dims = shape.norm_dims;
  auto b = BroadcastDims(node, {t.dims(), norm_dims});
  if (!b.ok() || *b != norm_dims) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << what << " has shape " << DimsToString(t.dims())
                              << ", expected the normalised shape " << DimsToString(norm_dims)
                              << " or one that broadcasts to it";
  }
  ir::Tensor full(t.dtype(), norm_dims);
  StridedCopyInto(t, BroadcastStrides(t.dims(), norm_dims.size()), 0, full);
  return full;
}

absl::StatusOr<ir::Tensor> OptionalOutput(const ir::Node& node, const EvalContext& ctx, int index, ir::DType dtype,
                                          const std::vector<int64_t>& dims) {
  if (!WantsOutput(node, index)) return ir::Tensor();
  return AllocOutput(node, ctx, index, dtype, dims);
}

absl::StatusOr<ir::Tensor> ParamGradSum(const ir::Node& node, const EvalContext& ctx, int index, ir::DType dtype,
                                        const NormShape& shape, bool direct) {
  if (direct) return AllocOutput(node, ctx, index, dtype, shape.norm_dims);
  return ir::Tensor(dtype, shape.norm_dims);
}

absl::StatusOr<ir::Tensor> FinishParamGrad(const ir::Node& node, const EvalContext& ctx, int index,
                                           const ir::Tensor& sum, const std::vector<int64_t>& dims, bool direct) {
  if (direct) return sum;
  return ReduceToDims(node, ctx, index, sum, dims);
}

}  // namespace onnxpipe::cpu
