// Forward of the bf16 fused attention (flash_attention.h) on tensor cores: one CTA per (batch
// matrix, 64 kM-query tile), 16 kM queries per warp (kForwardBlocks). Q stays in shared memory; 64-key tiles of K and V
// stream through two shared-memory stages (cp.async, the next tile loads while this one computes).
// Each warp computes its 16 x 64 scores S = Q K^T with mma.sync into fp32 accumulators, applies
// scale, masks and the online softmax in fp32, drops probabilities with the CPU's Philox stream,
// and feeds them, rounded to bf16, straight from the accumulators into O += P V.
#include <climits>
#include <cstdlib>

#include "executor/cuda/flash_attention_mma.cuh"

namespace onnxpipe::cuda {
namespace flash {
namespace {

using mma::bf16;

template <int D>
using Swizzle = mma::ChunkSwizzle<D>;

// Row blocks of 16 queries per warp: 2 where the registers allow (each K / V fragment then feeds
// two blocks), 1 at head dim 128.
template <int D>
constexpr int kForwardBlocks = 1;

// CTAs per SM the registers are capped for (4 at head dim 64: 126 registers, no spills; the
// shared memory of 4 fits with the carveout at its maximum).
template <int D>
constexpr int kForwardMinBlocks = D <= 64 ? 4 : 2;

template <int D, int kM>
constexpr size_t ForwardSmemBytes() {
  return sizeof(bf16) * (kM + 4) * kTile * D;  // Q (64 kM rows), 2 stages of (K, V)
}

template <int D, int kM>
__global__ void __launch_bounds__(kThreads, kForwardMinBlocks<D>)
    ForwardKernel(const FlashGeometry g, const bf16* __restrict__ q, const bf16* __restrict__ k,
                  const bf16* __restrict__ v, const void* __restrict__ mask, bf16* __restrict__ o, const VecFlags vec) {
  constexpr int kRows = kM * kTile;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // (64 kM, D)
  bf16* kv = qs + kRows * D;                 // stage s: K at kv + 2 s 64 D, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = warp * 16 * kM, r = lane >> 2, t = lane & 3;

  const int64_t nqt = (g.sq + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / nqt;
  int64_t qt = blockIdx.x % nqt;
  if (g.causal) qt = nqt - 1 - qt;  // the tiles with the most keys first
  const int64_t i0 = qt * kRows;
  const BatchOffsets off = OffsetsOf(g, b);
  const bf16* kg = k + off.k;
  const bf16* vg = v + off.v;
  int64_t nkt = (g.sk + kTile - 1) / kTile;
  if (g.causal) nkt = min(nkt, (min(i0 + kRows, g.sq) - 1) / kTile + 1);

  const TileSource<bf16> k_src{kg, g.dh, g.k_ld, vec.k}, v_src{vg, g.dv, g.v_ld, vec.v};
  LoadTile<bf16, D, Swizzle<D>, kRows>(qs, q + off.q, i0, g.sq, g.dh, g.q_ld, vec.q);
  if (nkt > 0) LoadTilePair<bf16, D, Swizzle<D>>(kv, k_src, v_src, 0, g.sk);
  CpAsyncCommit();
  if (nkt == 0) CpAsyncWaitAll();  // no key tile (every key masked): O = 0

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  auto row_counter = [&](int64_t i) { return g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk); };
  const float scale = static_cast<float>(g.scale);
  // Row statistics of rows r + 8 h of block m, at index 2 m + h.
  float row_max[2 * kM], row_sum[2 * kM];
#pragma unroll
  for (int x = 0; x < 2 * kM; ++x) row_max[x] = -INFINITY, row_sum[x] = 0.f;
  float acc[kM][D / 8][4];
  mma::Zero(acc);

  for (int64_t kt = 0; kt < nkt; ++kt) {
    CpAsyncWaitAll();
    __syncthreads();  // tile kt landed; every warp is done with tile kt - 1
    if (kt + 1 < nkt) {
      LoadTilePair<bf16, D, Swizzle<D>>(kv + ((kt + 1) & 1) * 2 * kTile * D, k_src, v_src, (kt + 1) * kTile, g.sk);
      CpAsyncCommit();
    }
    const bf16* ks = kv + (kt & 1) * 2 * kTile * D;
    const bf16* vs = ks + kTile * D;
    const int64_t j0 = kt * kTile;

    float s[kM][8][4];
    mma::Zero(s);
    mma::ProductABt<D, kM>(s, qs, row0, ks, lane);
    const bool all_visible = BlockAllVisible(g, i0 + row0, j0, 16 * kM);
    uint32_t p[kM][4][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int64_t im = i0 + row0 + 16 * m;  // the block's first query
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[m][n][e] = mma::Log2Score(g, mask, off.mask, all_visible, im + r + 8 * (e >> 1),
                                      j0 + 8 * n + 2 * t + (e & 1), s[m][n][e], scale);
        }
      }
      // Online softmax per row h (r + 8 h of the block): rescale what was accumulated.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[m][n][2 * h], s[m][n][2 * h + 1]));
        float& rmax = row_max[2 * m + h];
        const float new_max = fmaxf(rmax, mma::QuadMax(mx));
        const float base = new_max == -INFINITY ? 0.f : new_max;  // every key so far masked: p = 0
        const float alpha = mma::Exp2(rmax - base);
        rmax = new_max;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            s[m][n][e] = mma::Exp2(s[m][n][e] - base);
            sum += s[m][n][e];
          }
        }
        row_sum[2 * m + h] = row_sum[2 * m + h] * alpha + sum;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          acc[m][n][2 * h] *= alpha;
          acc[m][n][2 * h + 1] *= alpha;
        }
      }
      if (g.dropout) {
        uint32_t keep[8][2];
        mma::KeepRowTile(keep, stream, im, g.sq, j0, lane, row_counter);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (((keep[n][e >> 1] >> (e & 1)) & 1u) == 0) s[m][n][e] = 0.f;
          }
        }
      }
      mma::ToFragments(p[m], s[m]);
    }
    mma::ProductPB<D, kM>(acc, p, vs, lane);
  }

  // O = drop_scale * acc / sum; rows whose keys were all masked (sum 0) are zeros.
  const float drop_scale = static_cast<float>(g.drop_scale);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float total = mma::QuadSum(row_sum[2 * m + h]);
      const float f = total > 0.f ? drop_scale / total : 0.f;
      // Scores are in log2 units (scale * log2 e): the natural log-sum-exp is ln 2 (max + log2 sum).
      const int64_t i = i0 + row0 + 16 * m + r + 8 * h;
      if (g.lse != nullptr && t == 0 && i < g.sq) {
        g.lse[b * g.sq + i] = (row_max[2 * m + h] + log2f(total)) * 0.69314718055994531f;
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[m][n][2 * h] *= f;
        acc[m][n][2 * h + 1] *= f;
      }
    }
    mma::StoreRows<D>(o + OffsetOf(g, g.o_stride, b), i0 + row0 + 16 * m, g.sq, g.dv, g.o_ld, vec.o, acc[m], lane);
  }
}

