// Shared kernel helpers. The strided loop merges dims before running so that the common cases
// (same-shape elementwise, row-vector bias, scalar operand, Transpose's unchanged inner dim)
// become long runs with unit or zero steps that the per-op inner loops vectorise.
#include "executor/cpu/kernel_util.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

namespace onnxpipe::cpu {

std::string Describe(const ir::Node& node) {
  return std::string(ir::OpName(node.op)) + " node '" + node.name + "'";
}

std::string DimsToString(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << "]";
  return os.str();
}

absl::Status UnsupportedDType(const ir::Node& node, std::string_view what, ir::DType dt,
                              const std::vector<ir::DType>& supported) {
  std::string list;
  for (size_t i = 0; i < supported.size(); ++i) {
    if (i) list += ", ";
    list += ir::DTypeName(supported[i]);
  }
  return INVALID_ARGUMENT() << Describe(node) << ": " << what << " has dtype " << ir::DTypeName(dt)
                            << ", which the CPU backend does not support for this op (supported: "
                            << list << ")";
}

absl::StatusOr<int64_t> NormalizeAxis(const ir::Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank || (rank == 0 && axis != 0)) {
    return INVALID_ARGUMENT() << Describe(node) << ": axis " << axis
                              << " is out of range for an input of rank " << rank << " (expected ["
                              << -rank << ", " << rank << "))";
  }
  return axis < 0 ? axis + rank : axis;
}

absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const ir::Node& node,
                                                   const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) {
      return INVALID_ARGUMENT() << Describe(node) << ": axis " << a
                                << " is out of range for an input of rank " << rank;
    }
    int64_t n = a < 0 ? a + rank : a;
    if (std::find(out.begin(), out.end(), n) != out.end()) {
      return INVALID_ARGUMENT() << Describe(node) << ": axis " << a << " is repeated in axes";
    }
    out.push_back(n);
  }
  return out;
}

absl::StatusOr<int64_t> CheckedNumElements(const ir::Node& node, const std::vector<int64_t>& dims,
                                           ir::DType dt) {
  const int64_t limit = kMaxTensorBytes / std::max<int64_t>(1, ir::DTypeSize(dt));
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : dims) {
    if (d < 0) {
      return INVALID_ARGUMENT() << Describe(node) << ": output shape " << DimsToString(dims)
                                << " has a negative dimension";
    }
    if (d == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t d : dims) {
    if (n > limit / d) {
      return INVALID_ARGUMENT() << Describe(node) << ": output shape " << DimsToString(dims)
                                << " exceeds the " << kMaxTensorBytes << "-byte tensor limit";
    }
    n *= d;
  }
  return n;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int64_t i = static_cast<int64_t>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

absl::StatusOr<std::vector<int64_t>> BroadcastDims(const ir::Node& node,
                                                   const std::vector<std::vector<int64_t>>& shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    bool have = false;
    for (const auto& s : shapes) {
      if (i + s.size() < rank) continue;
      int64_t d = s[i + s.size() - rank];
      if (d == 1) continue;
      if (have && out[i] != d) {
        std::string all;
        for (const auto& t : shapes) all += (all.empty() ? "" : " and ") + DimsToString(t);
        return INVALID_ARGUMENT() << Describe(node) << ": input shapes " << all
                                  << " do not broadcast (numpy rules)";
      }
      out[i] = d;
      have = true;
    }
  }
  return out;
}

std::vector<int64_t> BroadcastStrides(const std::vector<int64_t>& dims, size_t out_rank) {
  std::vector<int64_t> contiguous = ContiguousStrides(dims);
  std::vector<int64_t> s(out_rank, 0);
  for (size_t i = 0; i < dims.size(); ++i) {
    size_t o = out_rank - dims.size() + i;
    s[o] = dims[i] == 1 ? 0 : contiguous[i];
  }
  return s;
}

StridedLoop::StridedLoop(const std::vector<int64_t>& out_dims,
                         const std::vector<std::vector<int64_t>>& strides,
                         const std::vector<int64_t>& offsets) {
  num_operands_ = static_cast<int>(strides.size());
  for (int k = 0; k < num_operands_ && k < static_cast<int>(offsets.size()); ++k) base_[k] = offsets[k];
  num_elements_ = 1;
  for (int64_t d : out_dims) num_elements_ *= d;
  // Merge from the innermost dim outwards; size-1 dims never move an index and are dropped.
  std::vector<int64_t> rdims;  // reversed merged dims
  std::vector<std::array<int64_t, kMaxOperands>> rstrides;
  for (int64_t i = static_cast<int64_t>(out_dims.size()) - 1; i >= 0; --i) {
    if (out_dims[i] == 1) continue;
    std::array<int64_t, kMaxOperands> s{};
    for (int k = 0; k < num_operands_; ++k) s[k] = strides[k][i];
    if (!rdims.empty()) {
      bool mergeable = true;
      for (int k = 0; k < num_operands_; ++k) {
        if (s[k] != rstrides.back()[k] * rdims.back()) mergeable = false;
      }
      if (mergeable) {
        rdims.back() *= out_dims[i];
        continue;
      }
    }
    rdims.push_back(out_dims[i]);
    rstrides.push_back(s);
  }
  if (rdims.empty()) {
    rdims.push_back(1);
    rstrides.push_back({});
  }
  dims_.assign(rdims.rbegin(), rdims.rend());
  strides_.assign(rstrides.rbegin(), rstrides.rend());
}

