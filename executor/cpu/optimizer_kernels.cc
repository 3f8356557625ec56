// Optimizer kernels: SumSquares, SumScalars and ClipScale (global-norm gradient clipping), SGDUpdate and
// AdamWUpdate (frontend/ir/op.h states their semantics). f32 and f64.
//
// They reproduce torch.optim's single-tensor (foreach=False) code path operation by operation:
// scalar hyper-parameters are combined in double on the host side of the formula (as Python does
// before handing them to a tensor op) and then rounded to the tensor's dtype, and every tensor op
// of the PyTorch update is one rounding step here, in the same order. Kernels never update in
// place: the trainer moves the outputs into the parameter store (Graph::state_updates()).
#include <cmath>
#include <cstring>
#include <string>

#include "executor/cpu/kernel_util.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;
// SumSquares reduces fixed-size chunks (the boundaries depend only on the element count, never on
// the thread count) and adds the chunk sums in order, so its result is bit-reproducible.
constexpr int64_t kChunk = 1 << 15;

using Result = absl::StatusOr<std::vector<ir::Tensor>>;

absl::Status ExpectScalar(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t i,
                          const char* what) {
  if (in[i].num_elements() != 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": " << what << " (input " << i
                              << ") must be a scalar, got dims " << DimsToString(in[i].dims());
  }
  return absl::OkStatus();
}

// Each input in `others` must be present and have the dtype and dims of input `like`.
absl::Status ExpectLike(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t like,
                        std::initializer_list<size_t> others) {
  for (size_t i : others) {
    if (!HasInput(in, i)) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is required";
    }
    if (in[i].dtype() != in[like].dtype() || in[i].dims() != in[like].dims()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is "
                                << ir::DTypeName(in[i].dtype()) << DimsToString(in[i].dims())
                                << " but input " << like << " is "
                                << ir::DTypeName(in[like].dtype()) << DimsToString(in[like].dims());
    }
  }
  return absl::OkStatus();
}

// The clipping factor at input `i` when present (1 otherwise), in T.
template <typename T>
absl::StatusOr<T> ReadScale(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t i) {
  if (!HasInput(in, i)) return T(1);
  RETURN_IF_ERROR(ExpectScalar(node, in, i, "scale"));
  return static_cast<T>(in[i].GetAsDouble(0));
}

// --- SumSquares ------------------------------------------------------------------------------

template <typename T>
double SumSquaresOf(const ir::Tensor& x) {
  const T* p = x.data<T>();
  const int64_t n = x.num_elements();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Chunk sums are added in chunk order whatever the thread count; they are computed a group at a
  // time into a stack array, so nothing is allocated.
  constexpr int64_t kGroup = 256;
  double partial[kGroup];
  double total = 0;
  for (int64_t c0 = 0; c0 < chunks; c0 += kGroup) {
    const int64_t group = std::min(kGroup, chunks - c0);
    ParallelFor(group, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = c0 + b; c < c0 + e; ++c) {
        double s = 0;
        const int64_t end = std::min(n, (c + 1) * kChunk);
        for (int64_t i = c * kChunk; i < end; ++i) s += static_cast<double>(p[i]) * p[i];
        partial[c - c0] = s;
      }
    });
    for (int64_t c = 0; c < group; ++c) total += partial[c];
  }
  return total;
}

// The result dtype of SumSquares and SumScalars: attr `to`, input 0's dtype by default.
absl::StatusOr<ir::DType> ResultDType(const ir::Node& node, ir::DType input) {
  if (!node.attrs.Has("to")) return input;
  const std::optional<ir::DType> to = ir::ParseDType(node.attrs.Get<std::string>("to", ""));
  if (!to || !ir::IsFloat(*to)) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute 'to' is not a float type name";
  }
  return *to;
}

// A scalar output of dtype `to` holding `total` rounded to it.
Result ScalarResult(const ir::Node& node, const EvalContext& ctx, ir::DType input, double total) {
  ASSIGN_OR_RETURN(const ir::DType to, ResultDType(node, input));
  return DispatchDType(FloatTypes{}, node, "attribute 'to'", to, [&](auto tag) -> Result {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, to, {}));
    out.mutable_data<T>()[0] = static_cast<T>(total);
    return std::vector<ir::Tensor>{out};
  });
}

absl::Status ExpectAllOf(const ir::Node& node, const std::vector<ir::Tensor>& in, ir::DType dt) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (!HasInput(in, i)) return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is absent";
    if (in[i].dtype() != dt) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " is " << ir::DTypeName(in[i].dtype())
                                << " but input 0 is " << ir::DTypeName(dt);
    }
  }
  return absl::OkStatus();
}

