// Elementwise kernels: grid-stride loops; a broadcast operand's offset comes from the output index
// decomposed over the (merged) output dims, skipped entirely when every operand is dense.
#include <cuda/std/limits>
#include <utility>

#include "executor/cuda/activation.cuh"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/elementwise.h"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

// Offsets of operands 0..K-1 for output element o.
template <int K>
__device__ __forceinline__ void Offsets(const BroadcastIndex& idx, int64_t o, int64_t (&off)[K]) {
  for (int k = 0; k < K; ++k) off[k] = 0;
  if (idx.contiguous) {
    for (int k = 0; k < K; ++k) off[k] = o;
    return;
  }
  for (int d = idx.rank - 1; d >= 0; --d) {
    const int64_t q = o / idx.dims[d];
    const int64_t r = o - q * idx.dims[d];
    for (int k = 0; k < K; ++k) off[k] += r * idx.strides[k][d];
    o = q;
  }
}

// Integer add/sub/mul wrap through the unsigned type, as the CPU backend's do.
template <typename C>
__device__ __forceinline__ C Wrap(C a, C b, BinaryOp op) {
  using U = std::make_unsigned_t<C>;
  const U x = static_cast<U>(a), y = static_cast<U>(b);
  return static_cast<C>(op == BinaryOp::kAdd ? x + y : op == BinaryOp::kSub ? x - y : x * y);
}

template <typename C>
__device__ __forceinline__ C Arith(BinaryOp op, C a, C b) {
  if (op == BinaryOp::kMin || op == BinaryOp::kMax) {
    if constexpr (!std::is_integral_v<C>) {
      if (a != a) return a;  // NaN propagates
      if (b != b) return b;
    }
    return op == BinaryOp::kMin ? (b < a ? b : a) : (a < b ? b : a);
  }
  if constexpr (std::is_integral_v<C>) {
    return Wrap(a, b, op);
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return a + b;
      case BinaryOp::kSub:
        return a - b;
      case BinaryOp::kMul:
        return a * b;
      case BinaryOp::kDiv:
        return a / b;
      case BinaryOp::kReluGrad:
        return b > C(0) ? a : C(0);
      default:
        return powf(a, b);
    }
  }
}

// One element of a binary op: comparisons give a byte, arithmetic the operands' type.
template <typename T, BinaryOp kOp>
struct BinaryFn {
  static constexpr bool kCompare = kOp == BinaryOp::kEqual || kOp == BinaryOp::kLess || kOp == BinaryOp::kGreater ||
                                   kOp == BinaryOp::kGreaterOrEqual || kOp == BinaryOp::kLessOrEqual ||
                                   kOp == BinaryOp::kAnd;
  using Out = std::conditional_t<kCompare, uint8_t, T>;
  __device__ __forceinline__ auto operator()(Compute<T> x, Compute<T> y) const {
    if constexpr (kCompare) {
      return static_cast<uint8_t>(kOp == BinaryOp::kEqual            ? x == y
                                  : kOp == BinaryOp::kLess           ? x < y
                                  : kOp == BinaryOp::kGreater        ? x > y
                                  : kOp == BinaryOp::kGreaterOrEqual ? x >= y
                                  : kOp == BinaryOp::kLessOrEqual    ? x <= y
                                                                     : (x && y));
    } else {
      return Arith(kOp, x, y);
    }
  }
};

// A binary op with a broadcast operand (dense operands go through LaunchMap).
template <typename T, BinaryOp kOp>
__global__ void BinaryKernel(const T* __restrict__ a, const T* __restrict__ b, void* __restrict__ out, int64_t n,
                             BroadcastIndex idx) {
  using Fn = BinaryFn<T, kOp>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    Offsets<2>(idx, i, off);
    Store(static_cast<typename Fn::Out*>(out), i, Fn{}(Load(a, off[0]), Load(b, off[1])));
  }
}

template <typename T>
__global__ void WhereKernel(const uint8_t* __restrict__ cond, const T* __restrict__ x, const T* __restrict__ y,
                            T* __restrict__ out, int64_t n, BroadcastIndex idx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    Offsets<3>(idx, i, off);
    out[i] = cond[off[0]] ? x[off[1]] : y[off[2]];
  }
}

