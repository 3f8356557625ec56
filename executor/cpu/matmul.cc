// GEMM-based kernels: MatMul (numpy semantics: 1-D promotion, broadcast batch dims), Gemm
// (alpha, beta, transA, transB, unidirectionally broadcast C) and the fused Linear (X W (+ bias),
// W stored (K, N) or, with trans_b, (N, K)). All go to cblas_sgemm / cblas_dgemm.
//
// Batch broadcasting is index mapping: each output matrix reads its A and B matrices in place.
// When B has no batch (the Linear/projection case) the whole batch of A is one tall GEMM.
#include <cstring>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

absl::Status SameFloatDType(const ir::Node& node, const std::vector<ir::Tensor>& in) {
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].defined() && in[i].dtype() != in[0].dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has dtype "
                                << ir::DTypeName(in[i].dtype()) << ", expected " << ir::DTypeName(in[0].dtype())
                                << " like input 0";
    }
  }
  return absl::OkStatus();
}

Outputs MatMulKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(SameFloatDType(node, in));
  const ir::Tensor& a = in[0];
  const ir::Tensor& b = in[1];
  if (a.rank() == 0 || b.rank() == 0) {
    return INVALID_ARGUMENT() << Describe(node) << ": inputs must have rank >= 1, got "
                              << DimsToString(a.dims()) << " and " << DimsToString(b.dims());
  }
  std::vector<int64_t> ad = a.dims(), bd = b.dims();
  const bool a_vec = ad.size() == 1, b_vec = bd.size() == 1;
  if (a_vec) ad.insert(ad.begin(), 1);
  if (b_vec) bd.push_back(1);
  const int64_t m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  if (bd[bd.size() - 2] != k) {
    return INVALID_ARGUMENT() << Describe(node) << ": inner dimensions differ: " << DimsToString(a.dims())
                              << " x " << DimsToString(b.dims());
  }
  const std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  ASSIGN_OR_RETURN(std::vector<int64_t> batch, BroadcastDims(node, {a_batch, b_batch}));
  std::vector<int64_t> out_dims = batch;
  if (!a_vec) out_dims.push_back(m);
  if (!b_vec) out_dims.push_back(n);
  int64_t nbatch = 1, a_count = 1, b_count = 1;
  for (int64_t d : batch) nbatch *= d;
  for (int64_t d : a_batch) a_count *= d;
  for (int64_t d : b_batch) b_count *= d;
  RETURN_IF_ERROR(CheckGemmSize(node, b_count == 1 ? a_count * m : m, n, k));
  return DispatchDType(FloatTypes{}, node, "input 0", a.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, a.dtype(), out_dims));
    if (out.num_elements() == 0 || k == 0) return std::vector<ir::Tensor>{out};
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.mutable_data<T>();
    if (b_count == 1 && a_count == nbatch) {
      Gemm<T>(false, false, a_count * m, n, k, T(1), pa, k, pb, n, T(0), po, n);
      return std::vector<ir::Tensor>{out};
    }
    // One GEMM per output matrix; operand matrices found through broadcast strides.
    BroadcastBatchGemm<T>(batch, a_batch, b_batch, /*trans_a=*/false, /*trans_b=*/false, m, n, k, T(1), pa, m * k, k,
                          pb, k * n, n, po);
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kMatMul, MatMulKernel);

Outputs GemmKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(SameFloatDType(node, in));
  const ir::Tensor& a = in[0];
  const ir::Tensor& b = in[1];
  if (a.rank() != 2 || b.rank() != 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": A and B must be 2-D, got " << DimsToString(a.dims())
                              << " and " << DimsToString(b.dims());
  }
  const bool ta = node.attrs.Get<int64_t>("transA", 0) != 0;
  const bool tb = node.attrs.Get<int64_t>("transB", 0) != 0;
  const double alpha = node.attrs.Get<double>("alpha", 1.0);
  const double beta = node.attrs.Get<double>("beta", 1.0);
  const int64_t m = ta ? a.dims()[1] : a.dims()[0], k = ta ? a.dims()[0] : a.dims()[1];
  const int64_t kb = tb ? b.dims()[1] : b.dims()[0], n = tb ? b.dims()[0] : b.dims()[1];
  if (k != kb) {
    return INVALID_ARGUMENT() << Describe(node) << ": inner dimensions differ: op(A) is " << m << "x" << k
                              << ", op(B) is " << kb << "x" << n;
  }
  RETURN_IF_ERROR(CheckGemmSize(node, m, n, k));
  const bool has_c = HasInput(in, 2) && beta != 0.0;
  if (has_c) {
    const ir::Tensor& c = in[2];
    auto bd = BroadcastDims(node, {c.dims(), {m, n}});
    if (!bd.ok() || *bd != std::vector<int64_t>{m, n}) {
      return INVALID_ARGUMENT() << Describe(node) << ": C of shape " << DimsToString(c.dims())
                                << " does not broadcast to (" << m << ", " << n << ")";
    }
  }
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, a.dtype(), {m, n}));
  if (has_c) StridedCopyInto(in[2], BroadcastStrides(in[2].dims(), 2), 0, out);
  return DispatchDType(FloatTypes{}, node, "input 0", a.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    T* po = out.mutable_data<T>();
    if (k == 0) {  // op(A) op(B) is all zeros
      for (int64_t i = 0; i < m * n; ++i) po[i] = has_c ? static_cast<T>(beta) * po[i] : T(0);
    } else {
      Gemm<T>(ta, tb, m, n, k, static_cast<T>(alpha), a.data<T>(), a.dims()[1], b.data<T>(), b.dims()[1],
              has_c ? static_cast<T>(beta) : T(0), po, n);
    }
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kGemm, GemmKernel);

Outputs LinearKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(SameFloatDType(node, in));
  const ir::Tensor& x = in[0];
  const ir::Tensor& w = in[1];
  const bool tb = node.attrs.Get<int64_t>("trans_b", 0) != 0;
  if (x.rank() < 1 || w.rank() != 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": expected X (..., K) and a 2-D W, got "
                              << DimsToString(x.dims()) << " and " << DimsToString(w.dims());
  }
  const int64_t k = x.dims().back();
  const int64_t wk = tb ? w.dims()[1] : w.dims()[0], n = tb ? w.dims()[0] : w.dims()[1];
  if (wk != k) {
    return INVALID_ARGUMENT() << Describe(node) << ": X " << DimsToString(x.dims()) << " and W "
                              << DimsToString(w.dims()) << (tb ? " (trans_b)" : "")
                              << " have different K";
  }
  const bool has_bias = HasInput(in, 2);
  if (has_bias && in[2].num_elements() != n) {
    return INVALID_ARGUMENT() << Describe(node) << ": bias has shape " << DimsToString(in[2].dims())
                              << ", expected " << n << " elements";
  }
  std::vector<int64_t> out_dims(x.dims().begin(), x.dims().end() - 1);
  int64_t m = 1;
  for (int64_t d : out_dims) m *= d;
  out_dims.push_back(n);
  RETURN_IF_ERROR(CheckGemmSize(node, m, n, k));
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), out_dims));
    const int64_t rows = m;
    T* po = out.mutable_data<T>();
    if (has_bias) {
      const T* pb = in[2].data<T>();
      ParallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) std::memcpy(po + r * n, pb, n * sizeof(T));
      });
    }
    if (k > 0) {
      Gemm<T>(false, tb, rows, n, k, T(1), x.data<T>(), k, w.data<T>(), w.dims()[1], has_bias ? T(1) : T(0),
              po, n);
    }
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kLinear, LinearKernel);

}  // namespace
}  // namespace onnxpipe::cpu
