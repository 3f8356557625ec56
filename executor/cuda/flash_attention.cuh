// Building blocks of the fused attention kernels (flash_attention_fwd.cu, flash_attention_bwd.cu):
// shared-memory tiles, the two register-tiled products, score masking and dropout. .cu files only.
//
// Thread layout (every kernel): a CTA of kWarps = 4 warps owns 64 "rows" (queries in the forward
// and dQ kernels, keys in the dK/dV kernel), 16 per warp, and walks tiles of 64 "columns" (keys,
// resp. queries). Lane l of warp w has a row group rg < 4 (lane bits 0 and 2) and a column group
// cg < 8 (lane bits 1, 3, 4); it holds rows w * 16 + rg * 4 + m (m < 4) and, of a 64-column score
// tile, columns 4 * (cg + 8 h) + n (h < 2, n < 4): a 4 x 8 register tile, whose four consecutive
// columns share Philox blocks. Row statistics are reduced over the 8 lanes of a row group
// (shuffles over lane bits 1, 3, 4).
//
// Shared memory returns one 32-bit register per lane and cycle, so a 128-bit load costs 4 cycles,
// or 2 when lanes l and l ^ 1 (or l and l ^ 2) read the same address. The lane layout makes every
// load of the products below such a pair load: lanes l, l ^ 1 share a column group (the same
// B-operand quad) and lanes l, l ^ 2 a row group (the same A-operand quad), so 12 loads feed 128
// FMAs in 24 cycles, under the 32 that the FMAs take.
// Shared tiles (and the warps' P buffers) are row-major in 4-element quads, quad q of row r stored
// at q ^ ((r / 4) % 8): the quads one load reads -- quad q of rows 4 cg + n, of rows 4 rg + m, or
// quads cg of one row -- lie in different bank groups, so no load has a bank conflict.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/flash_attention.h"

namespace onnxpipe::cuda::flash {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 64;  // rows of a CTA, columns of a step

template <typename T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

__device__ __forceinline__ int RowGroup(int lane) { return (lane & 1) | ((lane >> 1) & 2); }
__device__ __forceinline__ int ColGroup(int lane) { return ((lane >> 1) & 1) | ((lane >> 2) & 6); }

template <typename T>
__device__ __forceinline__ T NegInf() {
  return -INFINITY;
}

// exp(x) for x <= 0 (or -inf): fp32 through exp2 of the rescaled argument, fp64 through exp.
__device__ __forceinline__ float ExpNonPositive(float x) { return exp2f(x * 1.4426950408889634f); }
__device__ __forceinline__ double ExpNonPositive(double x) { return exp(x); }

// --- shared-memory tiles -----------------------------------------------------------------------

template <int D>
__device__ __forceinline__ int SwizzledOffset(int r, int c) {
  return r * D + (((c >> 2) ^ ((r >> 2) & 7)) << 2) + (c & 3);
}

template <typename T, int D>
__device__ __forceinline__ Quad<T> LoadQuad(const T* tile, int r, int q) {
  return *reinterpret_cast<const Quad<T>*>(tile + r * D + ((q ^ ((r >> 2) & 7)) << 2));
}

__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
#else
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

template <typename T>
__device__ __forceinline__ void CpAsyncElement(T* dst, const T* src) {
#if __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (sizeof(T) == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(src));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(src));
  }
#else
  *dst = *src;
#endif
}

__device__ __forceinline__ void CpAsyncCommit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits for every copy this thread issued; a __syncthreads() after it publishes all threads' copies.
__device__ __forceinline__ void CpAsyncWaitAll() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}

// Element offset of (r, c) in a shared tile of D columns in the layout above (4-element quads).
template <int D>
struct QuadSwizzle {
  static __device__ __forceinline__ int Offset(int r, int c) { return SwizzledOffset<D>(r, c); }
};