template <int D, int kM = kForwardBlocks<D>>
cudaError_t Launch(const FlashGeometry& g, const void* q, const void* k, const void* v, const void* mask, void* o,
                   cudaStream_t stream) {
  if (const char* e = getenv("FLASH_BF16_FWD_KM"); e != nullptr && kM == kForwardBlocks<D>) {
    if (atoi(e) == 1 && kM != 1) return Launch<D, 1>(g, q, k, v, mask, o, stream);
    if (atoi(e) == 2 && kM != 2) return Launch<D, 2>(g, q, k, v, mask, o, stream);
  }
  constexpr int kRows = kM * kTile;
  const int64_t blocks = (g.sq + kRows - 1) / kRows * g.nbatch;
  if (blocks == 0 || g.dv == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  VecFlags vec = LoadVecFlags(g, sizeof(bf16), q, k, v, nullptr);
  SetStoreVecFlags(vec, g, /*align=*/4, /*chunk=*/2, o, nullptr, nullptr, nullptr);
  constexpr size_t smem = ForwardSmemBytes<D, kM>();
  if (cudaError_t e = mma::SetSharedMemory(ForwardKernel<D, kM>, smem); e != cudaSuccess) return e;
  ForwardKernel<D, kM><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      g, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), mask,
      static_cast<bf16*>(o), vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchForwardBf16(const FlashGeometry& g, const void* q, const void* k, const void* v, const void* mask,
                              void* o, cudaStream_t stream) {
  switch (g.head_tile) {
    case 64:
      return Launch<64>(g, q, k, v, mask, o, stream);
    case 128:
      return Launch<128>(g, q, k, v, mask, o, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flash
}  // namespace onnxpipe::cuda
