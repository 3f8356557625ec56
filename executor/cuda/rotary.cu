// Rotary kernels: one thread per item of a row -- kVec pairs (rotate-half: kVec elements at lo and
// kVec at hi = lo + R/2), or a run of max(kVec, 2) elements holding whole (2i, 2i + 1) pairs
// (interleaved), or a run of kVec passed-through elements -- computing in fp32. kVec is 16 bytes of
// T when every row, half and pointer is 16-byte aligned, else 1.
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/map.cuh"
#include "executor/cuda/rotary.h"

namespace onnxpipe::cuda {
namespace {

template <typename T>
using C = Compute<T>;

// N consecutive elements from p + i in runs of kVec, as compute values.
template <int N, int kVec, typename T>
__device__ __forceinline__ void LoadElems(const T* p, int64_t i, C<T> (&out)[N]) {
#pragma unroll
  for (int a = 0; a < N; a += kVec) {
    const Run<T, kVec> r = LoadRun<kVec>(p, i + a);
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[a + k] = r[k];
  }
}

template <int N, int kVec, typename T>
__device__ __forceinline__ void StoreElems(T* p, int64_t i, const C<T> (&v)[N]) {
#pragma unroll
  for (int a = 0; a < N; a += kVec) {
    Run<T, kVec> r;
#pragma unroll
    for (int k = 0; k < kVec; ++k) r.v[k] = Convert<T>(v[a + k]);
    StoreRun<kVec>(p, i + a, r);
  }
}

__device__ __forceinline__ int64_t TableRow(const RotaryDims& d, int64_t row) {
  int64_t t = 0;
  for (int k = d.lead_rank - 1; k >= 0; --k) {
    const int64_t q = row / d.lead_dims[k];
    t += (row - q * d.lead_dims[k]) * d.table_strides[k];
    row = q;
  }
  return t;
}

// One (lo, hi) pair: the forward rotation or its transpose.
template <bool kTranspose, typename F>
__device__ __forceinline__ void RotatePair(F a, F h, F c_lo, F c_hi, F s_lo, F s_hi, F* out_lo, F* out_hi) {
  if constexpr (kTranspose) {
    *out_lo = a * c_lo + h * s_hi;
    *out_hi = h * c_hi - a * s_lo;
  } else {
    *out_lo = a * c_lo - h * s_lo;
    *out_hi = h * c_hi + a * s_hi;
  }
}

template <typename T, int kVec, bool kInterleaved, bool kTranspose>
__global__ void RotaryKernel(RotaryDims d, const T* __restrict__ x, const T* __restrict__ cos,
                             const T* __restrict__ sin, T* __restrict__ y) {
  constexpr int kRun = kInterleaved ? (kVec > 1 ? kVec : 2) : kVec;  // elements per rotated item
  const int64_t half = d.rotary_dim / 2;
  const int64_t rot_items = kInterleaved ? d.rotary_dim / kRun : half / kRun;
  const int64_t per_row = rot_items + (d.width - d.rotary_dim) / kVec;
  const int64_t total = d.rows * per_row;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t item = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; item < total; item += stride) {
    const int64_t row = item / per_row, k = item - row * per_row;
    const T* xr = x + row * d.width;
    T* yr = y + row * d.width;
    if (k >= rot_items) {  // passed through
      const int64_t i = d.rotary_dim + (k - rot_items) * kVec;
      StoreRun<kVec>(yr, i, LoadRun<kVec>(xr, i));
      continue;
    }
    const int64_t t = TableRow(d, row) * d.rotary_dim;
    const T *c = cos + t, *s = sin + t;
    if constexpr (kInterleaved) {
      const int64_t i = k * kRun;
      C<T> v[kRun], cv[kRun], sv[kRun], out[kRun];
      LoadElems<kRun, kVec>(xr, i, v);
      LoadElems<kRun, kVec>(c, i, cv);
      LoadElems<kRun, kVec>(s, i, sv);
#pragma unroll
      for (int j = 0; j < kRun; j += 2)
        RotatePair<kTranspose>(v[j], v[j + 1], cv[j], cv[j + 1], sv[j], sv[j + 1], &out[j], &out[j + 1]);
      StoreElems<kRun, kVec>(yr, i, out);
    } else {
      const int64_t lo = k * kRun, hi = lo + half;
      C<T> a[kRun], h[kRun], cl[kRun], ch[kRun], sl[kRun], sh[kRun], ol[kRun], oh[kRun];
      LoadElems<kRun, kVec>(xr, lo, a);
      LoadElems<kRun, kVec>(xr, hi, h);
      LoadElems<kRun, kVec>(c, lo, cl);
      LoadElems<kRun, kVec>(c, hi, ch);
      LoadElems<kRun, kVec>(s, lo, sl);
      LoadElems<kRun, kVec>(s, hi, sh);
#pragma unroll
      for (int j = 0; j < kRun; ++j) RotatePair<kTranspose>(a[j], h[j], cl[j], ch[j], sl[j], sh[j], &ol[j], &oh[j]);
      StoreElems<kRun, kVec>(yr, lo, ol);
      StoreElems<kRun, kVec>(yr, hi, oh);
    }
  }
}

template <typename T, int kVec, bool kInterleaved, bool kTranspose>
cudaError_t Launch(const RotaryDims& d, const T* x, const T* cos, const T* sin, T* y, cudaStream_t stream) {
  constexpr int kRun = kInterleaved ? (kVec > 1 ? kVec : 2) : kVec;
  const int64_t rot_items = kInterleaved ? d.rotary_dim / kRun : d.rotary_dim / 2 / kRun;
  const int64_t items = d.rows * (rot_items + (d.width - d.rotary_dim) / kVec);
  RotaryKernel<T, kVec, kInterleaved, kTranspose><<<GridFor(items), kThreads, 0, stream>>>(d, x, cos, sin, y);
  return cudaGetLastError();
}

template <typename T, int kVec>
cudaError_t LaunchForm(const RotaryDims& d, bool transpose, const T* x, const T* cos, const T* sin, T* y,
                       cudaStream_t stream) {
  if (d.interleaved) {
    return transpose ? Launch<T, kVec, true, true>(d, x, cos, sin, y, stream)
                     : Launch<T, kVec, true, false>(d, x, cos, sin, y, stream);
  }
  return transpose ? Launch<T, kVec, false, true>(d, x, cos, sin, y, stream)
                   : Launch<T, kVec, false, false>(d, x, cos, sin, y, stream);
}

}  // namespace

template <typename T>
cudaError_t LaunchRotary(const RotaryDims& d, bool transpose, const T* x, const T* cos, const T* sin, T* y,
                         cudaStream_t stream) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  // Whole 16-byte runs in every row (x's and the tables'), in each half, and aligned pointers.
  const int64_t unit = d.interleaved ? kVec : 2 * kVec;
  const bool wide = d.width % kVec == 0 && d.rotary_dim % unit == 0 && Aligned16(x) && Aligned16(cos) &&
                    Aligned16(sin) && Aligned16(y);
  return wide ? LaunchForm<T, kVec>(d, transpose, x, cos, sin, y, stream)
              : LaunchForm<T, 1>(d, transpose, x, cos, sin, y, stream);
}

template cudaError_t LaunchRotary<float>(const RotaryDims&, bool, const float*, const float*, const float*, float*,
                                         cudaStream_t);
template cudaError_t LaunchRotary<__nv_bfloat16>(const RotaryDims&, bool, const __nv_bfloat16*, const __nv_bfloat16*,
                                                 const __nv_bfloat16*, __nv_bfloat16*, cudaStream_t);

}  // namespace onnxpipe::cuda
