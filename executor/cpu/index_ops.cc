// Indexing and generating kernels: Gather, Trilu, Range, Constant, ConstantOfShape.
#include <cmath>
#include <cstring>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {
namespace {

using Outputs = absl::StatusOr<std::vector<ir::Tensor>>;

// Gather: out = data[..., indices, ...] along `axis`; negative indices count from the end, and an
// index outside [-n, n) is an error (never a read out of bounds).
Outputs GatherKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& data = in[0];
  const ir::Tensor& indices = in[1];
  if (indices.dtype() != ir::DType::kI64 && indices.dtype() != ir::DType::kI32) {
    return UnsupportedDType(node, "input 1 (indices)", indices.dtype(), {ir::DType::kI64, ir::DType::kI32});
  }
  if (data.rank() == 0) return INVALID_ARGUMENT() << Describe(node) << ": data must have rank >= 1";
  ASSIGN_OR_RETURN(int64_t axis, NormalizeAxis(node, node.attrs.Get<int64_t>("axis", 0), data.rank()));
  const int64_t n = data.dims()[axis];
  const int64_t num_idx = indices.num_elements();
  // Indices are checked up front and read again in the copy loop (no table to allocate).
  for (int64_t i = 0; i < num_idx; ++i) {
    const int64_t v = indices.GetAsInt(i);
    if (v < -n || v >= n) {
      return INVALID_ARGUMENT() << Describe(node) << ": index " << v << " (element " << i
                                << " of indices) is out of range for axis " << axis << " of size " << n;
    }
  }
  auto index = [&](int64_t i) {
    const int64_t v = indices.GetAsInt(i);
    return v < 0 ? v + n : v;
  };
  std::vector<int64_t> dims(data.dims().begin(), data.dims().begin() + axis);
  dims.insert(dims.end(), indices.dims().begin(), indices.dims().end());
  dims.insert(dims.end(), data.dims().begin() + axis + 1, data.dims().end());
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, data.dtype(), dims));
  int64_t outer = 1, inner = ir::DTypeSize(data.dtype());
  for (int64_t d = 0; d < axis; ++d) outer *= data.dims()[d];
  for (int64_t d = axis + 1; d < data.rank(); ++d) inner *= data.dims()[d];
  const auto* src = static_cast<const uint8_t*>(data.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  if (inner == 0 || outer * num_idx == 0) return std::vector<ir::Tensor>{out};
  ParallelFor(outer * num_idx, std::max<int64_t>(1, (1 << 15) / inner), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = r / num_idx, j = r % num_idx;
      std::memcpy(dst + r * inner, src + (o * n + index(j)) * inner, inner);
    }
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kGather, GatherKernel);

// Trilu: keeps the upper (j - i >= k) or lower (j - i <= k) triangle of the last two dims.
Outputs TriluKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  const ir::Tensor& x = in[0];
  if (x.rank() < 2) {
    return INVALID_ARGUMENT() << Describe(node) << ": input must have rank >= 2, got shape "
                              << DimsToString(x.dims());
  }
  int64_t k = 0;
  if (HasInput(in, 1)) {
    if (in[1].num_elements() != 1 || (in[1].dtype() != ir::DType::kI64 && in[1].dtype() != ir::DType::kI32)) {
      return INVALID_ARGUMENT() << Describe(node) << ": input 1 (k) must be an integer scalar";
    }
    k = in[1].GetAsInt(0);
  }
  const bool upper = node.attrs.Get<int64_t>("upper", 1) != 0;
  const int64_t rows = x.dims()[x.rank() - 2], cols = x.dims()[x.rank() - 1];
  const int64_t esize = ir::DTypeSize(x.dtype());
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, x.dtype(), x.dims()));
  if (x.num_bytes() > 0) std::memcpy(out.raw(), x.raw(), x.num_bytes());
  auto* o = static_cast<uint8_t*>(out.raw());
  const int64_t mats = rows * cols == 0 ? 0 : x.num_elements() / (rows * cols);
  ParallelFor(mats * rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = r % rows;
      uint8_t* row = o + r * cols * esize;
      for (int64_t j = 0; j < cols; ++j) {
        const bool keep = upper ? (j - i >= k) : (j - i <= k);
        if (!keep) std::memset(row + j * esize, 0, esize);
      }
    }
  });
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kTrilu, TriluKernel);

