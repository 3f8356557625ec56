// Binary and ternary elementwise kernels with numpy broadcasting: Add/Sub/Mul/Div/Pow/Mod,
// comparisons (-> bool), And, Where. Broadcasting is index mapping through StridedLoop (stride 0
// along broadcast dims); no operand is materialised at the output shape.
#include <cmath>
#include <limits>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

// out[i] = op(a[ia], b[ib]) over the broadcast shape of a and b.
template <typename TA, typename TB, typename TOut, typename Op>
absl::StatusOr<ir::Tensor> BinaryBroadcast(const ir::Node& node, const EvalContext& ctx,
                                           const ir::Tensor& a, const ir::Tensor& b, Op op) {
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(node, {a.dims(), b.dims()}));
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, ir::DTypeOf<TOut>::value, dims));
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  TOut* po = out.mutable_data<TOut>();
  StridedLoop loop(dims, {BroadcastStrides(a.dims(), dims.size()), BroadcastStrides(b.dims(), dims.size())});
  loop.Run([&](int64_t o, const int64_t* off, int64_t len, const int64_t* step) {
    const TA* x = pa + off[0];
    const TB* y = pb + off[1];
    TOut* z = po + o;
    // The three common layouts get loops the compiler can vectorise.
    if (step[0] == 1 && step[1] == 1) {
      for (int64_t i = 0; i < len; ++i) z[i] = op(x[i], y[i]);
    } else if (step[0] == 1 && step[1] == 0) {
      const TB yv = *y;
      for (int64_t i = 0; i < len; ++i) z[i] = op(x[i], yv);
    } else if (step[0] == 0 && step[1] == 1) {
      const TA xv = *x;
      for (int64_t i = 0; i < len; ++i) z[i] = op(xv, y[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) z[i] = op(x[i * step[0]], y[i * step[1]]);
    }
  });
  return out;
}

absl::Status SameDType(const ir::Node& node, const std::vector<ir::Tensor>& in, size_t first,
                       size_t last) {
  for (size_t i = first + 1; i <= last; ++i) {
    if (in[i].dtype() != in[first].dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " has dtype "
                                << ir::DTypeName(in[i].dtype()) << ", expected "
                                << ir::DTypeName(in[first].dtype()) << " like input " << first;
    }
  }
  return absl::OkStatus();
}

// Integer Div/Mod by zero is an error (it would trap), checked before any work.
template <typename T>
absl::Status CheckNoZeroDivisor(const ir::Node& node, const ir::Tensor& b) {
  if constexpr (std::is_integral_v<T>) {
    const T* p = b.data<T>();
    for (int64_t i = 0; i < b.num_elements(); ++i) {
      if (p[i] == 0) {
        return INVALID_ARGUMENT() << Describe(node) << ": integer division by zero (input 1, element "
                                  << i << ")";
      }
    }
  }
  return absl::OkStatus();
}

// Arithmetic in the unsigned type for integers: overflow wraps (two's complement) instead of UB.
template <typename T, typename F>
T Wrapping(T a, T b, F f) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(f(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return f(a, b);
  }
}

// Arithmetic and comparisons also take the one-byte integer types (ONNX tests use uint8/int8).
using ArithTypes = TypeList<float, double, int64_t, int32_t, int8_t, uint8_t>;

// x / -1 and x % -1 are special-cased for signed integers: MIN / -1 overflows (and traps).
template <typename T>
constexpr bool IsMinusOne(T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    return b == T(-1);
  } else {
    return false;
  }
}

template <typename T>
T NegWrap(T a) {
  return static_cast<T>(-static_cast<std::make_unsigned_t<T>>(a));
}

enum class Arith { kAdd, kSub, kMul, kDiv };

template <Arith kOp>
absl::StatusOr<std::vector<ir::Tensor>> ArithKernel(const ir::Node& node,
                                                    const std::vector<ir::Tensor>& in,
                                                    const EvalContext& ctx) {
  RETURN_IF_ERROR(SameDType(node, in, 0, 1));
  return DispatchDType(ArithTypes{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
    using T = typename decltype(tag)::type;
    auto run = [&](auto op) -> absl::StatusOr<std::vector<ir::Tensor>> {
      ASSIGN_OR_RETURN(ir::Tensor out, (BinaryBroadcast<T, T, T>(node, ctx, in[0], in[1], op)));
      return std::vector<ir::Tensor>{out};
    };
    if constexpr (kOp == Arith::kAdd) {
      return run([](T a, T b) { return Wrapping(a, b, [](auto x, auto y) { return x + y; }); });
    } else if constexpr (kOp == Arith::kSub) {
      return run([](T a, T b) { return Wrapping(a, b, [](auto x, auto y) { return x - y; }); });
    } else if constexpr (kOp == Arith::kMul) {
      return run([](T a, T b) { return Wrapping(a, b, [](auto x, auto y) { return x * y; }); });
    } else {
      RETURN_IF_ERROR(CheckNoZeroDivisor<T>(node, in[1]));
      // Integer division truncates toward zero (ONNX reference); MIN / -1 wraps.
      return run([](T a, T b) -> T {
        if constexpr (std::is_integral_v<T>) {
          if (IsMinusOne(b)) return NegWrap(a);
        }
        return a / b;
      });
    }
  });
}

