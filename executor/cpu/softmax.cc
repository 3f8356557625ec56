// Softmax and LogSoftmax along one axis (ONNX opset >= 13). Numerically stable: the line maximum
// is subtracted before exp, and the sum of exponentials accumulates in double. The input is
// viewed as (outer, n, inner); each (outer, inner) line is handled by one thread.
#include <cmath>
#include <limits>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

template <typename T, bool kLog>
void SoftmaxLines(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  ParallelFor(outer * inner, std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t line = b; line < e; ++line) {
      const int64_t base = (line / inner) * n * inner + line % inner;
      const T* xs = x + base;
      T* ys = y + base;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, xs[i * inner]);
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T ex = std::exp(xs[i * inner] - mx);
        if constexpr (!kLog) ys[i * inner] = ex;
        sum += ex;
      }
      if constexpr (kLog) {
        const T lse = static_cast<T>(std::log(sum));
        for (int64_t i = 0; i < n; ++i) ys[i * inner] = xs[i * inner] - mx - lse;
      } else {
        const double inv = 1.0 / sum;
        for (int64_t i = 0; i < n; ++i) ys[i * inner] = static_cast<T>(ys[i * inner] * inv);
      }
    }
  });
}

template <bool kLog>
Outputs SoftmaxKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  if (x.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": input must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", -1), x.rank()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dims()[d];
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dims()[d];
  const int64_t n = x.dims()[axis];
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
    if (n > 0) SoftmaxLines<T, kLog>(x.data<T>(), out.mutable_data<T>(), outer, n, inner);
    return std::vector<ir::Tensor>{out};
  });
}

REGISTER_CPU_KERNEL(kSoftmax, SoftmaxKernel<false>);
REGISTER_CPU_KERNEL(kLogSoftmax, SoftmaxKernel<true>);

}  // namespace
}  // namespace onnxpipe::cpu
