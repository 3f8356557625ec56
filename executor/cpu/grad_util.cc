// ReduceToDims: the gradient of a broadcast. The output index space (kept dims) is split over
// the thread pool; each thread walks the reduced index space in order for its block of outputs,
// so an inner loop runs over contiguous kept elements when the kept dims are the inner ones
// (bias gradients: sum rows of a (M, N) matrix) and results are thread-count independent.
#include "executor/cpu/grad_util.h"

namespace onnxpipe::cpu {

absl::StatusOr<ir::Tensor> ReduceToDims(const ir::Node& node, const ir::Tensor& x,
                                        const std::vector<int64_t>& target) {
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
  // Offsets of every kept / reduced multi-index, in row-major order.
  auto offsets = [](const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
    std::vector<int64_t> out = {0};
    for (size_t d = 0; d < dims.size(); ++d) {
      std::vector<int64_t> next;
      next.reserve(out.size() * dims[d]);
      for (int64_t base : out)
        for (int64_t i = 0; i < dims[d]; ++i) next.push_back(base + i * strides[d]);
      out.swap(next);
    }
    return out;
  };
  const std::vector<int64_t> koff = offsets(kept_dims, kept_strides);
  const std::vector<int64_t> roff = offsets(red_dims, red_strides);
  return DispatchDType(FloatTypes{}, node, "input 0", x.dtype(),
                       [&](auto tag) -> absl::StatusOr<ir::Tensor> {
    using T = typename decltype(tag)::type;
    ir::Tensor out(x.dtype(), target);
    const T* px = x.data<T>();
    T* po = out.mutable_data<T>();
    const int64_t nk = static_cast<int64_t>(koff.size()), nr = static_cast<int64_t>(roff.size());
    if (x.num_elements() == 0) return out;
    ParallelFor(nk, std::max<int64_t>(64, (1 << 15) / std::max<int64_t>(nr, 1)), [&](int64_t b, int64_t e) {
      std::vector<double> acc(e - b, 0.0);
      for (int64_t j = 0; j < nr; ++j) {
        const T* base = px + roff[j];
        for (int64_t k = b; k < e; ++k) acc[k - b] += base[koff[k]];
      }
      for (int64_t k = b; k < e; ++k) po[k] = static_cast<T>(acc[k - b]);
    });
    return out;
  });
}

}  // namespace onnxpipe::cpu
