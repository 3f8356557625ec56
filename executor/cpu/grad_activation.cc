// Backward kernels of activations, softmax and normalisation: ReluGrad, GeluGrad (erf and tanh
// forms), DropoutGrad, SoftmaxGrad, LogSoftmaxGrad, LayerNormGrad, RMSNormGrad. Line reductions (softmax,
// LayerNorm rows) accumulate in double, one line per thread; LayerNorm's dScale/dBias sum over
// rows column-block by column-block in row order, so nothing depends on the thread count.
#include <cmath>

#include "executor/cpu/activation.h"
#include "executor/cpu/dropout.h"
#include "executor/cpu/grad_util.h"
#include "executor/cpu/norm_util.h"
#include "executor/cpu/workspace.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

absl::Status ExpectSame(const ir::Node& node, const ir::Tensor& a, const ir::Tensor& b, const char* what) {
  if (a.dims() != b.dims() || a.dtype() != b.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": dY " << ir::DTypeName(a.dtype()) << DimsToString(a.dims())
                              << " and " << what << " " << ir::DTypeName(b.dtype()) << DimsToString(b.dims())
                              << " must have the same dtype and shape";
  }
  return absl::OkStatus();
}

// The node's output: out[i] = f(dy[i], x[i]) over the thread pool.
template <typename T, typename F>
Outputs Pointwise(const ir::Node& node, const EvalContext& ctx, const ir::Tensor& dy, const ir::Tensor& x, F f) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), dy.dims()));
  const T* pg = dy.data<T>();
  const T* px = x.data<T>();
  T* po = out.mutable_data<T>();
  ParallelFor(out.num_elements(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) po[i] = f(pg[i], px[i]);
  });
  return std::vector<ir::Tensor>{out};
}

Outputs ReluGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(ExpectSame(node, in[0], in[1], "Y"));
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    return Pointwise<T>(node, ctx, in[0], in[1], [](T g, T y) { return y > T(0) ? g : T(0); });
  });
}
REGISTER_CPU_KERNEL(kReluGrad, ReluGradKernel);

// Output `k` of `node`, when it is wanted: the sums of `x` (T) over every dim but its last, in double
// and row order (as FusedMatMul's KSum sums its operand), rounded to the dtype of attr sums_to
// (default x's). The bias gradient a gradient kernel forms from its own output (op.h's dXSums).
template <typename T>
absl::Status AppendColumnSums(const ir::Node& node, const EvalContext& ctx, int k, const ir::Tensor& x,
                              std::vector<ir::Tensor>* outs) {
  if (static_cast<int>(node.outputs.size()) <= k || node.outputs[k] == ir::kNoValue) return absl::OkStatus();
  const std::string to = node.attrs.Get<std::string>("sums_to", std::string(ir::DTypeName(x.dtype())));
  const std::optional<ir::DType> t = ir::ParseDType(to);
  if (!t || x.rank() == 0) {
    return INVALID_ARGUMENT() << Describe(node) << ": output " << k << " (column sums) needs a float sums_to and "
                              << "a tensor of rank >= 1, got '" << to << "' and " << DimsToString(x.dims());
  }
  const int64_t cols = x.dims().back(), rows = cols == 0 ? 0 : x.num_elements() / cols;
  std::vector<double> acc(cols, 0.0);
  const T* p = x.data<T>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) acc[c] += static_cast<double>(p[r * cols + c]);
  outs->resize(k + 1);
  return DispatchDType(FloatTypes{}, node, "sums_to", *t, [&](auto tag) -> absl::Status {
    using S = typename decltype(tag)::type;
    ASSIGN_OR_RETURN((*outs)[k], AllocOutput(node, ctx, k, *t, {cols}));
    S* ps = (*outs)[k].template mutable_data<S>();
    for (int64_t c = 0; c < cols; ++c) ps[c] = static_cast<S>(acc[c]);
    return absl::OkStatus();
  });
}

