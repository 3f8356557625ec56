// LayerNorm (ONNX LayerNormalization semantics) and RMSNorm (ONNX RMSNormalization): normalise over
// dims [axis, rank). LayerNorm returns Y, Mean and InvStdDev, RMSNorm Y and InvStdDev. Mean and InvStdDev have the
// input's dims with the normalised ones set to 1, and the input's float dtype (f32 for f32 input, ONNX's default
// stash_type; f64 for f64 so that gradient checks stay exact). Statistics are two-pass (mean, then centred variance) in
// double, one row per thread. LayerNorm's fused residual (op.h) forms each row of S = residual + X (X through the
// fused dropout) first and normalises it; RMSNorm's (no dropout) likewise.
#include <cmath>
#include <vector>

#include "executor/cpu/dropout.h"
#include "executor/cpu/norm_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

Outputs LayerNormKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(const NormShape shape, GetNormShape(node, x, "input"));
  const int64_t rows = shape.rows, n = shape.n;
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].defined() && in[i].dtype() != x.dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has dtype " << ir::DTypeName(in[i].dtype())
                                << ", expected " << ir::DTypeName(x.dtype());
    }
  }
  ASSIGN_OR_RETURN(ir::Tensor scale, AsNormalizedShape(node, in[1], shape, "input 1 (scale)"));
  ir::Tensor bias;
  if (HasInput(in, 2)) {
    ASSIGN_OR_RETURN(bias, AsNormalizedShape(node, in[2], shape, "input 2 (bias)"));
  }
  const bool residual = HasInput(in, 3);
  if (residual && in[3].dims() != x.dims()) {
    return INVALID_ARGUMENT() << Describe(node) << ": residual " << DimsToString(in[3].dims()) << " is not input "
                              << DimsToString(x.dims());
  }
  ASSIGN_OR_RETURN(const FusedDropout drop, DropoutOf(node, ctx, x.num_elements()));
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor y, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
    ASSIGN_OR_RETURN(ir::Tensor mean, OptionalOutput(node, ctx, 1, x.dtype(), shape.stat_dims));
    ASSIGN_OR_RETURN(ir::Tensor inv_std, OptionalOutput(node, ctx, 2, x.dtype(), shape.stat_dims));
    // With a residual each row normalises S = residual + X kept and scaled by the fused dropout (op.h),
    // formed row by row into the Sum output, or into a row buffer when nothing reads S.
    ASSIGN_OR_RETURN(ir::Tensor sum_out, OptionalOutput(node, ctx, 3, x.dtype(), x.dims()));
    const T* pr = residual ? in[3].data<T>() : nullptr;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    const T* pb = bias.defined() ? bias.data<T>() : nullptr;
    T* py = y.mutable_data<T>();
    T* pm = mean.defined() ? mean.mutable_data<T>() : nullptr;
    T* pi = inv_std.defined() ? inv_std.mutable_data<T>() : nullptr;
    T* psum = sum_out.defined() ? sum_out.mutable_data<T>() : nullptr;
    const T keep_scale = static_cast<T>(drop.scale);
    ParallelFor(rows, NormRowGrain(n), [&](int64_t b, int64_t e) {
      std::vector<T> row(residual && psum == nullptr ? n : 0);
      std::vector<uint8_t> keep(drop.active ? n : 0);
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * n;
        T* yr = py + r * n;
        if (residual) {
          T* sr = psum != nullptr ? psum + r * n : row.data();
          if (drop.active) FillDropoutKeepMask(drop.stream, drop.base + r * n, drop.base + (r + 1) * n, keep.data());
          for (int64_t i = 0; i < n; ++i) {
            sr[i] = pr[r * n + i] + (!drop.active ? xr[i] : keep[i] != 0 ? xr[i] * keep_scale : T(0));
          }
          xr = sr;
        }
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += xr[i];
        const double mu = sum / static_cast<double>(n);
        double sq = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double c = xr[i] - mu;
          sq += c * c;
        }
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(n) + shape.eps);
        for (int64_t i = 0; i < n; ++i) {
          double v = (xr[i] - mu) * inv * ps[i];
          if (pb) v += pb[i];
          yr[i] = static_cast<T>(v);
        }
        if (pm) pm[r] = static_cast<T>(mu);
        if (pi) pi[r] = static_cast<T>(inv);
      }
    });
    std::vector<ir::Tensor> out = {y, mean, inv_std};
    if (WantsOutput(node, 3)) out.push_back(sum_out);
    return out;
  });
}
REGISTER_CPU_KERNEL(kLayerNorm, LayerNormKernel);

// RMSNorm(X, scale, residual?) -> Y = X r scale, InvStdDev r = 1 / sqrt(mean(X^2) + eps) per row, in double,
// and with a residual Sum: X above is S = residual + X.
Outputs RMSNormKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  ASSIGN_OR_RETURN(const NormShape shape, GetNormShape(node, x, "input"));
  const int64_t rows = shape.rows, n = shape.n;
  if (in[1].dtype() != x.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": input 1 (scale) has dtype " << ir::DTypeName(in[1].dtype())
                              << ", expected " << ir::DTypeName(x.dtype());
  }
  ASSIGN_OR_RETURN(ir::Tensor scale, AsNormalizedShape(node, in[1], shape, "input 1 (scale)"));
  const bool residual = HasInput(in, 2);
  if (residual && (in[2].dims() != x.dims() || in[2].dtype() != x.dtype())) {
    return INVALID_ARGUMENT() << Describe(node) << ": residual " << ir::DTypeName(in[2].dtype())
                              << DimsToString(in[2].dims()) << " is not input " << ir::DTypeName(x.dtype())
                              << DimsToString(x.dims());
  }
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor y, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
    ASSIGN_OR_RETURN(ir::Tensor inv_std, OptionalOutput(node, ctx, 1, x.dtype(), shape.stat_dims));
    // With a residual each row normalises S = residual + X, rounded to T as the Add it replaces stored it, formed
    // into the Sum output or a row buffer.
    ASSIGN_OR_RETURN(ir::Tensor sum_out, OptionalOutput(node, ctx, 2, x.dtype(), x.dims()));
    const T* pr = residual ? in[2].data<T>() : nullptr;
    const T* px = x.data<T>();
    const T* ps = scale.data<T>();
    T* py = y.mutable_data<T>();
    T* pi = inv_std.defined() ? inv_std.mutable_data<T>() : nullptr;
    T* psum = sum_out.defined() ? sum_out.mutable_data<T>() : nullptr;
    ParallelFor(rows, NormRowGrain(n), [&](int64_t b, int64_t e) {
      std::vector<T> row(residual && psum == nullptr ? n : 0);
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * n;
        T* yr = py + r * n;
        if (residual) {
          T* sr = psum != nullptr ? psum + r * n : row.data();
          for (int64_t i = 0; i < n; ++i) sr[i] = static_cast<T>(pr[r * n + i] + xr[i]);
          xr = sr;
        }
        double sq = 0;
        for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(xr[i]) * xr[i];
        const double inv = 1.0 / std::sqrt(sq / static_cast<double>(n) + shape.eps);
        for (int64_t i = 0; i < n; ++i) yr[i] = static_cast<T>(xr[i] * inv * ps[i]);
        if (pi) pi[r] = static_cast<T>(inv);
      }
    });
    std::vector<ir::Tensor> out = {y, inv_std};
    if (WantsOutput(node, 2)) out.push_back(sum_out);
    return out;
  });
}
REGISTER_CPU_KERNEL(kRMSNorm, RMSNormKernel);

}  // namespace
}  // namespace onnxpipe::cpu
