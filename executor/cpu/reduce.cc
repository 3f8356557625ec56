// ReduceSum / ReduceMean / ReduceMax over `axes` (attribute), with keepdims and
// noop_with_empty_axes as in ONNX opset 18, CumSum (the running sum along one axis) and ArgMax. Deterministic: every output element is accumulated
// by one thread, over the reduced elements in row-major order, whatever the pool size.
// Float sums accumulate in double.
#include <cmath>
#include <limits>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

template <typename T>
struct SumOp {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  static Acc Init() { return 0; }
  static Acc Combine(Acc a, T v) { return a + static_cast<Acc>(v); }
  static T Finish(Acc a, int64_t) { return static_cast<T>(a); }
};
template <typename T>
struct MeanOp : SumOp<T> {
  static T Finish(typename SumOp<T>::Acc a, int64_t n) {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(a / static_cast<double>(n));  // n == 0 -> NaN, as numpy
    } else {
      return n == 0 ? T(0) : static_cast<T>(a / n);
    }
  }
};
template <typename T>
struct MaxOp {
  using Acc = T;
  static Acc Init() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::lowest();
  }
  // NaN wins, as in numpy.
  static Acc Combine(Acc a, T v) {
    if constexpr (std::is_floating_point_v<T>) {
      return (v > a || std::isnan(v)) ? v : a;
    } else {
      return v > a ? v : a;
    }
  }
  static T Finish(Acc a, int64_t) { return a; }
};

// Input offset of flat index `i` over (dims, strides).
inline int64_t OffsetOf(int64_t i, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(dims.size()) - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

template <typename T, typename Op>
void ReduceImpl(const ir::Tensor& x, const std::vector<bool>& reduced, ir::Tensor& out) {
  using Acc = typename Op::Acc;
  const T* in = x.data<T>();
  T* o = out.mutable_data<T>();
  const int64_t n_out = out.num_elements();
  // Merge runs of adjacent dims with the same kept/reduced role; size-1 dims play no role.
  std::vector<int64_t> cdims;
  std::vector<bool> cred;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (x.dims()[d] == 1) continue;
    if (!cdims.empty() && cred.back() == reduced[d]) {
      cdims.back() *= x.dims()[d];
    } else {
      cdims.push_back(x.dims()[d]);
      cred.push_back(reduced[d]);
    }
  }
  const std::vector<int64_t> cstrides = ContiguousStrides(cdims);
  std::vector<int64_t> kdims, kstrides, rdims, rstrides;
  int64_t count = 1;
  for (size_t d = 0; d < cdims.size(); ++d) {
    (cred[d] ? rdims : kdims).push_back(cdims[d]);
    (cred[d] ? rstrides : kstrides).push_back(cstrides[d]);
    if (cred[d]) count *= cdims[d];
  }
  if (count == 0) {  // reduction over an empty set: the identity of the op
    for (int64_t i = 0; i < n_out; ++i) o[i] = Op::Finish(Op::Init(), 0);
    return;
  }
  if (!cdims.empty() && !cred.back()) {
    // Innermost dim kept: accumulate contiguous vectors of it, one reduced position at a time.
    const int64_t inner = kdims.back();
    kdims.pop_back();
    kstrides.pop_back();
    const int64_t groups = n_out / inner;
    constexpr int64_t kChunk = 512;
    const int64_t chunks_per_group = (inner + kChunk - 1) / kChunk;
    ParallelFor(groups * chunks_per_group, std::max<int64_t>(1, 16384 / (count * kChunk)), [&](int64_t b, int64_t e) {
      Acc acc[kChunk];
      for (int64_t w = b; w < e; ++w) {
        const int64_t g = w / chunks_per_group, c0 = (w % chunks_per_group) * kChunk;
        const int64_t len = std::min(kChunk, inner - c0);
        const int64_t base = OffsetOf(g, kdims, kstrides) + c0;
        std::fill(acc, acc + len, Op::Init());
        for (int64_t r = 0; r < count; ++r) {
          const T* p = in + base + OffsetOf(r, rdims, rstrides);
          for (int64_t i = 0; i < len; ++i) acc[i] = Op::Combine(acc[i], p[i]);
        }
        for (int64_t i = 0; i < len; ++i) o[g * inner + c0 + i] = Op::Finish(acc[i], count);
      }
    });
  } else {
    // Innermost dim reduced: each output element reduces contiguous runs of it.
    const int64_t run = rdims.empty() ? 1 : rdims.back();
    if (!rdims.empty()) {
      rdims.pop_back();
      rstrides.pop_back();
    }
    const int64_t runs = count / run;
    ParallelFor(n_out, std::max<int64_t>(1, 16384 / count), [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const int64_t base = OffsetOf(j, kdims, kstrides);
        Acc acc = Op::Init();
        for (int64_t r = 0; r < runs; ++r) {
          const T* p = in + base + OffsetOf(r, rdims, rstrides);
          for (int64_t i = 0; i < run; ++i) acc = Op::Combine(acc, p[i]);
        }
        o[j] = Op::Finish(acc, count);
      }
    });
  }
}

