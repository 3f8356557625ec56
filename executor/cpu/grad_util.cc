// ReduceToDims: the gradient of a broadcast. The output index space (kept dims) is split over
// the thread pool; each thread walks the reduced index space in order for its block of outputs,
// so an inner loop runs over contiguous kept elements when the kept dims are the inner ones
// (bias gradients: sum rows of a (M, N) matrix) and results are thread-count independent.
#include "executor/cpu/grad_util.h"

namespace onnxpipe::cpu {

absl::StatusOr<ir::Tensor> ReduceToDims(const ir::Node& node, const EvalContext& ctx, int index,
                                        const ir::Tensor& x, const std::vector<int64_t>& target) {
  const std::vector<int64_t>& xd = x.dims();
  const size_t r = xd.size();
  if (target.size() > r) {
    return INVALID_ARGUMENT() << Describe(node) << ": cannot reduce " << DimsToString(xd) << " to "
                              << DimsToString(target);
  }
  std::vector<int64_t> td(r, 1);  // target padded on the left
  for (size_t i = 0; i < target.size(); ++i) td[r - target.size() + i] = target[i];
  const std::vector<int64_t> xs = ContiguousStrides(xd);
  std::vector<int64_t> kept_dims, kept_strides, red_dims, red_strides;
  for (size_t d = 0; d < r; ++d) {
    if (td[d] == xd[d]) {
      kept_dims.push_back(xd[d]);
      kept_strides.push_back(xs[d]);
    } else if (td[d] == 1) {
      red_dims.push_back(xd[d]);
      red_strides.push_back(xs[d]);
    } else {
      return INVALID_ARGUMENT() << Describe(node) << ": " << DimsToString(target)
                                << " does not broadcast to " << DimsToString(xd);
    }
  }
  // Offset in x of the i-th multi-index (row-major) over (dims, strides).
  auto offset_of = [](int64_t i, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
    int64_t off = 0;
    for (size_t d = dims.size(); d-- > 0;) {
      off += (i % dims[d]) * strides[d];
      i /= dims[d];
    }
    return off;
  };
  int64_t nk = 1, nr = 1;
  for (int64_t d : kept_dims) nk *= d;
  for (int64_t d : red_dims) nr *= d;
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(),
                       [&](auto tag) -> absl::StatusOr<ir::Tensor> {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, index, x.dtype(), target));
    const T* px = x.data<T>();
    T* po = out.mutable_data<T>();
    if (x.num_elements() == 0) return out;
    // Blocks of kept outputs with their sums on the stack; the reduced index space is walked in
    // row-major order by an odometer, so no offset table is materialised.
    constexpr int64_t kBlock = 256;
    ParallelFor(nk, std::max<int64_t>(kBlock, (1 << 15) / std::max<int64_t>(nr, 1)), [&](int64_t b, int64_t e) {
      double acc[kBlock];
      int64_t koff[kBlock];
      std::vector<int64_t> idx(red_dims.size());
      for (int64_t k0 = b; k0 < e; k0 += kBlock) {
        const int64_t len = std::min(kBlock, e - k0);
        for (int64_t k = 0; k < len; ++k) {
          acc[k] = 0.0;
          koff[k] = offset_of(k0 + k, kept_dims, kept_strides);
        }
        std::fill(idx.begin(), idx.end(), 0);
        int64_t roff = 0;
        for (int64_t j = 0; j < nr; ++j) {
          const T* base = px + roff;
          for (int64_t k = 0; k < len; ++k) acc[k] += base[koff[k]];
          for (size_t d = red_dims.size(); d-- > 0;) {
            roff += red_strides[d];
            if (++idx[d] < red_dims[d]) break;
            roff -= red_dims[d] * red_strides[d];
            idx[d] = 0;
          }
        }
        for (int64_t k = 0; k < len; ++k) po[k0 + k] = static_cast<T>(acc[k]);
      }
    });
    return out;
  });
}

}  // namespace onnxpipe::cpu