// Starts copying rows [row0, row0 + kRows) x columns [0, D) of the (rows, cols) matrix at g, whose
// rows are ld elements apart, into `tile`, element (r, c) at Layout::Offset(r, c); rows >= rows and
// columns >= cols read as zero. vec: 16-byte copies (cols and ld multiples of 16 / sizeof(T), g
// 16-byte aligned; Layout keeps 16-byte chunks whole); else element copies (asynchronous for 4- and
// 8-byte elements).
template <typename T, int D, typename Layout = QuadSwizzle<D>, int kRows = kTile>
__device__ __forceinline__ void LoadTile(T* tile, const T* g, int64_t row0, int64_t rows, int64_t cols, int64_t ld,
                                         bool vec) {
  if (vec) {
    constexpr int kChunk = 16 / sizeof(T);
    constexpr int kPerRow = D / kChunk;
    for (int c = threadIdx.x; c < kRows * kPerRow; c += kThreads) {
      const int r = c / kPerRow, e = (c % kPerRow) * kChunk;
      T* dst = tile + Layout::Offset(r, e);
      if (row0 + r < rows && e < cols) {
        CpAsync16(dst, g + (row0 + r) * ld + e);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
    }
  } else {
    for (int c = threadIdx.x; c < kRows * D; c += kThreads) {
      const int r = c / D, e = c % D;
      T* dst = tile + Layout::Offset(r, e);
      if (row0 + r < rows && e < cols) {
        if constexpr (sizeof(T) >= 4) {
          CpAsyncElement(dst, g + (row0 + r) * ld + e);
        } else {
          *dst = g[(row0 + r) * ld + e];
        }
      } else {
        *dst = T(0);
      }
    }
  }
}

// One operand of a tile load: its batch matrix, columns, row stride and whether it takes 16-byte copies.
template <typename T>
struct TileSource {
  const T* g;
  int64_t cols, ld;
  bool vec;
};

// The tile pair every kernel streams: rows [row0, row0 + kRows) of a (rows, a.cols) and of b (rows,
// b.cols) into the consecutive (kRows, D) tiles at dst (a's, then b's).
template <typename T, int D, typename Layout = QuadSwizzle<D>, int kRows = kTile>
__device__ __forceinline__ void LoadTilePair(T* dst, const TileSource<T>& a, const TileSource<T>& b, int64_t row0,
                                             int64_t rows) {
  LoadTile<T, D, Layout, kRows>(dst, a.g, row0, rows, a.cols, a.ld, a.vec);
  LoadTile<T, D, Layout, kRows>(dst + kRows * D, b.g, row0, rows, b.cols, b.ld, b.vec);
}

// The bf16 tensor-core kernels (flash_attention_bf16_fwd.cu, flash_attention_bf16_bwd.cu) behind
// LaunchFlashAttentionForward / Backward (flash_attention.h), whose contracts they follow.
cudaError_t LaunchForwardBf16(const FlashGeometry& g, const void* q, const void* k, const void* v, const void* mask,
                              void* o, cudaStream_t stream);
cudaError_t LaunchBackwardBf16(const FlashGeometry& g, const void* d_o, const void* q, const void* k, const void* v,
                               const void* mask, void* dq, void* dk, void* dv, void* stats, cudaStream_t stream);

// --- products ----------------------------------------------------------------------------------

// acc[m][c] += A[arow + m, :] . B[col(c), :] over D, col(c) = 4 (cg + 8 (c / 4)) + c % 4: the 4 x 8
// score tile of this thread, A and B swizzled tiles. The summation order depends only on D, so
// every kernel computes bit-identical scores.
template <typename T, int D>
__device__ __forceinline__ void ProductABt(T (&acc)[4][8], const T* a, int arow, const T* b, int cg) {
#pragma unroll 4
  for (int kq = 0; kq < D / 4; ++kq) {
    Quad<T> x[4], y[8];
#pragma unroll
    for (int m = 0; m < 4; ++m) x[m] = LoadQuad<T, D>(a, arow + m, kq);
#pragma unroll
    for (int c = 0; c < 8; ++c) y[c] = LoadQuad<T, D>(b, 4 * (cg + 8 * (c >> 2)) + (c & 3), kq);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[m][c] = fma(x[m].v[e], y[c].v[e], acc[m][c]);
      }
    }
  }
}

