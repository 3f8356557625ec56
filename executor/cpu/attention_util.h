// The attention probabilities that the fused Attention kernel (attention.cc) computes and its
// backward (grad_attention.cc) recomputes: one definition, so the backward's P is the forward's
// bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "executor/cpu/kernel_util.h"

namespace onnxpipe::cpu {

// Where an operand's batch matrices lie in its buffer: matrix (idx over `batch`) starts at
// offset + sum_d idx_d * batch_strides[d] (0 where the operand broadcasts), its rows `row`
// elements apart, its columns adjacent. Contiguous operands have row = the matrix's columns.
struct MatrixLayout {
  int64_t offset = 0;
  std::vector<int64_t> batch_strides;
  int64_t row = 0;
  // Grouped K and V (AttentionShape::kv_group): the last batch dim's index is divided by it.
  int64_t head_group = 1;
};

// What Attention and AttentionGrad read alike from Q (..., Sq, Dh), K (..., Sk, Dh) and
// V (..., Sk, Dv), whose batch dims broadcast, and from the node's attributes. The operands are
// read, and O written, through the node's views (frontend/ir/attention_views.h) when it has them.
struct AttentionShape {
  int64_t sq = 0, dh = 0, sk = 0, dv = 0;
  std::vector<int64_t> batch;     // the broadcast batch dims
  int64_t nbatch = 1;             // batch matrices
  int64_t kv_group = 1;           // query heads per K/V head (ir::AttentionKvGroup; 1: plain broadcast)
  MatrixLayout q, k, v, o;        // in the Q, K, V buffers and in the output buffer
  std::vector<int64_t> out_dims;  // the output buffer's dims (O's, or o_shape)
  bool views = false;             // the node reads or writes through a view
  double scale = 1.0;             // attr scale, 1/sqrt(Dh) by default
  bool causal = false;
  double ratio = 0.0;  // attr dropout, in [0, 1]
};
// InvalidArgument naming the node for mismatched dims or a dropout outside [0, 1]; the caller has
// checked ranks (>= 2) and dtypes.
absl::StatusOr<AttentionShape> GetAttentionShape(const ir::Node& node, const ir::Tensor& q, const ir::Tensor& k,
                                                 const ir::Tensor& v);
// A dense (batch..., rows, cols) buffer over the broadcast batch; with `group` > 1 over the batch
// with its last dim divided by it (a grouped K's or V's gradient), read through head_group.
MatrixLayout DenseLayout(const AttentionShape& a, int64_t rows, int64_t cols, int64_t group = 1);
// The buffer offset of batch matrix t (row-major over `batch`) in `m`.
int64_t MatrixOffset(const AttentionShape& a, const MatrixLayout& m, int64_t t);

// Where one batch matrix's (Sq, Sk) scores read the optional mask: element (i, j) at
// offset + i * row_stride + j * col_stride of `mask` (bool: attend where true; else added).
struct ScoreMask {
  const ir::Tensor* mask = nullptr;  // null: no mask
  bool is_bool = false;
  int64_t offset = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
};

// Row i of the scaled scores (sk values, in place) -> the softmax over the keys that the causal
// rule (key j visible from query i iff j <= i) and the mask leave, in double. False, with the row
// zero-filled, when every key is masked. `lse` (optional): the log-sum-exp of the masked scores
// (-inf when every key is masked), Attention's Stats.
template <typename T>
bool SoftmaxScoreRow(T* row, int64_t i, int64_t sk, bool causal, const ScoreMask& m, float* lse = nullptr) {
  const int64_t visible = causal ? std::min(i + 1, sk) : sk;
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < sk; ++j) {
    T x = row[j];
    if (j >= visible) {
      x = -std::numeric_limits<T>::infinity();
    } else if (m.mask != nullptr) {
      const int64_t mo = m.offset + i * m.row_stride + j * m.col_stride;
      if (m.is_bool) {
        if (!m.mask->data<bool>()[mo]) x = -std::numeric_limits<T>::infinity();
      } else {
        x += m.mask->data<T>()[mo];
      }
    }
    row[j] = x;
    mx = std::max(mx, x);
  }
  if (mx == -std::numeric_limits<T>::infinity()) {
    std::fill(row, row + sk, T(0));
    if (lse != nullptr) *lse = -std::numeric_limits<float>::infinity();
    return false;
  }
  double sum = 0;
  for (int64_t j = 0; j < sk; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  if (lse != nullptr) *lse = static_cast<float>(static_cast<double>(mx) + std::log(sum));
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < sk; ++j) row[j] = static_cast<T>(row[j] * inv);
  return true;
}

}  // namespace onnxpipe::cpu