Result SumSquaresKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                        const EvalContext& ctx) {
  if (in.empty() || !HasInput(in, 0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": needs at least one input";
  }
  const ir::DType dt = in[0].dtype();
  RETURN_IF_ERROR(ExpectAllOf(node, in, dt));
  return DispatchDType(FloatTypes{}, node, "input 0", dt, [&](auto tag) -> Result {
    using T = typename decltype(tag)::type;
    double total = 0;
    for (const ir::Tensor& x : in) total += SumSquaresOf<T>(x);
    return ScalarResult(node, ctx, dt, total);
  });
}

Result SumScalarsKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  if (in.empty() || !HasInput(in, 0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": needs at least one input";
  }
  RETURN_IF_ERROR(ExpectAllOf(node, in, in[0].dtype()));
  double total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    RETURN_IF_ERROR(ExpectScalar(node, in, i, "term"));
    total += in[i].GetAsDouble(0);
  }
  return ScalarResult(node, ctx, in[0].dtype(), total);
}

// --- ClipScale -------------------------------------------------------------------------------

Result ClipScaleKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                       const EvalContext& ctx) {
  RETURN_IF_ERROR(ExpectScalar(node, in, 0, "norm"));
  const double max_norm = node.attrs.Get<double>("max_norm", 0.0);
  const double eps = node.attrs.Get<double>("eps", 1e-6);
  if (!(max_norm > 0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute max_norm must be positive, got "
                              << max_norm;
  }
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Result {
    using T = typename decltype(tag)::type;
    // clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1; both
    // operations are tensor ops in the gradients' dtype.
    const T norm = in[0].data<T>()[0];
    const T coef = static_cast<T>(max_norm) / (norm + static_cast<T>(eps));
    const T scale = coef < T(1) ? coef : (std::isnan(coef) ? coef : T(1));
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), {}));
    out.mutable_data<T>()[0] = scale;
    return std::vector<ir::Tensor>{out};
  });
}

// An update's optional outputs (op.h), appended to `out` at their indices where the node has them: the gradient's
// sum of squares, SumSquares(grad) in f64, and the compute copy, param' cast to attr copy_to's half dtype.
template <typename T>
absl::Status AppendExtras(const ir::Node& node, const EvalContext& ctx, const ir::Tensor& grad, ir::Tensor param,
                          std::vector<ir::Tensor>* out) {
  const int sums = ir::UpdateSumSquaresOutput(node.op), copy = ir::UpdateComputeCopyOutput(node.op);
  if (WantsOutput(node, sums)) {
    out->resize(sums);  // an absent output before it stays undefined
    ASSIGN_OR_RETURN(ir::Tensor s, AllocOutput(node, ctx, sums, ir::DType::kF64, {}));
    s.mutable_data<double>()[0] = SumSquaresOf<T>(grad);
    out->push_back(std::move(s));
  }
  if (WantsOutput(node, copy)) {
    const std::optional<ir::DType> to = ir::ParseDType(node.attrs.Get<std::string>("copy_to", ""));
    if (!to || !ir::IsHalf(*to)) {
      return INVALID_ARGUMENT() << Describe(node) << ": the compute copy output needs attribute copy_to naming bf16 "
                                                     "or f16";
    }
    const ir::Tensor cast = param.CastTo(*to);
    out->resize(copy);
    ASSIGN_OR_RETURN(ir::Tensor c, AllocOutput(node, ctx, copy, *to, param.dims()));
    std::memcpy(c.raw(), cast.raw(), cast.num_bytes());
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

// --- SGDUpdate -------------------------------------------------------------------------------
// Inputs: 0 param, 1 grad, 2 lr, 3 momentum_buf (absent when momentum == 0), 4 scale?. Outputs: param',
// momentum_buf'?, grad sum of squares?, compute copy?.

Result SGDUpdateKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                       const EvalContext& ctx) {
  const double momentum = node.attrs.Get<double>("momentum", 0.0);
  const bool nesterov = node.attrs.Get<int64_t>("nesterov", 0) != 0;
  const double weight_decay = node.attrs.Get<double>("weight_decay", 0.0);
  RETURN_IF_ERROR(ExpectLike(node, in, 0, {1}));
  if (momentum != 0) {
    RETURN_IF_ERROR(ExpectLike(node, in, 0, {3}));
  } else if (HasInput(in, 3)) {
    return INVALID_ARGUMENT() << Describe(node) << ": has a momentum buffer but momentum is 0";
  }
  if (nesterov && momentum == 0) {
    return INVALID_ARGUMENT() << Describe(node) << ": nesterov needs a non-zero momentum";
  }
  RETURN_IF_ERROR(ExpectScalar(node, in, 2, "lr"));
  const double lr = in[2].GetAsDouble(0);

  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Result {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(const T scale, ReadScale<T>(node, in, 4));
    const bool scaled = HasInput(in, 4);
    const T wd = static_cast<T>(weight_decay), mom = static_cast<T>(momentum);
    const T neg_lr = static_cast<T>(-lr);
    const int64_t n = in[0].num_elements();
    ASSIGN_OR_RETURN(ir::Tensor p_out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
    ir::Tensor buf_out;  // the new momentum buffer, when the node outputs it
    if (momentum != 0 && WantsOutput(node, 1)) {
      ASSIGN_OR_RETURN(buf_out, AllocOutput(node, ctx, 1, in[0].dtype(), in[0].dims()));
    }
    const T* p = in[0].data<T>();
    const T* g = in[1].data<T>();
    const T* buf = momentum != 0 ? in[3].data<T>() : nullptr;
    T* po = p_out.mutable_data<T>();
    T* bo = buf_out.defined() ? buf_out.mutable_data<T>() : nullptr;
    ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T d = scaled ? g[i] * scale : g[i];
        if (weight_decay != 0) d = d + wd * p[i];  // d_p.add(param, alpha=weight_decay)
        if (momentum != 0) {
          // buf.mul_(momentum).add_(d_p); PyTorch's first step clones d_p instead, which is the
          // same number when the buffer starts at zero.
          const T nb = buf[i] * mom + d;
          if (bo) bo[i] = nb;
          d = nesterov ? d + mom * nb : nb;
        }
        po[i] = p[i] + neg_lr * d;  // param.add_(d_p, alpha=-lr)
      }
    });
    std::vector<ir::Tensor> out{std::move(p_out)};
    if (node.outputs.size() > 1) out.push_back(std::move(buf_out));
    RETURN_IF_ERROR(AppendExtras<T>(node, ctx, in[1], out[0], &out));
    return out;
  });
}