// Pow: the exponent may have another numeric dtype than the base; the result has the base's.
template <typename TB, typename TE>
TB PowValue(TB base, TE e) {
  if constexpr (std::is_floating_point_v<TB>) {
    return static_cast<TB>(std::pow(base, static_cast<TB>(e)));
  } else if constexpr (std::is_floating_point_v<TE>) {
    return static_cast<TB>(std::pow(static_cast<double>(base), static_cast<double>(e)));
  } else {
    // Integer power by squaring; negative exponents truncate 1 / base^|e| toward zero.
    if (e < 0) {
      if (base == 1) return 1;
      if (base == -1) return (e % 2 == 0) ? 1 : -1;
      return 0;
    }
    using U = std::make_unsigned_t<TB>;
    U result = 1, b = static_cast<U>(base);
    for (auto n = static_cast<uint64_t>(e); n; n >>= 1) {
      if (n & 1) result *= b;
      b *= b;
    }
    return static_cast<TB>(result);
  }
}

absl::StatusOr<std::vector<ir::Tensor>> PowKernel(const ir::Node& node,
                                                  const std::vector<ir::Tensor>& in,
                                                  const EvalContext& ctx) {
  return DispatchDType(NumericTypes{}, node, "input 0", in[0].dtype(),
                       [&](auto base_tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
    using TB = typename decltype(base_tag)::type;
    return DispatchDType(NumericTypes{}, node, "input 1", in[1].dtype(),
                         [&](auto exp_tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
      using TE = typename decltype(exp_tag)::type;
      ASSIGN_OR_RETURN(ir::Tensor out, (BinaryBroadcast<TB, TE, TB>(
                                           node, ctx, in[0], in[1], [](TB a, TE b) { return PowValue(a, b); })));
      return std::vector<ir::Tensor>{out};
    });
  });
}

// Mod: fmod = 0 is Python's % (result has the divisor's sign), integers only as in the ONNX
// spec; fmod = 1 is C's fmod / truncated remainder (result has the dividend's sign).
absl::StatusOr<std::vector<ir::Tensor>> ModKernel(const ir::Node& node,
                                                  const std::vector<ir::Tensor>& in,
                                                  const EvalContext& ctx) {
  RETURN_IF_ERROR(SameDType(node, in, 0, 1));
  const int64_t fmod = node.attrs.Get<int64_t>("fmod", 0);
  if (fmod != 0 && fmod != 1) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute fmod is " << fmod << ", expected 0 or 1";
  }
  return DispatchDType(ArithTypes{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> out;
    if constexpr (std::is_floating_point_v<T>) {
      if (fmod == 0) {
        return INVALID_ARGUMENT() << Describe(node)
                                  << ": fmod = 0 on floating-point inputs; the ONNX spec requires fmod = 1";
      }
      out = BinaryBroadcast<T, T, T>(node, ctx, in[0], in[1], [](T a, T b) { return std::fmod(a, b); });
    } else {
      RETURN_IF_ERROR(CheckNoZeroDivisor<T>(node, in[1]));
      if (fmod == 1) {
        out = BinaryBroadcast<T, T, T>(node, ctx, in[0], in[1],
                                       [](T a, T b) -> T { return IsMinusOne(b) ? T(0) : static_cast<T>(a % b); });
      } else {
        out = BinaryBroadcast<T, T, T>(node, ctx, in[0], in[1], [](T a, T b) -> T {
          if (IsMinusOne(b)) return 0;
          T r = static_cast<T>(a % b);
          if constexpr (std::is_signed_v<T>) {
            if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
          }
          return r;
        });
      }
    }
    if (!out.ok()) return out.status();
    return std::vector<ir::Tensor>{*out};
  });
}

enum class Cmp { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual };
using EqualTypes = TypeList<float, double, int64_t, int32_t, int8_t, uint8_t, bool>;

