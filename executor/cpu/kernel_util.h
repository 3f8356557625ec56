// Helpers shared by the CPU kernels: error messages, dtype dispatch, axes, broadcasting and a
// parallel strided loop that covers elementwise ops, broadcasting, Expand, Transpose and Slice.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "executor/cpu/kernel.h"
#include "executor/cpu/thread_pool.h"
#include "frontend/ir/graph.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cpu {

// "Softmax node '/layers.0/Softmax'": the prefix of every kernel error.
std::string Describe(const ir::Node& node);
std::string DimsToString(const std::vector<int64_t>& dims);

// --- outputs ----------------------------------------------------------------------------------
// Zero-filled storage for output `index` of `node`: the planned slot under a planned executor
// (ctx.outputs), a fresh tensor otherwise. Every kernel output comes from here or ViewOutput.
absl::StatusOr<ir::Tensor> AllocOutput(const ir::Node& node, const EvalContext& ctx, int index,
                                       ir::DType dtype, std::vector<int64_t> dims);
// Output `index` holding `input`'s bytes as `dims` (same element count): a view of `input` unless
// the executor planned the output its own buffer (then a copy into that slot).
absl::StatusOr<ir::Tensor> ViewOutput(const ir::Node& node, const EvalContext& ctx, int index,
                                      const ir::Tensor& input, std::vector<int64_t> dims);

// True when the node has output i (kernels skip optional outputs nobody asked for).
inline bool WantsOutput(const ir::Node& node, size_t i) {
  return i < node.outputs.size() && node.outputs[i] != ir::kNoValue;
}

// True when optional input i is present.
inline bool HasInput(const std::vector<ir::Tensor>& inputs, size_t i) {
  return i < inputs.size() && inputs[i].defined();
}

// --- dtype dispatch ---------------------------------------------------------------------------
template <typename... Ts>
struct TypeList {};
template <typename T>
struct Tag {
  using type = T;
};
using FloatTypes = TypeList<float, double>;
using NumericTypes = TypeList<float, double, int64_t, int32_t>;
using IntTypes = TypeList<int64_t, int32_t>;

absl::Status UnsupportedDType(const ir::Node& node, std::string_view what, ir::DType dt,
                              const std::vector<ir::DType>& supported);

// Calls f(Tag<T>{}) for the T of `dt` among Ts; an InvalidArgument naming the node, `what`
// ("input 0") and the supported dtypes otherwise. Kernels are written once as templates and
// instantiated for each listed type, never copied per dtype.
template <typename... Ts, typename F>
auto DispatchDType(TypeList<Ts...>, const ir::Node& node, std::string_view what, ir::DType dt,
                   F&& f) -> decltype(f(Tag<std::tuple_element_t<0, std::tuple<Ts...>>>{})) {
  using R = decltype(f(Tag<std::tuple_element_t<0, std::tuple<Ts...>>>{}));
  std::optional<R> result;
  (void)((ir::DTypeOf<Ts>::value == dt ? (result.emplace(f(Tag<Ts>{})), true) : false) || ...);
  if (!result) return UnsupportedDType(node, what, dt, {ir::DTypeOf<Ts>::value...});
  return std::move(*result);
}

// Calls f(Tag<U>{}) with an unsigned type of the element size of `dt`: for kernels that only move
// elements (Transpose, Concat, Gather, ...), which are then right for every dtype.
template <typename F>
auto DispatchBySize(ir::DType dt, F&& f) -> decltype(f(Tag<uint8_t>{})) {
  switch (ir::DTypeSize(dt)) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    default: return f(Tag<uint64_t>{});
  }
}

// --- axes and shapes --------------------------------------------------------------------------
// Maps axis in [-rank, rank) to [0, rank); InvalidArgument naming the node otherwise.
absl::StatusOr<int64_t> NormalizeAxis(const ir::Node& node, int64_t axis, int64_t rank);
// Normalises and checks a list of axes (no duplicates).
absl::StatusOr<std::vector<int64_t>> NormalizeAxes(const ir::Node& node,
                                                   const std::vector<int64_t>& axes, int64_t rank);
// Element count of dims coming from data (Reshape, Expand, Range, ...): rejects negative dims
// and tensors over kMaxTensorBytes so that a bad shape is an error, not a failed allocation.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 37;
absl::StatusOr<int64_t> CheckedNumElements(const ir::Node& node, const std::vector<int64_t>& dims,
                                           ir::DType dt);

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& dims);
// numpy broadcasting of several shapes.
absl::StatusOr<std::vector<int64_t>> BroadcastDims(
    const ir::Node& node, const std::vector<std::vector<int64_t>>& shapes);
// Strides (in elements) for reading a contiguous tensor of `dims` as if broadcast to a shape of
// rank `out_rank` (dims aligned to the right): 0 along broadcast dims.
std::vector<int64_t> BroadcastStrides(const std::vector<int64_t>& dims, size_t out_rank);

