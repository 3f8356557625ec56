// Softmax, LogSoftmax and fused softmax + cross-entropy kernels (contract in softmax.h).
//
// A block owns a row. The first pass keeps, per thread, a running maximum m and sum s of exp(x - m)
// (rescaled when m grows: the "online" softmax), so the row is read once for its statistics; the
// block then combines (m, s) pairs against the block maximum. The second pass re-reads the row
// (served from L2 for rows of up to a few hundred KB) to write the output.
//
// Rows are walked as a scalar head up to the first 16-byte boundary, a body of 16-byte packs and a
// scalar tail (ForRow), so odd row lengths (a 50257-word vocabulary) still load 16 bytes at a
// time; this needs every buffer indexed alongside to share the row's misalignment, else the
// launchers fall back to element-wise access.
#include <cmath>
#include <type_traits>

#include "executor/cuda/row_kernels.cuh"
#include "executor/cuda/softmax.h"

namespace onnxpipe::cuda {
namespace {

using rows::BlockMax;
using rows::BlockSum;
using rows::LoadFloats;
using rows::StoreFloats;
using rows::ToFloat;

constexpr int kMaxThreads = 512;

// One thread per pack up to kMaxThreads.
int ThreadsForRow(int64_t n, int vec) { return rows::ThreadsFor((n + vec - 1) / vec, kMaxThreads); }

// Calls f(integral_constant W, index) for this thread's share of a row of n elements starting at
// `row`: W = VEC for 16-byte-aligned packs of the body (index = first element), W = 1 for the head
// and tail elements. The split depends only on row's address modulo VEC elements.
template <typename T, int VEC, typename F>
__device__ __forceinline__ void ForRow(const T* row, int64_t n, F&& f) {
  constexpr int kBytes = VEC * static_cast<int>(sizeof(T));
  const int misaligned = static_cast<int>(reinterpret_cast<uintptr_t>(row) % kBytes) / static_cast<int>(sizeof(T));
  const int64_t head = misaligned == 0 ? 0 : (VEC - misaligned < n ? VEC - misaligned : n);
  const int64_t packs = (n - head) / VEC;
  const int64_t tail = head + packs * VEC;
  if (threadIdx.x < head) f(std::integral_constant<int, 1>{}, int64_t{threadIdx.x});
  for (int64_t c = threadIdx.x; c < packs; c += blockDim.x) f(std::integral_constant<int, VEC>{}, head + c * VEC);
  if (threadIdx.x < n - tail) f(std::integral_constant<int, 1>{}, tail + threadIdx.x);
}

// Running maximum and sum of exp(x - maximum) over the values one thread has seen.
struct OnlineExpSum {
  float m = -INFINITY;
  float s = 0.f;
  template <int W>
  __device__ __forceinline__ void Add(const float (&v)[W]) {
    float cm = v[0];
#pragma unroll
    for (int j = 1; j < W; ++j) cm = fmaxf(cm, v[j]);
    if (cm > m) {  // rescale once per pack; expf(-inf) = 0 on the first
      s *= expf(m - cm);
      m = cm;
    }
    if (cm == -INFINITY && m == -INFINITY) return;  // -inf adds 0 (and -inf - -inf would be NaN)
#pragma unroll
    for (int j = 0; j < W; ++j) s += expf(v[j] - m);
  }
  // This thread's sum rescaled to the block maximum `bm`.
  __device__ __forceinline__ float ScaledTo(float bm) const { return m == -INFINITY ? 0.f : s * expf(m - bm); }
};

// Same misalignment modulo 16 bytes (null pointers do not constrain).
template <typename... P>
bool SameMisalignment(const void* first, const P*... rest) {
  const uintptr_t r = reinterpret_cast<uintptr_t>(first) % 16;
  return ((rest == nullptr || reinterpret_cast<uintptr_t>(rest) % 16 == r) && ...);
}

// Calls f(integral_constant VEC): 16-byte packs when the buffers share their misalignment.
template <typename T, typename F>
cudaError_t WithVec(bool vectorise, F&& f) {
  if (vectorise) return f(std::integral_constant<int, rows::kVec16<T>>{});
  return f(std::integral_constant<int, 1>{});
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads) SoftmaxForwardKernel(const T* x, T* y, int64_t n, bool log) {
  __shared__ float smem[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  OnlineExpSum acc;
  ForRow<T, VEC>(x + base, n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float v[W];
    LoadFloats<T, W>(x + base + i, v);
    acc.Add(v);
  });
  const float mx = BlockMax(acc.m, smem);
  float sum[1] = {acc.ScaledTo(mx)};
  BlockSum<1>(sum, smem);
  const float inv = 1.f / sum[0], log_sum = logf(sum[0]);
  ForRow<T, VEC>(x + base, n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float v[W];
    LoadFloats<T, W>(x + base + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = log ? (v[j] - mx) - log_sum : expf(v[j] - mx) * inv;
    StoreFloats<T, W>(y + base + i, v);
  });
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kMaxThreads)
    SoftmaxBackwardKernel(const T* dy, const T* y, T* dx, int64_t n, bool log) {
  __shared__ float smem[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  float sum[1] = {0.f};  // sum(dy * y), or sum(dy) for LogSoftmax
  ForRow<T, VEC>(dy + base, n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float g[W], p[W];
    LoadFloats<T, W>(dy + base + i, g);
    LoadFloats<T, W>(y + base + i, p);
#pragma unroll
    for (int j = 0; j < W; ++j) sum[0] += log ? g[j] : g[j] * p[j];
  });
  BlockSum<1>(sum, smem);
  ForRow<T, VEC>(dy + base, n, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float g[W], p[W];
    LoadFloats<T, W>(dy + base + i, g);
    LoadFloats<T, W>(y + base + i, p);
#pragma unroll
    for (int j = 0; j < W; ++j) g[j] = log ? g[j] - expf(p[j]) * sum[0] : p[j] * (g[j] - sum[0]);
    StoreFloats<T, W>(dx + base + i, g);
  });
}

// --- cross-entropy ----------------------------------------------------------------------------
// Workspace: [0] sum of w_l over counted rows, [1] W = sum of the class weights, [2, 2 + rows) the
// row losses (kMean/kSum).

template <typename T, typename L>
__device__ __forceinline__ bool Counted(const CrossEntropyArgs<T, L>& a, int64_t label) {
  return !(a.has_ignore_index && label == a.ignore_index) && label >= 0 && label < a.classes;
}

template <typename T, typename L>
__device__ __forceinline__ float Weight(const CrossEntropyArgs<T, L>& a, int64_t c) {
  return a.weights != nullptr ? a.weights[c] : 1.f;
}

// What a row's dlogits are made of: coef (0 on rows that count nothing), its label and w_label, W and e / C.
struct RowGrad {
  float coef, w_label, w_total, e_over_c;
  int64_t label;
};

template <typename T, typename L>
__device__ __forceinline__ RowGrad MakeRowGrad(const CrossEntropyArgs<T, L>& a, int64_t row, int64_t label) {
  RowGrad r{0.f, 0.f, a.workspace[1], a.label_smoothing / static_cast<float>(a.classes), label};
  if (Counted(a, label)) {
    const float dl = a.dloss == nullptr ? 1.f : a.dloss[a.reduction == LossReduction::kNone ? row : 0];
    const float denom = a.workspace[0];
    r.coef = a.reduction != LossReduction::kMean ? dl : (denom != 0.f ? dl / denom : 0.f);
    r.w_label = Weight(a, label);
  }
  return r;
}

// dlogits[k] for probability p of class k.
template <typename T, typename L>
__device__ __forceinline__ float GradAt(const CrossEntropyArgs<T, L>& a, const RowGrad& r, int64_t k, float p) {
  const float e = a.label_smoothing;
  float g = (1.f - e) * r.w_label * (k == r.label ? p - 1.f : p);
  if (e != 0.f) g += r.e_over_c * (r.w_total * p - Weight(a, k));
  return r.coef == 0.f ? 0.f : r.coef * g;
}

// Loads per thread in flight in the one-block loops below (a single block must keep many loads
// in flight to stream (rows) values).
constexpr int kUnroll = 8;

// One block: the label-weight total and W.
template <typename T, typename L>
__global__ void __launch_bounds__(kMaxThreads) CrossEntropyPrepKernel(CrossEntropyArgs<T, L> a) {
  __shared__ float smem[64];
  float v[2] = {0.f, 0.f};
  for (int64_t r0 = threadIdx.x; r0 < a.rows; r0 += int64_t{blockDim.x} * kUnroll) {
    int64_t label[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + int64_t{u} * blockDim.x;
      label[u] = r < a.rows ? static_cast<int64_t>(a.labels[r]) : -1;  // -1: not counted
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (Counted(a, label[u])) v[0] += Weight(a, label[u]);
    }
  }
  for (int64_t c = threadIdx.x; c < a.classes; c += blockDim.x) v[1] += Weight(a, c);
  BlockSum<2>(v, smem);
  if (threadIdx.x == 0) {
    a.workspace[0] = v[0];
    a.workspace[1] = v[1];
  }
}

template <typename T, typename L, int VEC>
__global__ void __launch_bounds__(kMaxThreads) CrossEntropyRowKernel(CrossEntropyArgs<T, L> a) {
  __shared__ float smem[64];
  const int64_t row = blockIdx.x;
  const int64_t c_count = a.classes;
  const int64_t base = row * c_count;
  const int64_t label = static_cast<int64_t>(a.labels[row]);
  const bool ignored = a.has_ignore_index && label == a.ignore_index;
  const bool valid = Counted(a, label);
  const float e = a.label_smoothing;
  // Read before any thread can overwrite it (dlogits may alias logits; the reductions below sync).
  const float x_label = valid && threadIdx.x == 0 ? ToFloat(a.logits[base + label]) : 0.f;
  OnlineExpSum acc;
  float wx = 0.f;  // sum of w_c x_c, for label smoothing
  ForRow<T, VEC>(a.logits + base, c_count, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float v[W];
    LoadFloats<T, W>(a.logits + base + i, v);
    acc.Add(v);
    if (e != 0.f) {
#pragma unroll
      for (int j = 0; j < W; ++j) wx += Weight(a, i + j) * v[j];
    }
  });
  const float mx = BlockMax(acc.m, smem);
  float sums[2] = {acc.ScaledTo(mx), wx};
  BlockSum<2>(sums, smem);
  const float log_sum = logf(sums[0]);
  const float lse = mx + log_sum;
  const float w_total = a.workspace[1];
  const float w_label = valid ? Weight(a, label) : 0.f;
  const float e_over_c = e / static_cast<float>(c_count);
  if (threadIdx.x == 0) {
    float row_loss = ignored ? 0.f : NAN;
    if (valid) {
      row_loss = (1.f - e) * w_label * (lse - x_label);
      if (e != 0.f) row_loss += e_over_c * (w_total * lse - sums[1]);
    }
    if (a.reduction == LossReduction::kNone) {
      a.loss[row] = row_loss;
    } else {
      a.workspace[2 + row] = row_loss;
    }
    if (a.stats != nullptr) {
      a.stats[2 * row] = mx;
      a.stats[2 * row + 1] = log_sum;
    }
  }
  if (a.dlogits == nullptr) return;
  const RowGrad rg = MakeRowGrad(a, row, label);
  ForRow<T, VEC>(a.logits + base, c_count, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float v[W];
    LoadFloats<T, W>(a.logits + base + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = GradAt(a, rg, i + j, expf(v[j] - lse));
    StoreFloats<T, W>(a.dlogits + base + i, v);
  });
}

