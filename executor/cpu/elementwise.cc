// Unary elementwise kernels: math functions (float only), Neg/Relu (float and signed integers),
// Not (bool), IsNaN (float -> bool), Gelu (erf and tanh forms), Identity and Cast (every dtype,
// bf16/f16 included). Each op is a tiny functor applied by one parallel map, instantiated per dtype
// from a single template.
#include <cmath>
#include <limits>

#include "executor/cpu/activation.h"
#include "executor/cpu/dropout.h"
#include "executor/cpu/half.h"
#include "executor/cpu/kernel_util.h"
#include "frontend/ir/precision.h"

namespace onnxpipe::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;

// The node's output: op applied to every element of x.
template <typename T, typename Op>
absl::StatusOr<std::vector<ir::Tensor>> MapUnary(const ir::Node& node, const EvalContext& ctx, const ir::Tensor& x,
                                                 Op op) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
  const T* in = x.data<T>();
  T* o = out.mutable_data<T>();
  ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = op(in[i]);
  });
  return std::vector<ir::Tensor>{out};
}

// Kernel for `Op::Apply<T>` over the dtypes of `Types`.
template <typename Types, typename Op>
absl::StatusOr<std::vector<ir::Tensor>> UnaryKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                    const EvalContext& ctx) {
  return DispatchDType(Types{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
                         using T = typename decltype(tag)::type;
                         return MapUnary<T>(node, ctx, in[0], [](T v) { return Op::template Apply<T>(v); });
                       });
}

using SignedTypes = TypeList<float, double, int64_t, int32_t, int8_t>;

struct SqrtOp {
  template <typename T>
  static T Apply(T x) {
    return std::sqrt(x);
  }
};
struct ReciprocalOp {
  template <typename T>
  static T Apply(T x) {
    return T(1) / x;
  }
};
struct NegOp {
  // Through the unsigned type so that negating the most negative integer wraps instead of UB.
  template <typename T>
  static T Apply(T x) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x));
    } else {
      return -x;
    }
  }
};
struct ExpOp {
  template <typename T>
  static T Apply(T x) {
    return std::exp(x);
  }
};
struct LogOp {
  template <typename T>
  static T Apply(T x) {
    return std::log(x);
  }
};
struct ErfOp {
  template <typename T>
  static T Apply(T x) {
    return std::erf(x);
  }
};
struct TanhOp {
  template <typename T>
  static T Apply(T x) {
    return std::tanh(x);
  }
};
struct ReluOp {
  // `x < 0 ? 0 : x` keeps NaN, as numpy's clip and PyTorch's relu do.
  template <typename T>
  static T Apply(T x) {
    return x < T(0) ? T(0) : x;
  }
};
struct SigmoidOp {
  template <typename T>
  static T Apply(T x) {
    return Sigmoid(x);
  }
};

REGISTER_CPU_KERNEL(kSqrt, (UnaryKernel<FloatTypes, SqrtOp>));
REGISTER_CPU_KERNEL(kReciprocal, (UnaryKernel<FloatTypes, ReciprocalOp>));
REGISTER_CPU_KERNEL(kNeg, (UnaryKernel<SignedTypes, NegOp>));
REGISTER_CPU_KERNEL(kExp, (UnaryKernel<FloatTypes, ExpOp>));
REGISTER_CPU_KERNEL(kLog, (UnaryKernel<FloatTypes, LogOp>));
REGISTER_CPU_KERNEL(kErf, (UnaryKernel<FloatTypes, ErfOp>));
REGISTER_CPU_KERNEL(kTanh, (UnaryKernel<FloatTypes, TanhOp>));
REGISTER_CPU_KERNEL(kRelu, (UnaryKernel<SignedTypes, ReluOp>));
REGISTER_CPU_KERNEL(kSigmoid, (UnaryKernel<FloatTypes, SigmoidOp>));

absl::StatusOr<std::vector<ir::Tensor>> NotKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                  const EvalContext& ctx) {
  if (in[0].dtype() != ir::DType::kBool) {
    return UnsupportedDType(node, "input 0", in[0].dtype(), {ir::DType::kBool});
  }
  return MapUnary<bool>(node, ctx, in[0], [](bool v) { return !v; });
}
REGISTER_CPU_KERNEL(kNot, NotKernel);

// IsNaN: float in, bool out (SDPA exports guard fully masked rows with Where(IsNaN(p), 0, p)).
absl::StatusOr<std::vector<ir::Tensor>> IsNaNKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                    const EvalContext& ctx) {
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
                         using T = typename decltype(tag)::type;
                         ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, ir::DType::kBool, in[0].dims()));
                         const T* x = in[0].data<T>();
                         bool* o = out.mutable_data<bool>();
                         ParallelFor(in[0].num_elements(), kGrain, [&](int64_t b, int64_t e) {
                           for (int64_t i = b; i < e; ++i) o[i] = std::isnan(x[i]);
                         });
                         return std::vector<ir::Tensor>{out};
                       });
}
REGISTER_CPU_KERNEL(kIsNaN, IsNaNKernel);