// acc[m][4 q + e] += sum_j P[prow + m, j] B[j, 4 (cg + 8 q) + e] over the 64 columns j: P is a warp's
// swizzled (16, 64) buffer, B a swizzled tile; the thread's D / 8 output columns are quads
// cg, cg + 8, ...
template <typename T, int D>
__device__ __forceinline__ void ProductPB(T (&acc)[4][D / 8], const T* p, int prow, const T* b, int cg) {
#pragma unroll 2
  for (int jq = 0; jq < kTile / 4; ++jq) {
    Quad<T> x[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) x[m] = LoadQuad<T, kTile>(p, prow + m, jq);
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
      for (int q = 0; q < D / 32; ++q) {
        const Quad<T> y = LoadQuad<T, D>(b, 4 * jq + jj, cg + 8 * q);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][4 * q + e] = fma(x[m].v[jj], y.v[e], acc[m][4 * q + e]);
        }
      }
    }
  }
}

// Stores the thread's 4 x 8 tile `v` into its warp's swizzled (16, 64) buffer p (rows prow + m).
template <typename T>
__device__ __forceinline__ void StoreTile(T* p, int prow, int cg, const T (&v)[4][8]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      Quad<T> x;
#pragma unroll
      for (int n = 0; n < 4; ++n) x.v[n] = v[m][4 * h + n];
      *reinterpret_cast<Quad<T>*>(p + SwizzledOffset<kTile>(prow + m, 4 * (cg + 8 * h))) = x;
    }
  }
}

// Writes the thread's 4 rows of D / 8 accumulator columns (quads cg, cg + 8, ...) into the (rows,
// cols) matrix g, whose rows are ld elements apart, at rows row + m; rows >= rows and columns >= cols
// are skipped. vec: quad stores (cols and ld multiples of 4, g aligned to a quad).
template <typename T, int D>
__device__ __forceinline__ void StoreRows(T* g, int64_t row, int64_t rows, int64_t cols, int64_t ld, int cg, bool vec,
                                          const T (&acc)[4][D / 8]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    if (row + m >= rows) continue;
    T* dst = g + (row + m) * ld;
#pragma unroll
    for (int q = 0; q < D / 32; ++q) {
      const int64_t c0 = 4 * (cg + 8 * q);
      if (c0 >= cols) continue;
      Quad<T> x;
#pragma unroll
      for (int e = 0; e < 4; ++e) x.v[e] = acc[m][4 * q + e];
      if (vec) {
        *reinterpret_cast<Quad<T>*>(dst + c0) = x;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (c0 + e < cols) dst[c0 + e] = x.v[e];
        }
      }
    }
  }
}

// Which buffers take 16-byte copies (loads) or vector stores (outputs), from their dims and alignment.
struct VecFlags {
  bool q = false, k = false, v = false, d_o = false;
  bool o = false, dq = false, dk = false, dv = false;
};

inline bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Whether every row of every batch matrix of a (batch..., rows, cols) operand at p, rows ld and
// batch matrices batch_strides[d] elements apart, starts `align`-byte aligned and splits into whole
// chunks of `chunk` elements: p aligned, cols, ld and the batch strides multiples of chunk.
inline bool Vectorisable(const FlashGeometry& g, const void* p, size_t align, int64_t chunk, int64_t cols,
                         int64_t ld, const int64_t* batch_strides) {
  if (!Aligned(p, align) || cols % chunk != 0 || ld % chunk != 0) return false;
  for (int d = 0; d < g.batch_rank; ++d) {
    if (batch_strides[d] % chunk != 0) return false;
  }
  return true;
}

// The load flags of q, k, v, d_o (any may be null) for elements of `esize` bytes.
inline VecFlags LoadVecFlags(const FlashGeometry& g, size_t esize, const void* q, const void* k, const void* v,
                             const void* d_o) {
  const int64_t chunk = 16 / static_cast<int64_t>(esize);
  VecFlags vec;
  vec.q = Vectorisable(g, q, 16, chunk, g.dh, g.q_ld, g.q_stride);
  vec.k = Vectorisable(g, k, 16, chunk, g.dh, g.k_ld, g.k_stride);
  vec.v = Vectorisable(g, v, 16, chunk, g.dv, g.v_ld, g.v_stride);
  vec.d_o = Vectorisable(g, d_o, 16, chunk, g.dv, g.o_ld, g.o_stride);
  return vec;
}