// dlogits of a row from the forward's statistics: p = exp((x - m) - s), one pass over the logits.
template <typename T, typename L, int VEC>
__global__ void __launch_bounds__(kMaxThreads) CrossEntropyGradKernel(CrossEntropyArgs<T, L> a) {
  const int64_t row = blockIdx.x;
  const int64_t base = row * a.classes;
  const RowGrad rg = MakeRowGrad(a, row, static_cast<int64_t>(a.labels[row]));
  const float m = a.stats[2 * row], s = a.stats[2 * row + 1];
  ForRow<T, VEC>(a.logits + base, a.classes, [&](auto w, int64_t i) {
    constexpr int W = decltype(w)::value;
    float v[W];
    LoadFloats<T, W>(a.logits + base + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = GradAt(a, rg, i + j, expf((v[j] - m) - s));
    StoreFloats<T, W>(a.dlogits + base + i, v);
  });
}

// One block: loss = sum of the row losses (kSum), divided by the label-weight total (kMean).
__global__ void __launch_bounds__(kMaxThreads)
    CrossEntropyReduceKernel(const float* __restrict__ workspace, int64_t rows, bool mean, float* __restrict__ loss) {
  __shared__ float smem[32];
  float total[1] = {0.f};
  for (int64_t r0 = threadIdx.x; r0 < rows; r0 += int64_t{blockDim.x} * kUnroll) {
    float part[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t r = r0 + int64_t{u} * blockDim.x;
      part[u] = r < rows ? workspace[2 + r] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) total[0] += part[u];
  }
  BlockSum<1>(total, smem);
  if (threadIdx.x == 0) loss[0] = mean ? total[0] / workspace[0] : total[0];
}

}  // namespace