template <Cmp kOp, typename Types>
absl::StatusOr<std::vector<ir::Tensor>> CompareKernel(const ir::Node& node,
                                                      const std::vector<ir::Tensor>& in,
                                                      const EvalContext& ctx) {
  RETURN_IF_ERROR(SameDType(node, in, 0, 1));
  return DispatchDType(Types{}, node, "input 0", in[0].dtype(),
                       [&](auto tag) -> absl::StatusOr<std::vector<ir::Tensor>> {
    using T = typename decltype(tag)::type;
    absl::StatusOr<ir::Tensor> out;
    if constexpr (kOp == Cmp::kEqual) {
      out = BinaryBroadcast<T, T, bool>(node, ctx, in[0], in[1], [](T a, T b) { return a == b; });
    } else if constexpr (kOp == Cmp::kLess) {
      out = BinaryBroadcast<T, T, bool>(node, ctx, in[0], in[1], [](T a, T b) { return a < b; });
    } else if constexpr (kOp == Cmp::kGreater) {
      out = BinaryBroadcast<T, T, bool>(node, ctx, in[0], in[1], [](T a, T b) { return a > b; });
    } else if constexpr (kOp == Cmp::kLessOrEqual) {
      out = BinaryBroadcast<T, T, bool>(node, ctx, in[0], in[1], [](T a, T b) { return a <= b; });
    } else {
      out = BinaryBroadcast<T, T, bool>(node, ctx, in[0], in[1], [](T a, T b) { return a >= b; });
    }
    if (!out.ok()) return out.status();
    return std::vector<ir::Tensor>{*out};
  });
}

absl::StatusOr<std::vector<ir::Tensor>> AndKernel(const ir::Node& node,
                                                  const std::vector<ir::Tensor>& in,
                                                  const EvalContext& ctx) {
  for (int i = 0; i < 2; ++i) {
    if (in[i].dtype() != ir::DType::kBool) {
      return UnsupportedDType(node, i == 0 ? "input 0" : "input 1", in[i].dtype(), {ir::DType::kBool});
    }
  }
  ASSIGN_OR_RETURN(ir::Tensor out,
                   (BinaryBroadcast<bool, bool, bool>(node, ctx, in[0], in[1], [](bool a, bool b) { return a && b; })));
  return std::vector<ir::Tensor>{out};
}

// Where(cond, X, Y): any dtype for X and Y, moved as raw elements of their size.
absl::StatusOr<std::vector<ir::Tensor>> WhereKernel(const ir::Node& node,
                                                    const std::vector<ir::Tensor>& in,
                                                    const EvalContext& ctx) {
  if (in[0].dtype() != ir::DType::kBool) {
    return UnsupportedDType(node, "input 0 (condition)", in[0].dtype(), {ir::DType::kBool});
  }
  RETURN_IF_ERROR(SameDType(node, in, 1, 2));
  ASSIGN_OR_RETURN(std::vector<int64_t> dims, BroadcastDims(node, {in[0].dims(), in[1].dims(), in[2].dims()}));
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[1].dtype(), dims));
  StridedLoop loop(dims, {BroadcastStrides(in[0].dims(), dims.size()), BroadcastStrides(in[1].dims(), dims.size()),
                          BroadcastStrides(in[2].dims(), dims.size())});
  DispatchBySize(in[1].dtype(), [&](auto tag) {
    using U = typename decltype(tag)::type;
    const bool* c = in[0].data<bool>();
    const U* x = in[1].data<U>();
    const U* y = in[2].data<U>();
    U* o = out.mutable_data<U>();
    loop.Run([&](int64_t oo, const int64_t* off, int64_t len, const int64_t* step) {
      for (int64_t i = 0; i < len; ++i) {
        o[oo + i] = c[off[0] + i * step[0]] ? x[off[1] + i * step[1]] : y[off[2] + i * step[2]];
      }
    });
    return 0;
  });
  return std::vector<ir::Tensor>{out};
}

REGISTER_CPU_KERNEL(kAdd, ArithKernel<Arith::kAdd>);
REGISTER_CPU_KERNEL(kSub, ArithKernel<Arith::kSub>);
REGISTER_CPU_KERNEL(kMul, ArithKernel<Arith::kMul>);
REGISTER_CPU_KERNEL(kDiv, ArithKernel<Arith::kDiv>);
REGISTER_CPU_KERNEL(kPow, PowKernel);
REGISTER_CPU_KERNEL(kMod, ModKernel);
REGISTER_CPU_KERNEL(kEqual, (CompareKernel<Cmp::kEqual, EqualTypes>));
REGISTER_CPU_KERNEL(kLess, (CompareKernel<Cmp::kLess, ArithTypes>));
REGISTER_CPU_KERNEL(kGreater, (CompareKernel<Cmp::kGreater, ArithTypes>));
REGISTER_CPU_KERNEL(kLessOrEqual, (CompareKernel<Cmp::kLessOrEqual, ArithTypes>));
REGISTER_CPU_KERNEL(kGreaterOrEqual, (CompareKernel<Cmp::kGreaterOrEqual, ArithTypes>));
REGISTER_CPU_KERNEL(kAnd, AndKernel);
REGISTER_CPU_KERNEL(kWhere, WhereKernel);

}  // namespace
}  // namespace onnxpipe::cpu