// --- AdamWUpdate -----------------------------------------------------------------------------
// Inputs: 0 param, 1 grad, 2 m, 3 v, 4 lr, 5 step, 6 scale?.

Result AdamWUpdateKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                         const EvalContext& ctx) {
  const double beta1 = node.attrs.Get<double>("beta1", 0.9);
  const double beta2 = node.attrs.Get<double>("beta2", 0.999);
  const double eps = node.attrs.Get<double>("eps", 1e-8);
  const double weight_decay = node.attrs.Get<double>("weight_decay", 0.01);
  RETURN_IF_ERROR(ExpectLike(node, in, 0, {1, 2, 3}));
  if (!HasInput(in, 4) || !HasInput(in, 5)) {
    return INVALID_ARGUMENT() << Describe(node) << ": lr (input 4) and step (input 5) are required";
  }
  RETURN_IF_ERROR(ExpectScalar(node, in, 4, "lr"));
  RETURN_IF_ERROR(ExpectScalar(node, in, 5, "step"));
  const double lr = in[4].GetAsDouble(0);
  const int64_t step = in[5].GetAsInt(0);
  if (step < 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": step must be >= 1 (1-based update count), got "
                              << step;
  }
  // Host-side scalars, in double as torch.optim computes them in Python.
  const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  const double decay = 1 - lr * weight_decay;

  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Result {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(const T scale, ReadScale<T>(node, in, 6));
    const bool scaled = HasInput(in, 6);
    const T t_decay = static_cast<T>(decay);
    const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1 - beta1);
    const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1 - beta2);
    const T bc2_sqrt = static_cast<T>(bias_correction2_sqrt);
    const T t_eps = static_cast<T>(eps);
    const T neg_step_size = static_cast<T>(-step_size);
    const int64_t n = in[0].num_elements();
    ASSIGN_OR_RETURN(ir::Tensor p_out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
    ASSIGN_OR_RETURN(ir::Tensor m_out, AllocOutput(node, ctx, 1, in[0].dtype(), in[0].dims()));
    ASSIGN_OR_RETURN(ir::Tensor v_out, AllocOutput(node, ctx, 2, in[0].dtype(), in[0].dims()));
    const T* p = in[0].data<T>();
    const T* g = in[1].data<T>();
    const T* m = in[2].data<T>();
    const T* v = in[3].data<T>();
    T* po = p_out.mutable_data<T>();
    T* mo = m_out.mutable_data<T>();
    T* vo = v_out.mutable_data<T>();
    ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T gi = scaled ? g[i] * scale : g[i];
        const T pd = p[i] * t_decay;                          // param.mul_(1 - lr*wd)
        const T mi = m[i] * b1 + one_minus_b1 * gi;           // exp_avg.mul_(b1).add_(g, 1-b1)
        const T vi = v[i] * b2 + one_minus_b2 * gi * gi;      // exp_avg_sq.mul_(b2).addcmul_(g, g)
        const T denom = std::sqrt(vi) / bc2_sqrt + t_eps;     // (sqrt(v) / bc2_sqrt).add_(eps)
        mo[i] = mi;
        vo[i] = vi;
        po[i] = pd + neg_step_size * (mi / denom);            // addcdiv_(m, denom, -step_size)
      }
    });
    std::vector<ir::Tensor> out{std::move(p_out), std::move(m_out), std::move(v_out)};
    RETURN_IF_ERROR(AppendExtras<T>(node, ctx, in[1], out[0], &out));
    return out;
  });
}

REGISTER_CPU_KERNEL(kSumSquares, SumSquaresKernel);
REGISTER_CPU_KERNEL(kSumScalars, SumScalarsKernel);
REGISTER_CPU_KERNEL(kClipScale, ClipScaleKernel);
REGISTER_CPU_KERNEL(kSGDUpdate, SGDUpdateKernel);
REGISTER_CPU_KERNEL(kAdamWUpdate, AdamWUpdateKernel);

}  // namespace
}  // namespace onnxpipe::cpu
