// FusedMatMul: Y = alpha * op(A) @ op(B) with op = optional transpose of the last two dims and
// MatMul's batch broadcasting; the backward GEMMs (dX = dY W^T, dW = X^T dY) without transposed
// copies. cblas_sgemm / cblas_dgemm with their transpose flags; a batch-free B over a batched,
// untransposed A is one tall GEMM.
#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs FusedMatMulKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& a = in[0];
  const ir::Tensor& b = in[1];
  if (a.dtype() != b.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": inputs have dtypes " << ir::DTypeName(a.dtype())
                              << " and " << ir::DTypeName(b.dtype());
  }
  if (a.rank() < 2 || b.rank() < 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": inputs must have rank >= 2, got "
                              << DimsToString(a.dims()) << " and " << DimsToString(b.dims());
  }
  const bool ta = node.attrs.Get<int64_t>("trans_a", 0) != 0;
  const bool tb = node.attrs.Get<int64_t>("trans_b", 0) != 0;
  const double alpha = node.attrs.Get<double>("alpha", 1.0);
  const std::vector<int64_t>& ad = a.dims();
  const std::vector<int64_t>& bd = b.dims();
  const int64_t ar = a.rank(), br = b.rank();
  const int64_t a_rows = ad[ar - 2], a_cols = ad[ar - 1], b_rows = bd[br - 2], b_cols = bd[br - 1];
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols;
  const int64_t kb = tb ? b_cols : b_rows, n = tb ? b_rows : b_cols;
  if (k != kb) {
    return INVALID_ARGUMENT() << Describe(node) << ": inner dimensions differ: op(A) of "
                              << DimsToString(ad) << (ta ? " (trans_a)" : "") << " is " << m << "x" << k
                              << ", op(B) of " << DimsToString(bd) << (tb ? " (trans_b)" : "") << " is "
                              << kb << "x" << n;
  }
  const std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  ASSIGN_OR_RETURN(std::vector<int64_t> batch, BroadcastDims(node, {a_batch, b_batch}));
  std::vector<int64_t> out_dims = batch;
  out_dims.push_back(m);
  out_dims.push_back(n);
  int64_t nbatch = 1, a_count = 1, b_count = 1;
  for (int64_t d : batch) nbatch *= d;
  for (int64_t d : a_batch) a_count *= d;
  for (int64_t d : b_batch) b_count *= d;
  const bool tall = b_count == 1 && a_count == nbatch && !ta;
  RETURN_IF_ERROR(CheckGemmSize(node, tall ? a_count * m : m, n, k));
  return DispatchDType(FloatTypes{}, node, "input 0", a.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, a.dtype(), out_dims));
    if (out.num_elements() == 0 || k == 0) return std::vector<ir::Tensor>{out};
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.mutable_data<T>();
    const T al = static_cast<T>(alpha);
    if (tall) {
      Gemm<T>(false, tb, a_count * m, n, k, al, pa, a_cols, pb, b_cols, T(0), po, n);
      return std::vector<ir::Tensor>{out};
    }
    BroadcastBatchGemm<T>(batch, a_batch, b_batch, ta, tb, m, n, k, al, pa, a_rows * a_cols, a_cols, pb,
                          b_rows * b_cols, b_cols, po);
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kFusedMatMul, FusedMatMulKernel);

}  // namespace
}  // namespace onnxpipe::cpu