template <typename C>
__device__ __forceinline__ C ApplyUnary(UnaryOp op, C x) {
  if constexpr (std::is_same_v<C, bool>) {
    return !x;  // Not
  } else if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    const C neg = static_cast<C>(U{0} - static_cast<U>(x));  // wraps for the most negative value
    return op == UnaryOp::kNeg ? neg : op == UnaryOp::kAbs ? (x < 0 ? neg : x) : (x < 0 ? C(0) : x);
  } else {
    switch (op) {
      case UnaryOp::kNeg:
        return -x;
      case UnaryOp::kExp:
        return expf(x);
      case UnaryOp::kLog:
        return logf(x);
      case UnaryOp::kSqrt:
        return sqrtf(x);
      case UnaryOp::kTanh:
        return tanhf(x);
      case UnaryOp::kErf:
        return erff(x);
      case UnaryOp::kSigmoid:
        return SigmoidValue(x);
      case UnaryOp::kRelu:
        return x < 0.f ? 0.f : x;  // keeps NaN
      case UnaryOp::kAbs:
        return fabsf(x);
      case UnaryOp::kSin:
        return sinf(x);
      case UnaryOp::kCos:
        return cosf(x);
      default:
        return 1.f / x;
    }
  }
}

struct UnaryFn {
  UnaryOp op;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    return ApplyUnary(op, x);
  }
};

struct ScaleFn {
  float s;
  template <typename C>
  __device__ __forceinline__ float operator()(C x) const {
    return static_cast<float>(x) * s;
  }
};

// Cast through double, as the CPU backend's Tensor::CastTo: exact for every source but 64-bit
// integers beyond 2^53, which round the same way on both backends.
template <typename To>
__device__ __forceinline__ To FromDouble(double v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_integral_v<To>) {
    // C truncation; NaN -> 0; out-of-range saturates.
    constexpr double kLo = static_cast<double>(::cuda::std::numeric_limits<To>::min());
    constexpr double kHi = static_cast<double>(::cuda::std::numeric_limits<To>::max());
    return v != v     ? To(0)
           : v <= kLo ? ::cuda::std::numeric_limits<To>::min()
           : v >= kHi ? ::cuda::std::numeric_limits<To>::max()
                      : static_cast<To>(v);
  } else {
    return Convert<To>(static_cast<float>(v));  // double -> float -> 16-bit, as FloatToBF16(float(v))
  }
}

template <typename From, typename To>
struct CastFn {
  __device__ __forceinline__ To operator()(Compute<From> x) const {
    if constexpr (std::is_integral_v<From> && std::is_integral_v<To> && !std::is_same_v<To, bool>) {
      return static_cast<To>(x);  // integer -> integer: wraps, no double round trip
    } else {
      return FromDouble<To>(static_cast<double>(x));
    }
  }
};

template <typename T>
__global__ void FlagNonFiniteKernel(const T* x, int64_t n, uint32_t* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    bad |= !isfinite(Load(x, i));
  }
  // One write per warp at most; the flag only ever goes from 0 to 1, so races are benign.
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

// x0 + x1 + ... in fp32 from the left, each addition rounded to fp32 (Accumulate's acc + x, and
// Sum's operands in order); starting from -0 keeps x0 exactly, zero's sign included.
struct SumFn {
  template <typename... C>
  __device__ __forceinline__ float operator()(C... x) const {
    float acc = -0.f;
    ((acc = __fadd_rn(acc, static_cast<float>(x))), ...);
    return acc;
  }
};

template <typename T, size_t... I>
cudaError_t LaunchSumOf(const T* const* xs, T* out, int64_t n, cudaStream_t stream, std::index_sequence<I...>) {
  return LaunchMap(n, SumFn{}, stream, out, xs[I]...);
}

template <typename T, int K = 1>
cudaError_t LaunchSumK(const T* const* xs, int k, T* out, int64_t n, cudaStream_t stream) {
  if constexpr (K > kMaxDenseSumInputs) {
    return cudaErrorInvalidValue;
  } else {
    if (k == K) return LaunchSumOf<T>(xs, out, n, stream, std::make_index_sequence<K>{});
    return LaunchSumK<T, K + 1>(xs, k, out, n, stream);
  }
}

// Calls f(TypeTag<T>{}) for every dtype Cast handles.
template <typename F>
cudaError_t DispatchCast(ir::DType dt, F&& f) {
  switch (dt) {
    case ir::DType::kBool:
      return f(TypeTag<bool>{});
    default:
      return DispatchArith(dt, static_cast<F&&>(f));
  }
}

template <BinaryOp kOp>
cudaError_t LaunchBinaryOp(ir::DType dtype, const void* a, const void* b, void* out, int64_t n,
                           const BroadcastIndex& idx, cudaStream_t stream) {
  auto launch = [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    using Fn = BinaryFn<T, kOp>;
    if (idx.contiguous) {
      return LaunchMap(n, Fn{}, stream, static_cast<typename Fn::Out*>(out), static_cast<const T*>(a),
                       static_cast<const T*>(b));
    }
    BinaryKernel<T, kOp>
        <<<GridFor(n), kThreads, 0, stream>>>(static_cast<const T*>(a), static_cast<const T*>(b), out, n, idx);
    return cudaGetLastError();
  };
  constexpr bool kFloatOnly = kOp == BinaryOp::kDiv || kOp == BinaryOp::kPow || kOp == BinaryOp::kReluGrad;
  if constexpr (kOp == BinaryOp::kAnd) {
    return dtype == ir::DType::kBool ? launch(TypeTag<bool>{}) : cudaErrorInvalidValue;
  } else if constexpr (kFloatOnly) {
    return DispatchFloat(dtype, launch);
  } else {
    return DispatchArith(dtype, launch);
  }
}

}  // namespace