// dX = dY' * Gelu'(X), dY' = dY, or with the forward's fused dropout (attributes dropout, rng_key)
// dY kept and scaled as DropoutGrad would, by the forward's keep bits (input 2) or its regenerated mask;
// dXSums (output 1) when wanted.
Outputs GeluGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  RETURN_IF_ERROR(ExpectSame(node, in[0], in[1], "X"));
  const std::string approx = node.attrs.Get<std::string>("approximate", "none");
  if (approx != "none" && approx != "tanh") {
    return INVALID_ARGUMENT() << Describe(node) << ": approximate is '" << approx << "', expected none|tanh";
  }
  const bool tanh_form = approx == "tanh";
  ASSIGN_OR_RETURN(const FusedDropout drop, DropoutOf(node, ctx, in[0].num_elements()));
  // The forward's keep bits, when given, instead of its regenerated stream.
  const uint8_t* bits = nullptr;
  if (in.size() > 2 && in[2].defined()) {
    RETURN_IF_ERROR(CheckKeepBits(node, in[2], in[1].dims()));
    bits = in[2].data<uint8_t>();
  }
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    // One loop per form, the form decided outside it.
    auto run = [&](auto derivative) -> Outputs {
      if (!drop.active) return Pointwise<T>(node, ctx, in[0], in[1], [&](T g, T x) { return g * derivative(x); });
      ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
      const T* pg = in[0].data<T>();
      const T* px = in[1].data<T>();
      T* po = out.mutable_data<T>();
      const T scale = static_cast<T>(drop.scale);
      auto grad = [&](int64_t i, bool keep) {
        const T g = keep ? pg[i] * scale : T(0);
        po[i] = g * derivative(px[i]);
      };
      if (bits != nullptr) {
        ForEachKeptBit(bits, in[0].num_elements(), grad);
      } else {
        ForEachKept(drop, in[0].num_elements(), grad);
      }
      return std::vector<ir::Tensor>{out};
    };
    Outputs outs =
        tanh_form ? run([](T x) { return GeluTanhDerivative(x); }) : run([](T x) { return GeluErfDerivative(x); });
    if (outs.ok()) RETURN_IF_ERROR(AppendColumnSums<T>(node, ctx, 1, outs->front(), &*outs));
    return outs;
  });
}
REGISTER_CPU_KERNEL(kGeluGrad, GeluGradKernel);

// out = dy kept and scaled, or zeroed: by `mask` when given (drop's scale still applies), else by drop's
// stream (all kept, unscaled, when inactive). DropoutGrad's, and LayerNormGrad's dXDropped.
template <typename T>
void DropoutGradInto(FusedDropout drop, const bool* mask, const T* dy, T* out, int64_t n) {
  const T scale = static_cast<T>(drop.scale);
  if (mask != nullptr) drop.active = false;  // the mask decides
  ForEachKept(drop, n, [&](int64_t i, bool keep) { out[i] = (mask ? mask[i] : keep) ? dy[i] * scale : T(0); });
}

// Outside training the forward Dropout is the identity (mask all true, no 1/(1-ratio) scale), so
// the backward is too. Without the mask input the forward's mask is regenerated from its stream.
Outputs DropoutGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const bool has_mask = in.size() > 1 && in[1].defined();
  if (has_mask && (in[1].dtype() != ir::DType::kBool || in[1].dims() != dy.dims())) {
    return INVALID_ARGUMENT() << Describe(node) << ": mask " << ir::DTypeName(in[1].dtype())
                              << DimsToString(in[1].dims()) << " must be bool with dY's shape "
                              << DimsToString(dy.dims());
  }
  ASSIGN_OR_RETURN(FusedDropout drop, DropoutOf(node, ctx, dy.num_elements()));
  return DispatchDType(FloatTypes{}, node, "input 0", dy.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), dy.dims()));
    DropoutGradInto(drop, has_mask ? in[1].data<bool>() : nullptr, dy.data<T>(), out.mutable_data<T>(),
                    out.num_elements());
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kDropoutGrad, DropoutGradKernel);

// SoftmaxGrad: dx = y (dy - sum(dy y)); LogSoftmaxGrad: dx = dy - exp(y) sum(dy). Lines along
// `axis` of the (outer, n, inner) view.
template <bool kLog>
Outputs SoftmaxGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const ir::Tensor& y = in[1];
  RETURN_IF_ERROR(ExpectSame(node, dy, y, "Y"));
  if (dy.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": inputs must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", -1), dy.rank()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= dy.dims()[d];
  for (int64_t d = axis + 1; d < dy.rank(); ++d) inner *= dy.dims()[d];
  const int64_t n = dy.dims()[axis];
  return DispatchDType(FloatTypes{}, node, "input 0", dy.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dy.dtype(), dy.dims()));
    const T* pg = dy.data<T>();
    const T* py = y.data<T>();
    T* po = out.mutable_data<T>();
    ParallelFor(outer * inner, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      for (int64_t line = b; line < e; ++line) {
        const int64_t base = (line / inner) * n * inner + line % inner;
        double s = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = base + i * inner;
          s += kLog ? static_cast<double>(pg[k]) : static_cast<double>(pg[k]) * py[k];
        }
        for (int64_t i = 0; i < n; ++i) {
          const int64_t k = base + i * inner;
          if constexpr (kLog) {
            po[k] = static_cast<T>(pg[k] - std::exp(static_cast<double>(py[k])) * s);
          } else {
            po[k] = static_cast<T>(py[k] * (pg[k] - s));
          }
        }
      }
    });
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kSoftmaxGrad, SoftmaxGradKernel<false>);
REGISTER_CPU_KERNEL(kLogSoftmaxGrad, SoftmaxGradKernel<true>);

