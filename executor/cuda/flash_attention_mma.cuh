// Tensor-core building blocks of the bf16 fused attention (flash_attention_bf16_fwd.cu,
// flash_attention_bf16_bwd.cu): warp-level products through mma.sync m16n8k16 (bf16 inputs, fp32
// accumulation) on shared tiles read with ldmatrix, and the dropout keep bits of a warp's scores.
// .cu files only.
//
// Thread layout: a CTA of kWarps = 4 warps owns 64 kM "rows" (queries, or keys in the dK/dV kernel),
// 16 kM per warp in kM blocks of 16 (more rows per warp: each operand fragment read from shared
// memory feeds more products), and walks tiles of 64 "columns". A block's (16, 64) score tile is 8
// m16n8 accumulators: with g = lane / 4 and t = lane % 4, element e of accumulator n is row
// g + 8 (e / 2), column 8 n + 2 t + e % 2 (PTX ISA, "Matrix Fragments for mma.m16n8k16"). The
// accumulators of columns [16 kk, 16 kk + 16) are, packed to bf16 pairs, the A fragment of the
// product's k-step kk, so scores never leave the registers between the two products.
//
// Shared tiles are (64, D) bf16, row-major in 16-byte chunks, chunk c of row r stored at c ^ (r % 8):
// the 8 row addresses of one ldmatrix phase (8 rows, one chunk) then cover all 32 banks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cuda/flash_attention.cuh"

namespace onnxpipe::cuda::flash::mma {

using bf16 = __nv_bfloat16;

template <int D>
struct ChunkSwizzle {
  static __device__ __forceinline__ int Offset(int r, int c) { return r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7); }
};

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8 x 8 b16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i, register i gets
// its fragment (row lane / 4, elements 2 (lane % 4) and + 1; transposed with .trans).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SharedAddress(p)));
}

// d += a b: a (16 x 16, row-major fragment), b (16 x 8, column-major fragment b0, b1), d (16 x 8) fp32.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16 pair, lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Lets `kernel` take `bytes` of dynamic shared memory, with the shared-memory carveout at its
// maximum so that as many CTAs fit as the registers allow.
template <typename K>
cudaError_t SetSharedMemory(K* kernel, size_t bytes) {
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      e != cudaSuccess) {
    return e;
  }
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

template <int M, int N>
__device__ __forceinline__ void Zero(float (&x)[M][N][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[m][n][e] = 0.f;
    }
  }
}

