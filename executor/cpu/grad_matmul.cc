// FusedMatMul: Y = alpha * op(A) @ op(B) with op = optional transpose of the last two dims and
// MatMul's batch broadcasting; the backward GEMMs (dX = dY W^T, dW = X^T dY) without transposed
// copies. cblas_sgemm / cblas_dgemm with their transpose flags; a batch-free B over a batched,
// untransposed A is one tall GEMM. The optional KSum output (rank-2 operands) sums op(A)'s rows or
// op(B)'s columns over k, accumulated in double.
#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs FusedMatMulKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& a = in[0];
  const ir::Tensor& b = in[1];
  if (a.dtype() != b.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": inputs have dtypes " << ir::DTypeName(a.dtype()) << " and "
                              << ir::DTypeName(b.dtype());
  }
  if (a.rank() < 2 || b.rank() < 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": inputs must have rank >= 2, got " << DimsToString(a.dims())
                              << " and " << DimsToString(b.dims());
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
    return INVALID_ARGUMENT() << Describe(node) << ": inner dimensions differ: op(A) of " << DimsToString(ad)
                              << (ta ? " (trans_a)" : "") << " is " << m << "x" << k << ", op(B) of "
                              << DimsToString(bd) << (tb ? " (trans_b)" : "") << " is " << kb << "x" << n;
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
  if (node.attrs.Has("to") && ir::ParseDType(node.attrs.Get<std::string>("to")) != a.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": outputs of dtype '" << node.attrs.Get<std::string>("to")
                              << "' from " << ir::DTypeName(a.dtype()) << " operands (the CPU computes in the "
                              << "operands' dtype)";
  }
  const bool k_sum = node.outputs.size() > 1 && node.outputs[1] != ir::kNoValue;
  const std::string k_sum_of = node.attrs.Get<std::string>("k_sum", "");
  if (k_sum && (ar != 2 || br != 2 || (k_sum_of != "a" && k_sum_of != "b"))) {
    return INVALID_ARGUMENT() << Describe(node) << ": the KSum output needs rank-2 operands and k_sum a or b, got "
                              << DimsToString(ad) << ", " << DimsToString(bd) << " and k_sum '" << k_sum_of << "'";
  }
  return DispatchDType(FloatTypes{}, node, "input 0", a.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, a.dtype(), out_dims));
    std::vector<ir::Tensor> result = {out};
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    if (k_sum) {
      // op(A)[m, k] = A[k, m] under trans_a (A is k x m) else A[m, k]; op(B)[k, n] likewise.
      const bool of_a = k_sum_of == "a";
      const int64_t len = of_a ? m : n;
      ASSIGN_OR_RETURN(ir::Tensor sums, AllocOutput(node, ctx, 1, a.dtype(), {len}));
      const T* p = of_a ? pa : pb;
      const bool along_rows = of_a ? ta : !tb;  // the k index walks the stored rows
      const int64_t cols = of_a ? a_cols : b_cols;
      T* ps = sums.mutable_data<T>();
      for (int64_t i = 0; i < len; ++i) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(along_rows ? p[kk * cols + i] : p[i * cols + kk]);
        ps[i] = static_cast<T>(acc);
      }
      result.push_back(sums);
    }
    if (out.num_elements() == 0 || k == 0) return result;
    T* po = out.mutable_data<T>();
    const T al = static_cast<T>(alpha);
    if (tall) {
      Gemm<T>(false, tb, a_count * m, n, k, al, pa, a_cols, pb, b_cols, T(0), po, n);
      return result;
    }
    BroadcastBatchGemm<T>(batch, a_batch, b_batch, ta, tb, m, n, k, al, pa, a_rows * a_cols, a_cols, pb,
                          b_rows * b_cols, b_cols, po);
    return result;
  });
}
REGISTER_CPU_KERNEL(kFusedMatMul, FusedMatMulKernel);

}  // namespace
}  // namespace onnxpipe::cpu