// The inputs LayerNormGrad and RMSNormGrad share: dY (input 0) of X's (input 1) dtype and shape,
// and scale (input 2) of X's dtype, expanded to the normalised shape.
struct NormGradShape {
  NormShape shape;
  ir::Tensor scale;  // shape.n contiguous values
};
absl::StatusOr<NormGradShape> GetNormGradShape(const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor& x = in[1];
  const ir::Tensor& scale = in[2];
  RETURN_IF_ERROR(ExpectSame(node, in[0], x, "X"));
  NormGradShape g;
  ASSIGN_OR_RETURN(g.shape, GetNormShape(node, x, "X"));
  if (scale.dtype() != x.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": scale has dtype " << ir::DTypeName(scale.dtype());
  }
  ASSIGN_OR_RETURN(g.scale, AsNormalizedShape(node, scale, g.shape, "scale"));
  return g;
}

// A norm gradient's incoming dY, plus its optional dY2 input (ir::NormGradDy2Input) element by
// element in the compute dtype: the Sum that SumIntoNormGrad folded in, in its order.
template <typename T>
struct IncomingGrad {
  const T* dy;
  const T* dy2;  // null without dY2
  T operator()(int64_t i) const { return dy2 != nullptr ? static_cast<T>(dy[i] + dy2[i]) : dy[i]; }
};

// The node's dY2 input, checked against dY (null when absent).
absl::StatusOr<const ir::Tensor*> Dy2Input(const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const int i = ir::NormGradDy2Input(node.op);
  if (!HasInput(in, i)) return nullptr;
  RETURN_IF_ERROR(ExpectSame(node, in[0], in[i], "dY2"));
  return &in[i];
}