namespace {
// Transposing copies (the output's innermost dim strided in the input, another dim contiguous)
// go through 32x32 tiles, so that both sides are read and written a cache line at a time instead
// of one element per line on the input side.
template <typename U>
bool TiledCopy(const U* in, U* o, const StridedLoop& loop) {
  const std::vector<int64_t>& dims = loop.merged_dims();
  const size_t rank = dims.size(), last = rank - 1;
  if (rank < 2 || loop.merged_stride(last, 0) == 1) return false;
  size_t p = rank;
  for (size_t d = 0; d < last; ++d) {
    if (loop.merged_stride(d, 0) == 1) p = d;
  }
  if (p == rank) return false;
  constexpr int64_t kTile = 32;
  std::vector<int64_t> out_strides = ContiguousStrides(dims);
  const int64_t rows = dims[p], cols = dims[last], s_col = loop.merged_stride(last, 0);
  int64_t outer = 1;
  for (size_t d = 0; d < last; ++d) {
    if (d != p) outer *= dims[d];
  }
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  ParallelFor(outer * row_tiles, 4, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      int64_t rem = w / row_tiles, in_off = loop.base_offset(0), out_off = 0;
      for (int64_t d = static_cast<int64_t>(last) - 1; d >= 0; --d) {
        if (d == static_cast<int64_t>(p)) continue;
        const int64_t idx = rem % dims[d];
        rem /= dims[d];
        in_off += idx * loop.merged_stride(d, 0);
        out_off += idx * out_strides[d];
      }
      const int64_t i0 = (w % row_tiles) * kTile, i1 = std::min(rows, i0 + kTile);
      for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
        const int64_t j1 = std::min(cols, j0 + kTile);
        for (int64_t i = i0; i < i1; ++i) {
          const U* src = in + in_off + i;
          U* dst = o + out_off + i * out_strides[p];
          for (int64_t j = j0; j < j1; ++j) dst[j] = src[j * s_col];
        }
      }
    }
  });
  return true;
}

template <typename U>
void StridedCopyTyped(const ir::Tensor& src, ir::Tensor& out, const std::vector<int64_t>& dims,
                      const std::vector<int64_t>& strides, int64_t offset) {
  const U* in = src.data<U>();
  U* o = out.mutable_data<U>();
  StridedLoop loop(dims, {strides}, {offset});
  if (TiledCopy(in, o, loop)) return;
  loop.Run([&](int64_t out_off, const int64_t* off, int64_t len, const int64_t* step) {
    const U* p = in + off[0];
    U* q = o + out_off;
    if (step[0] == 1) {
      std::memcpy(q, p, len * sizeof(U));
    } else if (step[0] == 0) {
      std::fill(q, q + len, *p);
    } else {
      for (int64_t i = 0; i < len; ++i) q[i] = p[i * step[0]];
    }
  });
}
}  // namespace

void StridedCopyInto(const ir::Tensor& src, const std::vector<int64_t>& strides, int64_t offset,
                     ir::Tensor& out) {
  if (out.num_elements() == 0) return;
  DispatchBySize(src.dtype(), [&](auto tag) {
    StridedCopyTyped<typename decltype(tag)::type>(src, out, out.dims(), strides, offset);
    return 0;
  });
}

absl::StatusOr<ir::Tensor> StridedCopyOutput(const ir::Node& node, const EvalContext& ctx,
                                             int index, const ir::Tensor& src,
                                             const std::vector<int64_t>& dims,
                                             const std::vector<int64_t>& strides, int64_t offset) {
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, index, src.dtype(), dims));
  StridedCopyInto(src, strides, offset, out);
  return out;
}

absl::StatusOr<ir::Tensor> AllocOutput(const ir::Node& node, const EvalContext& ctx, int index,
                                       ir::DType dtype, std::vector<int64_t> dims) {
  if (ctx.outputs == nullptr) return ir::Tensor(dtype, std::move(dims));
  return ctx.outputs->Allocate(node, index, dtype, dims);
}

absl::StatusOr<ir::Tensor> ViewOutput(const ir::Node& node, const EvalContext& ctx, int index,
                                      const ir::Tensor& input, std::vector<int64_t> dims) {
  if (ctx.outputs == nullptr || ctx.outputs->SharesInputBuffer(node, index)) {
    return input.Reshaped(std::move(dims));
  }
  ASSIGN_OR_RETURN(ir::Tensor out, AllocOutput(node, ctx, index, input.dtype(), std::move(dims)));
  RET_CHECK(out.num_bytes() == input.num_bytes()) << Describe(node) << ": a view changes the size";
  if (out.num_bytes() > 0) std::memcpy(out.raw(), input.raw(), out.num_bytes());
  return out;
}

void SetBlasThreads(int num_threads) { openblas_set_num_threads(std::max(1, num_threads)); }

absl::Status CheckGemmSize(const ir::Node& node, int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (m > kMax || n > kMax || k > kMax) {
    return INVALID_ARGUMENT() << Describe(node) << ": GEMM of size " << m << "x" << n << "x" << k
                              << " exceeds the 32-bit sizes CBLAS accepts";
  }
  return absl::OkStatus();
}

template <>
void Gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                 int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(std::max<int64_t>(lda, 1)), b, static_cast<int>(std::max<int64_t>(ldb, 1)),
              beta, c, static_cast<int>(std::max<int64_t>(ldc, 1)));
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                  const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
                  int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a,
              static_cast<int>(std::max<int64_t>(lda, 1)), b, static_cast<int>(std::max<int64_t>(ldb, 1)),
              beta, c, static_cast<int>(std::max<int64_t>(ldc, 1)));
}

}  // namespace onnxpipe::cpu
