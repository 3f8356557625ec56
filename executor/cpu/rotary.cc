// Rotary and RotaryGrad (frontend/ir/op.h): the rotation of each row's first rotary_dim features by
// the cos/sin tables, and its transpose. Rows are independent; each row finds its table row through
// the tables' broadcast strides over X's leading dims.
#include <cstdint>
#include <vector>

#include "executor/cpu/kernel.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/thread_pool.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

struct RotaryGeometry {
  int64_t rows = 0, width = 0, rotary_dim = 0;
  bool interleaved = false;
  std::vector<int64_t> lead_dims;      // X's dims but the last
  std::vector<int64_t> table_strides;  // the tables' row strides (in rows) along lead_dims, 0 where broadcast

  // Row `r` of the tables for row `row` of X.
  int64_t TableRow(int64_t row) const {
    int64_t t = 0;
    for (int d = static_cast<int>(lead_dims.size()) - 1; d >= 0; --d) {
      t += (row % lead_dims[d]) * table_strides[d];
      row /= lead_dims[d];
    }
    return t;
  }
};

absl::StatusOr<RotaryGeometry> Geometry(const ir::Node& node, const std::vector<ir::Tensor>& in) {
  const ir::Tensor &x = in[0], &cos = in[1], &sin = in[2];
  RotaryGeometry geo;
  geo.rotary_dim = node.attrs.Get<int64_t>("rotary_dim", -1);
  geo.interleaved = node.attrs.Get<int64_t>("interleaved", 0) != 0;
  const std::vector<int64_t>& xd = x.dims();
  if (xd.empty() || cos.dims() != sin.dims() || cos.dims().empty() || cos.dims().size() > xd.size() ||
      cos.dims().back() != geo.rotary_dim || geo.rotary_dim <= 0 || geo.rotary_dim % 2 != 0 ||
      geo.rotary_dim > xd.back() || cos.dtype() != x.dtype() || sin.dtype() != x.dtype()) {
    return INVALID_ARGUMENT() << Describe(node) << ": X " << DimsToString(xd) << ", cos " << DimsToString(cos.dims())
                              << " and sin " << DimsToString(sin.dims()) << " do not fit rotary_dim " << geo.rotary_dim
                              << " (op.h: tables (..., rotary_dim) of X's dtype)";
  }
  geo.width = xd.back();
  geo.lead_dims.assign(xd.begin(), xd.end() - 1);
  const std::vector<int64_t> table_lead(cos.dims().begin(), cos.dims().end() - 1);
  for (size_t k = 0; k < table_lead.size(); ++k) {
    const int64_t t = table_lead[table_lead.size() - 1 - k], d = geo.lead_dims[geo.lead_dims.size() - 1 - k];
    if (t != 1 && t != d)
      return INVALID_ARGUMENT() << Describe(node) << ": cos " << DimsToString(cos.dims()) << " does not broadcast to X "
                                << DimsToString(xd);
  }
  geo.table_strides = BroadcastStrides(table_lead, geo.lead_dims.size());
  geo.rows = x.num_elements() / std::max<int64_t>(geo.width, 1);
  return geo;
}

// Y = X cos + rot(X) sin (forward) or dX = dY cos + rot^T(dY sin) (transpose) on the rotated
// features of every row, the rest copied. Pair p is (lo, hi): (p, p + R/2) or (2p, 2p + 1).
template <typename T>
void Rotate(const RotaryGeometry& geo, bool transpose, const T* x, const T* cos, const T* sin, T* y) {
  const int64_t half = geo.rotary_dim / 2;
  ParallelFor(geo.rows, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(geo.width, 1)), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const T* xr = x + row * geo.width;
      T* yr = y + row * geo.width;
      const int64_t t = geo.TableRow(row) * geo.rotary_dim;
      const T *c = cos + t, *s = sin + t;
      for (int64_t p = 0; p < half; ++p) {
        const int64_t lo = geo.interleaved ? 2 * p : p, hi = geo.interleaved ? 2 * p + 1 : p + half;
        const T a = xr[lo], h = xr[hi];
        if (transpose) {
          yr[lo] = a * c[lo] + h * s[hi];
          yr[hi] = h * c[hi] - a * s[lo];
        } else {
          yr[lo] = a * c[lo] - h * s[lo];
          yr[hi] = h * c[hi] + a * s[hi];
        }
      }
      for (int64_t i = geo.rotary_dim; i < geo.width; ++i) yr[i] = xr[i];
    }
  });
}

Outputs RotaryKernelImpl(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx,
                         bool transpose) {
  ASSIGN_OR_RETURN(const RotaryGeometry geo, Geometry(node, in));
  return DispatchDType(FloatTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, in[0].dtype(), in[0].dims()));
    Rotate<T>(geo, transpose, in[0].data<T>(), in[1].data<T>(), in[2].data<T>(), out.mutable_data<T>());
    return std::vector<ir::Tensor>{out};
  });
}

Outputs RotaryKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  return RotaryKernelImpl(node, in, ctx, /*transpose=*/false);
}
Outputs RotaryGradKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  return RotaryKernelImpl(node, in, ctx, /*transpose=*/true);
}

}  // namespace

REGISTER_CPU_KERNEL(kRotary, RotaryKernel);
REGISTER_CPU_KERNEL(kRotaryGrad, RotaryGradKernel);

}  // namespace onnxpipe::cpu
