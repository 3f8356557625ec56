// Kernels of the math ops that position encodings and relative-position buckets use: Sin, Cos,
// Ceil (float), Abs and Sign (float and signed integers), and Min/Max with numpy broadcasting (float and
// integers). Min/Max propagate NaN, as numpy.minimum/maximum and PyTorch's minimum/maximum do.
#include <cmath>
#include <cstdlib>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

template <typename T, typename Op>
absl::StatusOr<ir::Tensor> MapElements(const ir::Node& node, const EvalContext& ctx, const ir::Tensor& x,
                                       Op op) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
  const T* in = x.data<T>();
  T* o = out.mutable_data<T>();
  ParallelFor(x.num_elements(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = op(in[i]);
  });
  return out;
}

template <typename Types, typename Op>
absl::StatusOr<std::vector<ir::Tensor>> UnaryMath(const ir::Node& node,
                                                  const std::vector<ir::Tensor>& in,
                                                  const EvalContext& ctx) {
  return DispatchDType(Types{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
                         using T = typename decltype(tag)::type;
                         ASSIGN_OR_RETURN(ir::Tensor out, MapElements<T>(node, ctx, in[0], Op{}));
                         return std::vector<ir::Tensor>{std::move(out)};
                       });
}

struct SinOp {
  template <typename T> T operator()(T x) const { return std::sin(x); }
};
struct CosOp {
  template <typename T> T operator()(T x) const { return std::cos(x); }
};
struct AbsOp {
  // Through the unsigned type for integers, so |MIN| wraps instead of being UB.
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return x < 0 ? static_cast<T>(U(0) - static_cast<U>(x)) : x;
    } else {
      return std::fabs(x);
    }
  }
};

struct SignOp {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(x)) return x;  // numpy.sign(nan) is nan
    }
    return static_cast<T>((x > T(0)) - (x < T(0)));
  }
};
struct CeilOp {
  template <typename T> T operator()(T x) const { return std::ceil(x); }
};

using AbsTypes = TypeList<float, double, int64_t, int32_t, int8_t>;
using MinMaxTypes = TypeList<float, double, int64_t, int32_t, int8_t, uint8_t>;

REGISTER_CPU_KERNEL(kSin, (UnaryMath<FloatTypes, SinOp>));
REGISTER_CPU_KERNEL(kCos, (UnaryMath<FloatTypes, CosOp>));
REGISTER_CPU_KERNEL(kAbs, (UnaryMath<AbsTypes, AbsOp>));
REGISTER_CPU_KERNEL(kSign, (UnaryMath<AbsTypes, SignOp>));
REGISTER_CPU_KERNEL(kCeil, (UnaryMath<FloatTypes, CeilOp>));

template <typename T, bool kMin>
T Pick(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  if constexpr (kMin) {
    return b < a ? b : a;
  } else {
    return a < b ? b : a;
  }
}

template <bool kMin>
absl::StatusOr<std::vector<ir::Tensor>> MinMaxKernel(const ir::Node& node,
                                                     const std::vector<ir::Tensor>& in,
                                                     const EvalContext& ctx) {
  if (in[1].dtype() != in[0].dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": input 1 has dtype "
                              << ir::DTypeName(in[1].dtype()) << ", expected "
                              << ir::DTypeName(in[0].dtype()) << " like input 0";
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(node, {in[0].dims(), in[1].dims()}));
  return DispatchDType(MinMaxTypes{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), dims));
    const T* pa = in[0].data<T>();
    const T* pb = in[1].data<T>();
    T* po = out.mutable_data<T>();
    StridedLoop loop(dims, {BroadcastStrides(in[0].dims(), dims.size()),
                            BroadcastStrides(in[1].dims(), dims.size())});
    loop.Run([&](int64_t o, const int64_t* off, int64_t len, const int64_t* step) {
      for (int64_t i = 0; i < len; ++i) {
        po[o + i] = Pick<T, kMin>(pa[off[0] + i * step[0]], pb[off[1] + i * step[1]]);
      }
    });
    return std::vector<ir::Tensor>{std::move(out)};
  });
}

REGISTER_CPU_KERNEL(kMin, MinMaxKernel<true>);
REGISTER_CPU_KERNEL(kMax, MinMaxKernel<false>);

}  // namespace
}  // namespace onnxpipe::cpu