// Gelu: x * Phi(x) exactly (approximate = "none") or with the tanh approximation, as
// torch.nn.functional.gelu; with a fused dropout (attribute `dropout`) each result is then kept
// and scaled, or zeroed, as a Dropout node keyed by its rng_key would (dropout.h).
absl::StatusOr<std::vector<ir::Tensor>> GeluKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                   const EvalContext& ctx) {
  const std::string approx = node.attrs.Get<std::string>("approximate", "none");
  if (approx != "none" && approx != "tanh") {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute approximate is '" << approx
                              << "', expected 'none' or 'tanh'";
  }
  const bool tanh_form = approx == "tanh";
  ASSIGN_OR_RETURN(const FusedDropout drop, DropoutOf(node, ctx, in[0].num_elements()));
  return DispatchDType(
      FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
        using T = typename decltype(tag)::type;
        // One loop per form, the form decided outside it.
        auto run = [&](auto gelu) -> absl::StatusOr<std::vector<ir::Tensor>> {
          // The keep bits, when asked for, are drawn first and the values read them.
          ir::Tensor bits;
          if (WantsOutput(node, 1)) {
            ASSIGN_OR_RETURN(bits, AllocKeepBits(node, ctx, 1, in[0].dims()));
            PackKeepBits(drop, in[0].num_elements(), bits.mutable_data<uint8_t>());
          }
          if (!drop.active) {
            ASSIGN_OR_RETURN(std::vector<ir::Tensor> y, MapUnary<T>(node, ctx, in[0], gelu));
            return std::vector<ir::Tensor>{y[0], bits};
          }
          ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
          const T* px = in[0].data<T>();
          T* po = out.mutable_data<T>();
          const T scale = static_cast<T>(drop.scale);
          auto value = [&](int64_t i, bool keep) { po[i] = keep ? gelu(px[i]) * scale : T(0); };
          if (bits.defined()) {
            ForEachKeptBit(bits.data<uint8_t>(), in[0].num_elements(), value);
          } else {
            ForEachKept(drop, in[0].num_elements(), value);
          }
          return std::vector<ir::Tensor>{out, bits};
        };
        if (tanh_form) return run([](T x) { return GeluTanh(x); });
        return run([](T x) { return GeluErf(x); });
      });
}
REGISTER_CPU_KERNEL(kGelu, GeluKernel);

absl::StatusOr<std::vector<ir::Tensor>> IdentityKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                       const EvalContext& ctx) {
  ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, in[0], in[0].dims()));
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kIdentity, IdentityKernel);

// --- Cast -------------------------------------------------------------------------------------
// Float -> integer follows C truncation; NaN gives 0 and out-of-range values saturate (the ONNX
// spec leaves both undefined; C++ would make them undefined behaviour).
template <typename To, typename From>
To ConvertValue(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (std::isnan(v)) return To(0);
    if (v <= static_cast<From>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

using CastTypes = TypeList<float, double, int64_t, int32_t, bool, uint8_t, int8_t>;

// Casts from or to bf16/f16 go through float: a half value widens to float exactly, and a value
// becomes half by rounding its float (nearest even; out of range gives an infinity).
absl::StatusOr<std::vector<ir::Tensor>> CastHalf(const ir::Node& node, const ir::Tensor& x, ir::DType to,
                                                 const EvalContext& ctx) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, to, x.dims()));
  if (ir::IsHalf(x.dtype()) && ir::IsHalf(to)) {
    const uint16_t* s = x.data<uint16_t>();
    uint16_t* d = out.mutable_data<uint16_t>();
    ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = FloatToHalf(to, HalfToFloat(x.dtype(), s[i]));
    });
  } else if (ir::IsHalf(to)) {
    RETURN_IF_ERROR(DispatchDType(CastTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> absl::Status {
      using From = typename decltype(tag)::type;
      const From* s = x.data<From>();
      uint16_t* d = out.mutable_data<uint16_t>();
      ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = FloatToHalf(to, ConvertValue<float, From>(s[i]));
      });
      return absl::OkStatus();
    }));
  } else {
    RETURN_IF_ERROR(DispatchDType(CastTypes{}, node, "attribute 'to'", to, [&](auto tag) -> absl::Status {
      using To = typename decltype(tag)::type;
      const uint16_t* s = x.data<uint16_t>();
      To* d = out.mutable_data<To>();
      ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) d[i] = ConvertValue<To, float>(HalfToFloat(x.dtype(), s[i]));
      });
      return absl::OkStatus();
    }));
  }
  return std::vector<ir::Tensor>{out};
}

absl::StatusOr<std::vector<ir::Tensor>> CastKernel(const ir::Node& node, const std::vector<ir::Tensor>& in,
                                                   const EvalContext& ctx) {
  const std::string to_name = node.attrs.Get<std::string>("to", "");
  std::optional<ir::DType> to = ir::ParseDType(to_name);
  if (!to) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute 'to' is '" << to_name
                              << "', expected an IR dtype name (f32, f64, i64, ...)";
  }
  const ir::Tensor& x = in[0];
  if (*to == x.dtype()) {
    // A no-op cast is a copy (Cast is no view op for the planner).
    ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, x.dims()));
    return std::vector<ir::Tensor>{out};
  }
  if (ir::IsHalf(*to) || ir::IsHalf(x.dtype())) return CastHalf(node, x, *to, ctx);
  return DispatchDType(
      CastTypes{}, node, "input 0", x.dtype(), [&](auto from_tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
        using From = typename decltype(from_tag)::type;
        return DispatchDType(CastTypes{}, node, "attribute 'to'", *to,
                             [&](auto to_tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
                               using To = typename decltype(to_tag)::type;
                               ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, *to, x.dims()));
                               const From* s = x.data<From>();
                               To* d = out.mutable_data<To>();
                               ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
                                 for (int64_t i = b; i < e; ++i) d[i] = ConvertValue<To, From>(s[i]);
                               });
                               return std::vector<ir::Tensor>{out};
                             });
      });
}
REGISTER_CPU_KERNEL(kCast, CastKernel);

}  // namespace
}  // namespace onnxpipe::cpu