// Range: out[i] = start + i * delta for i < max(ceil((limit - start) / delta), 0).
Outputs RangeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  for (int i = 0; i < 3; ++i) {
    if (in[i].num_elements() != 1) {
      return INVALID_ARGUMENT() << Describe(node) << ": input " << i << " must be a scalar, got shape "
                                << DimsToString(in[i].dims());
    }
    if (in[i].dtype() != in[0].dtype()) {
      return INVALID_ARGUMENT() << Describe(node) << ": inputs must share one dtype, input " << i << " is "
                                << ir::DTypeName(in[i].dtype());
    }
  }
  return DispatchDType(NumericTypes{}, node, "input 0", in[0].dtype(), [&](auto tag) -> Outputs {
    using T = typename decltype(tag)::type;
    const T start = in[0].data<T>()[0], limit = in[1].data<T>()[0], delta = in[2].data<T>()[0];
    if (delta == T(0)) return INVALID_ARGUMENT() << Describe(node) << ": delta is 0";
    double count;
    if constexpr (std::is_integral_v<T>) {
      // Exact for integers: ceil of a quotient in 128-bit-safe form via long double.
      count = std::ceil((static_cast<long double>(limit) - start) / delta);
    } else {
      count = std::ceil((static_cast<double>(limit) - start) / delta);
    }
    if (!(count > 0)) count = 0;  // also catches NaN
    if (count > static_cast<double>(kMaxTensorBytes / sizeof(T))) {
      return INVALID_ARGUMENT() << Describe(node) << ": range of " << count << " elements is too large";
    }
    const int64_t n = static_cast<int64_t>(count);
    ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, ir::DTypeOf<T>::value, {n}));
    T* o = out.mutable_data<T>();
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(start + static_cast<T>(i) * delta);
    return std::vector<ir::Tensor>{out};
  });
}
REGISTER_CPU_KERNEL(kRange, RangeKernel);

// Constant: the `value` tensor attribute (importers convert value_float(s)/value_int(s) to it;
// those are accepted here too).
// Under a planned executor the value is copied into the output's slot (Constant is no view op).
Outputs ConstantKernel(const ir::Node& node, const std::vector<ir::Tensor>&, const EvalContext& ctx) {
  auto emit = [&](const ir::Tensor& t) -> Outputs {
    ASSIGN_OR_RETURN(ir::Tensor out, ViewOutput(node, ctx, 0, t, t.dims()));
    return std::vector<ir::Tensor>{out};
  };
  const auto& all = node.attrs.all();
  if (auto it = all.find("value"); it != all.end()) {
    if (const auto* t = std::get_if<ir::Tensor>(&it->second)) return emit(*t);
  }
  if (node.attrs.Has("value_float")) {
    return emit(ir::Tensor::Scalar<float>(node.attrs.Get<float>("value_float")));
  }
  if (node.attrs.Has("value_int")) {
    return emit(ir::Tensor::Scalar<int64_t>(node.attrs.Get<int64_t>("value_int")));
  }
  if (node.attrs.Has("value_floats")) {
    auto v = node.attrs.Get<std::vector<double>>("value_floats");
    std::vector<float> f(v.begin(), v.end());
    return emit(ir::Tensor::FromVector<float>({static_cast<int64_t>(f.size())}, f));
  }
  if (node.attrs.Has("value_ints")) {
    auto v = node.attrs.Get<std::vector<int64_t>>("value_ints");
    return emit(ir::Tensor::FromVector<int64_t>({static_cast<int64_t>(v.size())}, v));
  }
  return INVALID_ARGUMENT() << Describe(node) << ": has no tensor attribute 'value'";
}
REGISTER_CPU_KERNEL(kConstant, ConstantKernel);

// ConstantOfShape: a tensor of the input shape filled with the one-element `value` attribute
// (default f32 0); the output dtype is the value's.
Outputs ConstantOfShapeKernel(const ir::Node& node, const std::vector<ir::Tensor>& in, const EvalContext& ctx) {
  if (in[0].dtype() != ir::DType::kI64 && in[0].dtype() != ir::DType::kI32) {
    return UnsupportedDType(node, "input 0 (shape)", in[0].dtype(), {ir::DType::kI64, ir::DType::kI32});
  }
  if (in[0].rank() > 1) return INVALID_ARGUMENT() << Describe(node) << ": shape input must be 1-D";
  // Default: f32 zeros, which is what a zero-filled output already holds.
  const bool has_value = node.attrs.Has("value");
  const ir::Tensor value = has_value ? node.attrs.Get<ir::Tensor>("value") : ir::Tensor();
  if (has_value && (!value.defined() || value.num_elements() != 1)) {
    return INVALID_ARGUMENT() << Describe(node) << ": attribute value must hold exactly one element";
  }
  const ir::DType dtype = has_value ? value.dtype() : ir::DType::kF32;
  std::vector<int64_t> dims = in[0].ToInt64Vector();
  ASSIGN_OR_RETURN(int64_t n, CheckedNumElements(node, dims, dtype));
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, 0, dtype, dims));
  const int64_t esize = ir::DTypeSize(dtype);
  auto* o = static_cast<uint8_t*>(out.raw());
  if (has_value) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * esize, value.raw(), esize);
  }
  return std::vector<ir::Tensor>{out};
}
REGISTER_CPU_KERNEL(kConstantOfShape, ConstantOfShapeKernel);

}  // namespace
}  // namespace onnxpipe::cpu