// LayerNormGrad(dY, X, scale, mean?, inv_std_dev?, dresidual?, dY2?) -> dX, dScale?, dBias?. With
// x^ = (x - mu) r and g = dY * scale over a row of n: dX = r (g - mean(g) - x^ mean(g x^)), rounded
// to X's dtype, plus dresidual (one more rounding: the Add it replaces); dScale = sum over rows of
// dY x^ and dBias = sum of dY, reduced to scale's shape when scale was broadcast. With dY2, dY is
// dY + dY2 in the compute dtype (the Sum it replaces). dXDropped (output 3): DropoutGrad of dX by the
// node's dropout stream (op.h). dXSums, dXDroppedSums (outputs 4, 5): their column sums.
Outputs LayerNormGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const ir::Tensor& x = in[1];
  const ir::Tensor& scale = in[2];
  ASSIGN_OR_RETURN(const NormGradShape g, GetNormGradShape(node, in));
  const NormShape& shape = g.shape;
  const ir::Tensor& s = g.scale;
  const int64_t rows = shape.rows, n = shape.n;
  const bool saved = HasInput(in, 3) && HasInput(in, 4);
  if (saved && (in[3].num_elements() != rows || in[4].num_elements() != rows || in[3].dtype() != x.dtype() ||
                in[4].dtype() != x.dtype())) {
    return INVALID_ARGUMENT() << Describe(node) << ": mean/inv_std_dev must hold " << rows << " "
                              << ir::DTypeName(x.dtype()) << " values";
  }
  const bool has_dres = HasInput(in, 5);
  if (has_dres) RETURN_IF_ERROR(ExpectSame(node, in[5], x, "X"));
  ASSIGN_OR_RETURN(const ir::Tensor* dy2, Dy2Input(node, in));
  const bool dropped = WantsOutput(node, 3);
  if (dropped && !WantsOutput(node, 0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": output 3 (dX through the dropout) needs output 0 (dX)";
  }
  ASSIGN_OR_RETURN(const FusedDropout drop, DropoutOf(node, ctx, x.num_elements()));
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const IncomingGrad<T> grad{dy.data<T>(), dy2 != nullptr ? dy2->data<T>() : nullptr};
    const T* px = x.data<T>();
    const T* ps = s.data<T>();
    ASSIGN_OR_RETURN(Workspace ws, Workspace::Get(node, ctx, LayerNormGradWorkspace(rows)));
    double* mu = ws.at<double>(0);
    double* rstd = ws.at<double>(WorkspacePart(rows * 8));
    // dX only when asked for (a frozen input, e.g. an embedding, needs none): the statistics are
    // computed either way, the parameter gradients below read them.
    ASSIGN_OR_RETURN(ir::Tensor dx, OptionalOutput(node, ctx, 0, x.dtype(), x.dims()));
    T* pdx = dx.defined() ? dx.mutable_data<T>() : nullptr;
    const T* pres = has_dres ? in[5].data<T>() : nullptr;
    ParallelFor(rows, NormRowGrain(n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * n;
        const int64_t row = r * n;
        if (saved) {
          mu[r] = in[3].data<T>()[r];
          rstd[r] = in[4].data<T>()[r];
        } else {
          double sum = 0, sq = 0;
          for (int64_t i = 0; i < n; ++i) sum += xr[i];
          mu[r] = sum / static_cast<double>(n);
          for (int64_t i = 0; i < n; ++i) sq += (xr[i] - mu[r]) * (xr[i] - mu[r]);
          rstd[r] = 1.0 / std::sqrt(sq / static_cast<double>(n) + shape.eps);
        }
        if (pdx == nullptr) continue;
        double mg = 0, mgx = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double g = static_cast<double>(grad(row + i)) * ps[i];
          mg += g;
          mgx += g * (xr[i] - mu[r]) * rstd[r];
        }
        mg /= static_cast<double>(n);
        mgx /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) {
          const double xh = (xr[i] - mu[r]) * rstd[r];
          const T d = static_cast<T>(rstd[r] * (static_cast<double>(grad(row + i)) * ps[i] - mg - xh * mgx));
          pdx[r * n + i] = pres != nullptr ? static_cast<T>(d + pres[r * n + i]) : d;
        }
      }
    });
    std::vector<ir::Tensor> outs = {dx, ir::Tensor(), ir::Tensor()};
    if (dropped) {
      ASSIGN_OR_RETURN(ir::Tensor dxd, AllocOutput(node, ctx, 3, x.dtype(), x.dims()));
      DropoutGradInto<T>(drop, nullptr, pdx, dxd.mutable_data<T>(), dxd.num_elements());
      outs.push_back(dxd);
    }
    // Parameter gradients of the forward's shape (bias: scale's shape when absent from the
    // inputs). When scale was broadcast they are summed over norm_dims first, then reduced.
    const bool direct = scale.dims() == shape.norm_dims;
    ir::Tensor sums[2];
    for (int k = 1; k <= 2; ++k) {
      if (!WantsOutput(node, k)) continue;
      ASSIGN_OR_RETURN(sums[k - 1], ParamGradSum(node, ctx, k, x.dtype(), shape, direct));
    }
    if (sums[0].defined() || sums[1].defined()) {
      T* pds = sums[0].defined() ? sums[0].mutable_data<T>() : nullptr;
      T* pdb = sums[1].defined() ? sums[1].mutable_data<T>() : nullptr;
      constexpr int64_t kBlock = 64;
      ParallelFor((n + kBlock - 1) / kBlock, 1, [&](int64_t b, int64_t e) {
        for (int64_t blk = b; blk < e; ++blk) {
          const int64_t c0 = blk * kBlock, c1 = std::min(n, c0 + kBlock);
          double as[kBlock] = {}, ab[kBlock] = {};
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = c0; c < c1; ++c) {
              const double g = grad(r * n + c);
              as[c - c0] += g * (px[r * n + c] - mu[r]) * rstd[r];
              ab[c - c0] += g;
            }
          }
          for (int64_t c = c0; c < c1; ++c) {
            if (pds) pds[c] = static_cast<T>(as[c - c0]);
            if (pdb) pdb[c] = static_cast<T>(ab[c - c0]);
          }
        }
      });
      for (int k = 1; k <= 2; ++k) {
        if (!sums[k - 1].defined()) continue;
        ASSIGN_OR_RETURN(outs[k], FinishParamGrad(node, ctx, k, sums[k - 1], scale.dims(), direct));
      }
    }
    if (WantsOutput(node, 4) && !dx.defined()) {
      return INVALID_ARGUMENT() << Describe(node) << ": output 4 (dX's sums) needs output 0 (dX)";
    }
    if (WantsOutput(node, 5) && !dropped) {
      return INVALID_ARGUMENT() << Describe(node) << ": output 5 (dXDropped's sums) needs output 3 (dXDropped)";
    }
    if (dx.defined()) RETURN_IF_ERROR(AppendColumnSums<T>(node, ctx, 4, dx, &outs));
    if (dropped) RETURN_IF_ERROR(AppendColumnSums<T>(node, ctx, 5, outs[3], &outs));
    return outs;
  });
}
REGISTER_CPU_KERNEL(kLayerNormGrad, LayerNormGradKernel);