template <template <typename> class Op, typename Types>
Outputs ReduceKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  const bool keepdims = node.attrs.Get<int64_t>("keepdims", 1) != 0;
  const bool noop_empty = node.attrs.Get<int64_t>("noop_with_empty_axes", 0) != 0;
  std::vector<int64_t> axes = node.attrs.Get<std::vector<int64_t>>("axes", {});
  return DispatchDType(Types{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    if (axes.empty() && noop_empty) {  // a copy: Reduce* is no view op for the planner
      ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, x, x.dims()));
      return std::vector<ir::Tensor>{out};
    }
    std::vector<bool> reduced(x.rank(), axes.empty());
    ASSIGN_OR_RETURN(std::vector<int64_t> norm, NormalizeAxes(node, axes, x.rank()));
    for (int64_t a : norm) reduced[a] = true;
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < x.rank(); ++d) {
      if (!reduced[d]) {
        dims.push_back(x.dims()[d]);
      } else if (keepdims) {
        dims.push_back(1);
      }
    }
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), dims));
    if (out.num_elements() > 0) ReduceImpl<T, Op<T>>(x, reduced, out);
    return std::vector<ir::Tensor>{out};
  });
}

// CumSum along `axis`: out[.., j, ..] = sum of x over i <= j (exclusive: i < j; reverse: i >= j,
// exclusive reverse: i > j), accumulated in SumOp's type (double for floats).
Outputs CumSumKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  if (x.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": input must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), x.rank()));
  const bool exclusive = node.attrs.Get<int64_t>("exclusive", 0) != 0;
  const bool reverse = node.attrs.Get<int64_t>("reverse", 0) != 0;
  const int64_t n = x.dims()[axis];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dims()[d];
  return DispatchDType(NumericTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    using Acc = typename SumOp<T>::Acc;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
    const T* p = x.data<T>();
    T* o = out.mutable_data<T>();
    ParallelFor(outer * inner, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
      for (int64_t line = b; line < e; ++line) {
        const int64_t base = (line / inner) * n * inner + line % inner;
        Acc acc = 0;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t off = base + (reverse ? n - 1 - s : s) * inner;
          if (exclusive) {
            o[off] = static_cast<T>(acc);
            acc = SumOp<T>::Combine(acc, p[off]);
          } else {
            acc = SumOp<T>::Combine(acc, p[off]);
            o[off] = static_cast<T>(acc);
          }
        }
      }
    });
    return std::vector<ir::Tensor>{out};
  });
}

REGISTER_CPU_KERNEL(kCumSum, CumSumKernel);

// ArgMax along `axis`: the index of the first (select_last_index: the last) maximum; a NaN counts
// as the maximum, as numpy.argmax.
Outputs ArgMaxKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  if (x.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": input must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), x.rank()));
  const bool last = node.attrs.Get<int64_t>("select_last_index", 0) != 0;
  const int64_t n = x.dims()[axis];
  if (n == 0) return INVALID_ARGUMENT() << Describe(node) << ": axis " << axis << " is empty";
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dims()[d];
  std::vector<int64_t> dims = x.dims();
  if (node.attrs.Get<int64_t>("keepdims", 1) != 0) {
    dims[axis] = 1;
  } else {
    dims.erase(dims.begin() + axis);
  }
  return DispatchDType(NumericTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, ir::DType::kI64, dims));
    const T* p = x.data<T>();
    int64_t* o = out.mutable_data<int64_t>();
    for (int64_t line = 0; line < outer * inner; ++line) {
      const T* base = p + (line / inner) * n * inner + line % inner;
      int64_t best = 0;
      for (int64_t j = 1; j < n; ++j) {
        const T v = base[j * inner], b = base[best * inner];
        if constexpr (std::is_floating_point_v<T>) {
          if (std::isnan(b)) break;  // the first NaN wins
          if (std::isnan(v)) {
            best = j;
            break;
          }
        }
        if (v > b || (last && v == b)) best = j;
      }
      o[line] = best;
    }
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kArgMax, ArgMaxKernel);
REGISTER_CPU_KERNEL(kReduceSum, (ReduceKernel<SumOp, NumericTypes>));
REGISTER_CPU_KERNEL(kReduceMean, (ReduceKernel<MeanOp, NumericTypes>));
REGISTER_CPU_KERNEL(kReduceMax, (ReduceKernel<MaxOp, NumericTypes>));

}  // namespace
}  // namespace onnxpipe::cpu
