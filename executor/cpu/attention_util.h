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

// What Attention and AttentionGrad read alike from Q (..., Sq, Dh), K (..., Sk, Dh) and
// V (..., Sk, Dv), whose batch dims broadcast, and from the node's attributes.
struct AttentionShape {
  int64_t sq = 0, dh = 0, sk = 0, dv = 0;
  std::vector<int64_t> batch;       // the broadcast batch dims
  int64_t nbatch = 1;               // batch matrices
  std::vector<int64_t> qs, ks, vs;  // Q's, K's and V's batch strides over `batch`
  double scale = 1.0;               // attr scale, 1/sqrt(Dh) by default
  bool causal = false;
  double ratio = 0.0;  // attr dropout, in [0, 1]
};
// InvalidArgument naming the node for mismatched dims or a dropout outside [0, 1]; the caller has
// checked ranks (>= 2) and dtypes.
absl::StatusOr<AttentionShape> GetAttentionShape(const ir::Node& node, const ir::Tensor& q, const ir::Tensor& k,
                                                 const ir::Tensor& v);

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
// zero-filled, when every key is masked.
template <typename T>
bool SoftmaxScoreRow(T* row, int64_t i, int64_t sk, bool causal, const ScoreMask& m) {
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
    return false;
  }
  double sum = 0;
  for (int64_t j = 0; j < sk; ++j) {
    row[j] = std::exp(row[j] - mx);
    sum += row[j];
  }
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < sk; ++j) row[j] = static_cast<T>(row[j] * inv);
  return true;
}

}  // namespace onnxpipe::cpu