template <typename T>
cudaError_t LaunchSoftmaxForward(const T* x, T* y, int64_t rows, int64_t n, bool log, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return WithVec<T>(SameMisalignment(x, y), [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    SoftmaxForwardKernel<T, kVec><<<static_cast<unsigned>(rows), ThreadsForRow(n, kVec), 0, stream>>>(x, y, n, log);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t LaunchSoftmaxBackward(const T* dy, const T* y, T* dx, int64_t rows, int64_t n, bool log,
                                  cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return WithVec<T>(SameMisalignment(dy, y, dx), [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    SoftmaxBackwardKernel<T, kVec>
        <<<static_cast<unsigned>(rows), ThreadsForRow(n, kVec), 0, stream>>>(dy, y, dx, n, log);
    return cudaGetLastError();
  });
}

int64_t CrossEntropyWorkspaceBytes(int64_t rows) { return (2 + rows) * static_cast<int64_t>(sizeof(float)); }

template <typename T, typename L>
cudaError_t LaunchCrossEntropy(const CrossEntropyArgs<T, L>& a, cudaStream_t stream) {
  CrossEntropyPrepKernel<T, L><<<1, kMaxThreads, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (a.rows > 0) {
    err = WithVec<T>(SameMisalignment(a.logits, a.dlogits), [&](auto vec) {
      constexpr int kVec = decltype(vec)::value;
      CrossEntropyRowKernel<T, L, kVec>
          <<<static_cast<unsigned>(a.rows), ThreadsForRow(a.classes, kVec), 0, stream>>>(a);
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  if (a.reduction == LossReduction::kNone) return cudaSuccess;
  CrossEntropyReduceKernel<<<1, kMaxThreads, 0, stream>>>(a.workspace, a.rows, a.reduction == LossReduction::kMean,
                                                          a.loss);
  return cudaGetLastError();
}

template <typename T, typename L>
cudaError_t LaunchCrossEntropyGrad(const CrossEntropyArgs<T, L>& a, cudaStream_t stream) {
  CrossEntropyPrepKernel<T, L><<<1, kMaxThreads, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.rows == 0) return err;
  return WithVec<T>(SameMisalignment(a.logits, a.dlogits), [&](auto vec) {
    constexpr int kVec = decltype(vec)::value;
    CrossEntropyGradKernel<T, L, kVec><<<static_cast<unsigned>(a.rows), ThreadsForRow(a.classes, kVec), 0, stream>>>(a);
    return cudaGetLastError();
  });
}

#define ONNXPIPE_SOFTMAX_INSTANTIATE(T)                                                                        \
  template cudaError_t LaunchSoftmaxForward<T>(const T*, T*, int64_t, int64_t, bool, cudaStream_t);            \
  template cudaError_t LaunchSoftmaxBackward<T>(const T*, const T*, T*, int64_t, int64_t, bool, cudaStream_t); \
  template cudaError_t LaunchCrossEntropy<T, int64_t>(const CrossEntropyArgs<T, int64_t>&, cudaStream_t);      \
  template cudaError_t LaunchCrossEntropy<T, int32_t>(const CrossEntropyArgs<T, int32_t>&, cudaStream_t);      \
  template cudaError_t LaunchCrossEntropyGrad<T, int64_t>(const CrossEntropyArgs<T, int64_t>&, cudaStream_t);  \
  template cudaError_t LaunchCrossEntropyGrad<T, int32_t>(const CrossEntropyArgs<T, int32_t>&, cudaStream_t);
ONNXPIPE_SOFTMAX_INSTANTIATE(float)
ONNXPIPE_SOFTMAX_INSTANTIATE(__nv_bfloat16)
#undef ONNXPIPE_SOFTMAX_INSTANTIATE

}  // namespace onnxpipe::cuda