cudaError_t LaunchBinary(BinaryOp op, ir::DType dtype, const void* a, const void* b, void* out, int64_t n,
                         const BroadcastIndex& index, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (op) {
    case BinaryOp::kAdd:
      return LaunchBinaryOp<BinaryOp::kAdd>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kSub:
      return LaunchBinaryOp<BinaryOp::kSub>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kMul:
      return LaunchBinaryOp<BinaryOp::kMul>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kDiv:
      return LaunchBinaryOp<BinaryOp::kDiv>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kPow:
      return LaunchBinaryOp<BinaryOp::kPow>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kMin:
      return LaunchBinaryOp<BinaryOp::kMin>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kMax:
      return LaunchBinaryOp<BinaryOp::kMax>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kEqual:
      return LaunchBinaryOp<BinaryOp::kEqual>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kLess:
      return LaunchBinaryOp<BinaryOp::kLess>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kGreater:
      return LaunchBinaryOp<BinaryOp::kGreater>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kAnd:
      return LaunchBinaryOp<BinaryOp::kAnd>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kReluGrad:
      return LaunchBinaryOp<BinaryOp::kReluGrad>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kGreaterOrEqual:
      return LaunchBinaryOp<BinaryOp::kGreaterOrEqual>(dtype, a, b, out, n, index, stream);
    case BinaryOp::kLessOrEqual:
      return LaunchBinaryOp<BinaryOp::kLessOrEqual>(dtype, a, b, out, n, index, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchWhere(ir::DType dtype, const uint8_t* cond, const void* x, const void* y, void* out, int64_t n,
                        const BroadcastIndex& index, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchArith(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    WhereKernel<T><<<GridFor(n), kThreads, 0, stream>>>(cond, static_cast<const T*>(x), static_cast<const T*>(y),
                                                        static_cast<T*>(out), n, index);
    return cudaGetLastError();
  });
}

cudaError_t LaunchUnary(UnaryOp op, ir::DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto launch = [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return LaunchMap(n, UnaryFn{op}, stream, static_cast<T*>(y), static_cast<const T*>(x));
  };
  if (op == UnaryOp::kNot) return dtype == ir::DType::kBool ? launch(TypeTag<bool>{}) : cudaErrorInvalidValue;
  const bool integer_ok = op == UnaryOp::kNeg || op == UnaryOp::kRelu || op == UnaryOp::kAbs;
  return integer_ok ? DispatchArith(dtype, launch) : DispatchFloat(dtype, launch);
}

cudaError_t LaunchScale(ir::DType dtype, const void* x, float s, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return LaunchMap(n, ScaleFn{s}, stream, static_cast<T*>(y), static_cast<const T*>(x));
  });
}

cudaError_t LaunchCast(ir::DType from, const void* x, ir::DType to, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchCast(from, [&](auto from_tag) -> cudaError_t {
    using From = typename decltype(from_tag)::type;
    return DispatchCast(to, [&](auto to_tag) -> cudaError_t {
      using To = typename decltype(to_tag)::type;
      return LaunchMap(n, CastFn<From, To>{}, stream, static_cast<To*>(y), static_cast<const From*>(x));
    });
  });
}

cudaError_t LaunchDenseSum(ir::DType dtype, const void* const* xs, int k, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return LaunchSumK<T>(reinterpret_cast<const T* const*>(xs), k, static_cast<T*>(out), n, stream);
  });
}

cudaError_t LaunchFlagNonFinite(ir::DType dtype, const void* x, int64_t n, uint32_t* flag, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    FlagNonFiniteKernel<T><<<GridFor(n), kThreads, 0, stream>>>(static_cast<const T*>(x), n, flag);
    return cudaGetLastError();
  });
}

cudaError_t LaunchAccumulate(ir::DType acc_dtype, void* acc, ir::DType x_dtype, const void* x, int64_t n,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(acc_dtype, [&](auto acc_tag) -> cudaError_t {
    using A = typename decltype(acc_tag)::type;
    return DispatchFloat(x_dtype, [&](auto x_tag) -> cudaError_t {
      using X = typename decltype(x_tag)::type;
      A* pa = static_cast<A*>(acc);
      return LaunchMap(n, SumFn{}, stream, pa, static_cast<const A*>(pa), static_cast<const X*>(x));
    });
  });
}

}  // namespace onnxpipe::cuda