// The store flags of o, dq, dk, dv (any may be null): stores of `chunk` elements, `align` bytes.
inline void SetStoreVecFlags(VecFlags& vec, const FlashGeometry& g, size_t align, int64_t chunk, const void* o,
                             const void* dq, const void* dk, const void* dv) {
  vec.o = Vectorisable(g, o, align, chunk, g.dv, g.o_ld, g.o_stride);
  vec.dq = Vectorisable(g, dq, align, chunk, g.dh, g.dq_ld, g.dq_stride);
  vec.dk = Vectorisable(g, dk, align, chunk, g.dh, g.dk_ld, g.dk_stride);
  vec.dv = Vectorisable(g, dv, align, chunk, g.dv, g.dv_ld, g.dv_stride);
}

// --- geometry, masking, dropout ------------------------------------------------------------------

struct BatchOffsets {
  int64_t q = 0, k = 0, v = 0, mask = 0;
};

// The element offsets of batch matrix b (row-major over batch_dims) in Q, K, V and the mask; K and V
// grouped (kv_group > 1) read head h / kv_group.
__device__ __forceinline__ BatchOffsets OffsetsOf(const FlashGeometry& g, int64_t b) {
  BatchOffsets o;
  for (int d = g.batch_rank - 1; d >= 0; --d) {
    const int64_t idx = b % g.batch_dims[d];
    const int64_t kv_idx = d == g.batch_rank - 1 ? idx / g.kv_group : idx;
    b /= g.batch_dims[d];
    o.q += idx * g.q_stride[d];
    o.k += kv_idx * g.k_stride[d];
    o.v += kv_idx * g.v_stride[d];
    o.mask += idx * g.mask_stride[d];
  }
  return o;
}

// The element offset of batch matrix b in a buffer with these batch strides (O, dO, dQ, dK, dV's).
// Computed where it is used, not kept in registers through the kernels' loops; at the kernels' ends
// the accumulators are live, so the index arithmetic is 32-bit (inline, where 64-bit division is a
// called routine that needs registers): b and the batch dims fit, as the launches keep the grid
// (nbatch tiles or more) under 2^31.
// `group`: the last batch dim's index is divided by it (dK and dV of grouped K and V: kv_group).
__device__ __forceinline__ int64_t OffsetOf(const FlashGeometry& g, const int64_t* batch_strides, int64_t b,
                                            int64_t group = 1) {
  int64_t at = 0;
  uint32_t rest = static_cast<uint32_t>(b);
  for (int d = g.batch_rank - 1; d >= 0; --d) {
    const uint32_t n = static_cast<uint32_t>(g.batch_dims[d]);
    const uint32_t idx = rest % n;
    at += static_cast<int64_t>(d == g.batch_rank - 1 ? idx / static_cast<uint32_t>(group) : idx) * batch_strides[d];
    rest /= n;
  }
  return at;
}

// The masked score of query i, key j from the scaled product s: -inf when the key is out of range,
// above the causal diagonal or masked out, s + mask for an additive mask (elements of type M).
template <typename T, typename M = T>
__device__ __forceinline__ T MaskedScore(const FlashGeometry& g, const void* mask, int64_t mask_offset, int64_t i,
                                         int64_t j, T s) {
  if (i >= g.sq || j >= g.sk || (g.causal && j > i)) return NegInf<T>();
  if (g.mask == FlashMask::kAdditive) {
    return s + static_cast<T>(static_cast<const M*>(mask)[mask_offset + i * g.mask_row_stride + j * g.mask_col_stride]);
  }
  if (g.mask == FlashMask::kBool &&
      static_cast<const uint8_t*>(mask)[mask_offset + i * g.mask_row_stride + j * g.mask_col_stride] == 0) {
    return NegInf<T>();
  }
  return s;
}

// True when every (query, key) of the block of `rows` queries from i0 and 64 keys from j0 is
// visible and unmasked, so the per-element checks can be skipped.
__device__ __forceinline__ bool BlockAllVisible(const FlashGeometry& g, int64_t i0, int64_t j0, int rows = kTile) {
  return g.mask == FlashMask::kNone && i0 + rows <= g.sq && j0 + kTile <= g.sk && (!g.causal || j0 + kTile - 1 <= i0);
}

// Maximum / sum over the 8 lanes of a row group (lane bits 1, 3, 4); every lane gets the same value.
template <typename T>
__device__ __forceinline__ T GroupMax(T x) {
  x = max(x, __shfl_xor_sync(0xffffffffu, x, 2));
  x = max(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return max(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
template <typename T>
__device__ __forceinline__ T GroupSum(T x) {
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

}  // namespace onnxpipe::cuda::flash