// RMSNormGrad(dY, X, scale, inv_std_dev?, dY2?, dresidual?) -> dX, dScale?. With x^ = x r and g = dY * scale
// over a row of n: dX = r (g - x^ mean(g x^)); dScale = sum over rows of dY x^, reduced to scale's
// shape when scale was broadcast. dY2 and dresidual as LayerNormGrad's.
Outputs RMSNormGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& dy = in[0];
  const ir::Tensor& x = in[1];
  const ir::Tensor& scale = in[2];
  ASSIGN_OR_RETURN(const NormGradShape g, GetNormGradShape(node, in));
  const NormShape& shape = g.shape;
  const ir::Tensor& s = g.scale;
  const int64_t rows = shape.rows, n = shape.n;
  const bool saved = HasInput(in, 3);
  if (saved && (in[3].num_elements() != rows || in[3].dtype() != x.dtype())) {
    return INVALID_ARGUMENT() << Describe(node) << ": inv_std_dev must hold " << rows << " " << ir::DTypeName(x.dtype())
                              << " values";
  }
  const int dres = ir::NormGradResidualInput(node.op);
  const bool has_dres = HasInput(in, dres);
  if (has_dres) RETURN_IF_ERROR(ExpectSame(node, in[dres], x, "X"));
  ASSIGN_OR_RETURN(const ir::Tensor* dy2, Dy2Input(node, in));
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const IncomingGrad<T> grad{dy.data<T>(), dy2 != nullptr ? dy2->data<T>() : nullptr};
    const T* px = x.data<T>();
    const T* ps = s.data<T>();
    const T* pres = has_dres ? in[dres].data<T>() : nullptr;
    ASSIGN_OR_RETURN(Workspace ws, Workspace::Get(node, ctx, RMSNormGradWorkspace(rows)));
    double* rstd = ws.at<double>(0);
    // dX only when asked for, as LayerNormGrad's.
    ASSIGN_OR_RETURN(ir::Tensor dx, OptionalOutput(node, ctx, 0, x.dtype(), x.dims()));
    T* pdx = dx.defined() ? dx.mutable_data<T>() : nullptr;
    ParallelFor(rows, NormRowGrain(n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const T* xr = px + r * n;
        const int64_t row = r * n;
        if (saved) {
          rstd[r] = in[3].data<T>()[r];
        } else {
          double sq = 0;
          for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(xr[i]) * xr[i];
          rstd[r] = 1.0 / std::sqrt(sq / static_cast<double>(n) + shape.eps);
        }
        if (pdx == nullptr) continue;
        double mgx = 0;
        for (int64_t i = 0; i < n; ++i) mgx += static_cast<double>(grad(row + i)) * ps[i] * xr[i] * rstd[r];
        mgx /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) {
          const double xh = xr[i] * rstd[r];
          const T d = static_cast<T>(rstd[r] * (static_cast<double>(grad(row + i)) * ps[i] - xh * mgx));
          pdx[row + i] = pres != nullptr ? static_cast<T>(d + pres[row + i]) : d;
        }
      }
    });
    std::vector<ir::Tensor> outs = {dx, ir::Tensor()};
    if (!WantsOutput(node, 1)) return outs;
    const bool direct = scale.dims() == shape.norm_dims;
    ASSIGN_OR_RETURN(ir::Tensor sum, ParamGradSum(node, ctx, 1, x.dtype(), shape, direct));
    T* pds = sum.mutable_data<T>();
    constexpr int64_t kBlock = 64;
    ParallelFor((n + kBlock - 1) / kBlock, 1, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t c0 = blk * kBlock, c1 = std::min(n, c0 + kBlock);
        double acc[kBlock] = {};
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = c0; c < c1; ++c) acc[c - c0] += static_cast<double>(grad(r * n + c)) * px[r * n + c] * rstd[r];
        }
        for (int64_t c = c0; c < c1; ++c) pds[c] = static_cast<T>(acc[c - c0]);
      }
    });
    ASSIGN_OR_RETURN(outs[1], FinishParamGrad(node, ctx, 1, sum, scale.dims(), direct));
    return outs;
  });
}
REGISTER_CPU_KERNEL(kRMSNormGrad, RMSNormGradKernel);

}  // namespace
}  // namespace onnxpipe::cpu