// --- strided loop -----------------------------------------------------------------------------
// Walks a contiguous output of `out_dims` in row-major order together with up to kMaxOperands
// operands, each read at base offset + sum(index[d] * strides[d]) (strides in elements, may be 0
// or negative). Adjacent dims that are contiguous for every operand are merged first, so
// broadcasting a bias or a same-shape add runs as long unit-stride runs.
class StridedLoop {
 public:
  static constexpr int kMaxOperands = 4;
  StridedLoop(const std::vector<int64_t>& out_dims, const std::vector<std::vector<int64_t>>& strides,
              const std::vector<int64_t>& offsets = {});

  int64_t num_elements() const { return num_elements_; }
  // The merged iteration space: dims (innermost last) and operand k's stride along each.
  const std::vector<int64_t>& merged_dims() const { return dims_; }
  int64_t merged_stride(size_t dim, int operand) const { return strides_[dim][operand]; }
  int64_t base_offset(int operand) const { return base_[operand]; }

  // Calls fn(out_offset, operand_offsets, len, operand_steps) for runs of `len` consecutive
  // output elements, operand k advancing by operand_steps[k] per element; runs are distributed
  // over the thread pool in contiguous chunks of about `grain` elements.
  template <typename Fn>
  void Run(Fn&& fn, int64_t grain = 1 << 14) const {
    if (num_elements_ == 0) return;
    const int rank = static_cast<int>(dims_.size());
    const int64_t inner = dims_.back();
    const int64_t rows = num_elements_ / inner;
    ParallelFor(rows, std::max<int64_t>(1, grain / inner), [&](int64_t row_begin, int64_t row_end) {
      std::array<int64_t, kMaxOperands> off = base_;
      std::array<int64_t, kMaxOperands> step{};
      for (int k = 0; k < num_operands_; ++k) step[k] = strides_[rank - 1][k];
      // Multi-index of row_begin over the outer dims.
      std::vector<int64_t> idx(rank, 0);
      int64_t r = row_begin;
      for (int d = rank - 2; d >= 0; --d) {
        idx[d] = r % dims_[d];
        r /= dims_[d];
        for (int k = 0; k < num_operands_; ++k) off[k] += idx[d] * strides_[d][k];
      }
      for (int64_t row = row_begin; row < row_end; ++row) {
        fn(row * inner, off.data(), inner, step.data());
        for (int d = rank - 2; d >= 0; --d) {
          for (int k = 0; k < num_operands_; ++k) off[k] += strides_[d][k];
          if (++idx[d] < dims_[d]) break;
          for (int k = 0; k < num_operands_; ++k) off[k] -= dims_[d] * strides_[d][k];
          idx[d] = 0;
        }
      }
    });
  }

 private:
  std::vector<int64_t> dims_;  // merged dims, innermost last, at least one
  std::vector<std::array<int64_t, kMaxOperands>> strides_;  // per merged dim, per operand
  std::array<int64_t, kMaxOperands> base_{};
  int num_operands_ = 0;
  int64_t num_elements_ = 0;
};

// Copies `src` read through (strides, offset) into the contiguous tensor `out` (its dims are the
// iteration space). Transpose, Expand and Slice are this copy with different strides; works for
// every dtype.
void StridedCopyInto(const ir::Tensor& src, const std::vector<int64_t>& strides, int64_t offset,
                     ir::Tensor& out);
// StridedCopyInto a new output `index` of `node` of `dims` (AllocOutput).
absl::StatusOr<ir::Tensor> StridedCopyOutput(const ir::Node& node, const EvalContext& ctx,
                                             int index, const ir::Tensor& src,
                                             const std::vector<int64_t>& dims,
                                             const std::vector<int64_t>& strides, int64_t offset);

// Row-major GEMM through CBLAS: C (M, N) = alpha * op(A) op(B) + beta * C.
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);
// One Gemm (beta 0) per matrix of the broadcast `batch` of a_batch and b_batch: output matrix t
// (m x n, contiguous in c) reads, in place, the A matrix (a_size elements) and the B matrix
// (b_size elements) that broadcasting maps it to.
template <typename T>
void BroadcastBatchGemm(const std::vector<int64_t>& batch, const std::vector<int64_t>& a_batch,
                        const std::vector<int64_t>& b_batch, bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, T alpha, const T* a, int64_t a_size, int64_t lda, const T* b, int64_t b_size,
                        int64_t ldb, T* c) {
  const std::vector<int64_t> as = BroadcastStrides(a_batch, batch.size());
  const std::vector<int64_t> bs = BroadcastStrides(b_batch, batch.size());
  int64_t nbatch = 1;
  for (int64_t d : batch) nbatch *= d;
  for (int64_t t = 0; t < nbatch; ++t) {
    int64_t rem = t, ai = 0, bi = 0;
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      ai += idx * as[d];
      bi += idx * bs[d];
    }
    Gemm<T>(trans_a, trans_b, m, n, k, alpha, a + ai * a_size, lda, b + bi * b_size, ldb, T(0), c + t * m * n, n);
  }
}
// CBLAS takes 32-bit sizes; InvalidArgument naming the node when a GEMM exceeds them.
absl::Status CheckGemmSize(const ir::Node& node, int64_t m, int64_t n, int64_t k);
// The threads OpenBLAS runs each GEMM on (its own pool, sized by OPENBLAS_NUM_THREADS or the CPUs otherwise).
void SetBlasThreads(int num_threads);

}  // namespace onnxpipe::cpu