// acc[m] (16, 64) += A[row0 + 16 m .. + 16, :] B^T over D, m < kM: A and B swizzled (., D) tiles, B's
// 64 rows the columns of acc; each B fragment feeds the kM row blocks. Used as Q K^T and dO V^T
// (rows queries) and K Q^T, V dO^T (rows keys); the k-steps run in the same order either way.
template <int D, int kM>
__device__ __forceinline__ void ProductABt(float (&acc)[kM][8][4], const bf16* a, int row0, const bf16* b, int lane) {
  const int a_row = row0 + (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);
  const int b_row = (lane & 7) + 8 * (lane >> 4), b_col = 8 * ((lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t af[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) LdMatrixX4(af[m], a + ChunkSwizzle<D>::Offset(a_row + 16 * m, 16 * kk + a_col));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bf[4];
      LdMatrixX4(bf, b + ChunkSwizzle<D>::Offset(16 * np + b_row, 16 * kk + b_col));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        Mma(acc[m][2 * np], af[m], bf[0], bf[1]);
        Mma(acc[m][2 * np + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// The A fragments of a (16, 64) accumulator tile rounded to bf16, one per 16-column k-step.
__device__ __forceinline__ void ToFragments(uint32_t (&p)[4][4], const float (&s)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    p[kk][0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
    p[kk][1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
    p[kk][2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    p[kk][3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// acc[m] (16, D) += P[m] B, m < kM: P[m] (16, 64) as fragments, B a swizzled (64, D) tile (its rows
// P's columns); each B fragment feeds the kM row blocks.
template <int D, int kM>
__device__ __forceinline__ void ProductPB(float (&acc)[kM][D / 8][4], const uint32_t (&p)[kM][4][4], const bf16* b,
                                          int lane) {
  const int b_row = (lane & 7) + 8 * ((lane >> 3) & 1), b_col = 8 * (lane >> 4);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t bf[4];
      LdMatrixX4Trans(bf, b + ChunkSwizzle<D>::Offset(16 * kk + b_row, 16 * dp + b_col));
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        Mma(acc[m][2 * dp], p[m][kk], bf[0], bf[1]);
        Mma(acc[m][2 * dp + 1], p[m][kk], bf[2], bf[3]);
      }
    }
  }
}

// Writes a warp's (16, D) fp32 accumulator rows row0 .. row0 + 15 as bf16 into the (rows, cols)
// matrix g, whose rows are ld elements apart; rows >= rows and columns >= cols are skipped. pairs:
// cols and ld even and g 4-byte aligned (bf16 pair stores).
template <int D>
__device__ __forceinline__ void StoreRows(bf16* g, int64_t row0, int64_t rows, int64_t cols, int64_t ld, bool pairs,
                                          const float (&acc)[D / 8][4], int lane) {
  const int r = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = row0 + r + 8 * h;
    if (row >= rows) continue;
    bf16* dst = g + row * ld;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int64_t c = 8 * n + 2 * t;
      if (c >= cols) continue;
      if (pairs) {
        *reinterpret_cast<__nv_bfloat162*>(dst + c) = __floats2bfloat162_rn(acc[n][2 * h], acc[n][2 * h + 1]);
      } else {
        dst[c] = __float2bfloat16_rn(acc[n][2 * h]);
        if (c + 1 < cols) dst[c + 1] = __float2bfloat16_rn(acc[n][2 * h + 1]);
      }
    }
  }
}

// Scores and row maxima live in log2 units (scale log2(e) Q K^T): one MUFU.EX2 per probability.
constexpr float kLog2e = 1.4426950408889634f;

// 2^x, relative error about 2^-22, 0 for -inf (ex2.approx.ftz).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The score of query i, key j from the product s in log2 units: -inf where the key is invisible or
// masked out, log2(e) (scale s + mask) for an additive mask. all_visible: the block needs no checks.
__device__ __forceinline__ float Log2Score(const FlashGeometry& g, const void* mask, int64_t mask_offset,
                                           bool all_visible, int64_t i, int64_t j, float s, float scale) {
  if (all_visible) return s * (scale * kLog2e);
  return MaskedScore<float, bf16>(g, mask, mask_offset, i, j, s * scale) * kLog2e;
}

// Maximum / sum over the 4 lanes holding a row (lane bits 0 and 1); every lane gets the value.
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// --- dropout --------------------------------------------------------------------------------------
// The keep decisions of a warp's 1024 scores, 32 per lane: each lane draws one 32-bit word of
// consecutive counters (4 KeepBits8) and the lanes that hold the scores fetch it by shuffle.

// Rows are queries (16 from query i_row0), columns keys from j0: bit e of word (n, h) (h: row g + 8 h)
// is the keep decision of accumulator element n, 2 h + e. `row_counter(i)`: the counter of (i, 0).
template <typename F>
__device__ __forceinline__ void KeepRowTile(uint32_t (&keep)[8][2], const cpu::DropoutStream& s, int64_t i_row0,
                                            int64_t sq, int64_t j0, int lane, F row_counter) {
  // Lane l draws row l / 2, columns 32 (l % 2) .. + 32.
  const int64_t i = i_row0 + (lane >> 1);
  uint32_t word = 0;
  if (i < sq) {
    const uint64_t c = row_counter(i) + static_cast<uint64_t>(j0 + 32 * (lane & 1));
#pragma unroll
    for (int q = 0; q < 4; ++q) word |= KeepBits8(s, c + 8 * q) << (8 * q);
  }
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t w0 = __shfl_sync(0xffffffffu, word, 2 * (g + 8 * h));
    const uint32_t w1 = __shfl_sync(0xffffffffu, word, 2 * (g + 8 * h) + 1);
#pragma unroll
    for (int n = 0; n < 8; ++n) keep[n][h] = ((n < 4 ? w0 : w1) >> (8 * (n & 3) + 2 * t)) & 3u;
  }
}

// Rows are keys (16 from key j_row0), columns queries from i0: as KeepRowTile, transposed. Lane l
// draws queries i0 + 2 l and + 1, each 16 consecutive keys (one half-word).
template <typename F>
__device__ __forceinline__ void KeepColTile(uint32_t (&keep)[8][2], const cpu::DropoutStream& s, int64_t j_row0,
                                            int64_t i0, int64_t sq, int lane, F row_counter) {
  uint32_t word = 0;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t i = i0 + 2 * lane + e;
    if (i >= sq) continue;
    const uint64_t c = row_counter(i) + static_cast<uint64_t>(j_row0);
#pragma unroll
    for (int q = 0; q < 2; ++q) word |= KeepBits8(s, c + 8 * q) << (16 * e + 8 * q);
  }
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    // Columns 8 n + 2 t and + 1 are queries 2 (4 n + t) + e: lane 4 n + t's word, half e.
    const uint32_t w = __shfl_sync(0xffffffffu, word, 4 * n + t);
#pragma unroll
    for (int h = 0; h < 2; ++h) keep[n][h] = ((w >> (g + 8 * h)) & 1u) | (((w >> (16 + g + 8 * h)) & 1u) << 1);
  }
}

}  // namespace onnxpipe::cuda::flash::mma
