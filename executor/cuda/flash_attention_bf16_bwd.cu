// Backward of the bf16 fused attention (flash_attention.h) on tensor cores, recomputing the
// probabilities with the fp32 kernels' passes (flash_attention_bwd.cu has the algebra):
// - QKernel, one CTA per (batch matrix, 64 kM-query tile), 16 kM queries per warp: pass 1 over the key
//   tiles computes S = Q K^T and dO V^T and keeps the row maximum, sum and sum_j p_ij G_ij online,
//   giving each row's statistics (max, 1 / sum, D) in fp32; pass 2 recomputes both products, forms
//   dS = P (G - D) in the accumulators and feeds it, rounded to bf16, into dQ += dS K.
// - KVKernel, one CTA per (batch matrix, 64-key tile), 16 keys per warp: K and V stay in shared
//   memory while the query tiles (Q, dO and their statistics) stream through two stages; it
//   computes S^T = K Q^T and V dO^T with the keys as rows, so dV += dropout(P)^T dO and
//   dK += dS^T Q take the transposed scores straight from the accumulators.
// No atomics: dQ, dK and dV each accumulate in one warp's registers (fp32) and are written once.
#include <climits>
#include <cstdlib>

#include "executor/cuda/flash_attention_mma.cuh"

namespace onnxpipe::cuda {
namespace flash {
namespace {

using mma::bf16;

template <int D>
using Swizzle = mma::ChunkSwizzle<D>;

// Row blocks of 16 queries per QKernel warp (as the forward's kForwardBlocks).
template <int D>
constexpr int kQBlocks = 1;

// QKernel: Q and dO (64 kM rows each), two stages of (K, V). KVKernel: K and V, two stages of (Q,
// dO) and of 3 x 64 statistics.
// CTAs per SM the registers are capped for (without spills).
template <int D>
constexpr int kQMinBlocks = D <= 64 ? 3 : 2;

template <int D, int kM>
constexpr size_t QSmemBytes() {
  return sizeof(bf16) * (2 * kM + 4) * kTile * D;
}
template <int D>
constexpr size_t KVSmemBytes() {
  return sizeof(bf16) * 6 * kTile * D + 2 * 3 * kTile * sizeof(float);
}

template <int D, int kM>
__global__ void __launch_bounds__(kThreads, kQMinBlocks<D>)
    QKernel(const FlashGeometry g, const bf16* __restrict__ d_o, const bf16* __restrict__ q, const bf16* __restrict__ k,
            const bf16* __restrict__ v, const void* __restrict__ mask, bf16* __restrict__ dq, float* __restrict__ stats,
            const VecFlags vec) {
  constexpr int kRows = kM * kTile;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // (64 kM, D)
  bf16* dos = qs + kRows * D;                // (64 kM, D)
  bf16* kv = dos + kRows * D;                // stage s: K at kv + 2 s 64 D, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = warp * 16 * kM, r = lane >> 2, t = lane & 3;

  const int64_t nqt = (g.sq + kRows - 1) / kRows;
  const int64_t b = blockIdx.x / nqt;
  int64_t qt = blockIdx.x % nqt;
  if (g.causal) qt = nqt - 1 - qt;
  const int64_t i0 = qt * kRows;
  const BatchOffsets off = OffsetsOf(g, b);
  const bf16* kg = k + off.k;
  const bf16* vg = v + off.v;
  int64_t nkt = (g.sk + kTile - 1) / kTile;
  if (g.causal) nkt = min(nkt, (min(i0 + kRows, g.sq) - 1) / kTile + 1);
  // Steps: the key tiles once for the statistics, once more for dQ.
  const int64_t steps = nkt * (dq != nullptr ? 2 : 1);
  const TileSource<bf16> k_src{kg, g.dh, g.k_ld, vec.k}, v_src{vg, g.dv, g.v_ld, vec.v};
  auto load_kv = [&](int64_t step) {
    LoadTilePair<bf16, D, Swizzle<D>>(kv + (step & 1) * 2 * kTile * D, k_src, v_src, (step % nkt) * kTile, g.sk);
  };
  LoadTilePair<bf16, D, Swizzle<D>, kRows>(qs, {q + off.q, g.dh, g.q_ld, vec.q},
                                           {d_o + OffsetOf(g, g.o_stride, b), g.dv, g.o_ld, vec.d_o}, i0, g.sq);
  if (steps > 0) load_kv(0);
  CpAsyncCommit();
  if (steps == 0) CpAsyncWaitAll();  // no step waits for the copies: none may outlive the CTA
  // Waits for step's tiles and prefetches the next step's into the other stage.
  auto advance = [&](int64_t step) {
    CpAsyncWaitAll();
    __syncthreads();
    if (step + 1 < steps) {
      load_kv(step + 1);
      CpAsyncCommit();
    }
  };

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  auto row_counter = [&](int64_t i) { return g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk); };
  const float scale = static_cast<float>(g.scale), drop_scale = static_cast<float>(g.drop_scale);
  // S (masked, scaled) and G of the current tile.
  float s[kM][8][4], dp[kM][8][4];
  auto scores = [&](int64_t step) {
    const bf16* ks = kv + (step & 1) * 2 * kTile * D;
    const int64_t j0 = (step % nkt) * kTile;
    mma::Zero(s);
    mma::Zero(dp);
    mma::ProductABt<D, kM>(s, qs, row0, ks, lane);
    mma::ProductABt<D, kM>(dp, dos, row0, ks + kTile * D, lane);
    const bool all_visible = BlockAllVisible(g, i0 + row0, j0, 16 * kM);
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int64_t im = i0 + row0 + 16 * m;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[m][n][e] = mma::Log2Score(g, mask, off.mask, all_visible, im + r + 8 * (e >> 1),
                                      j0 + 8 * n + 2 * t + (e & 1), s[m][n][e], scale);
        }
      }
      if (g.dropout) {
        uint32_t keep[8][2];
        mma::KeepRowTile(keep, stream, im, g.sq, j0, lane, row_counter);
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dp[m][n][e] = ((keep[n][e >> 1] >> (e & 1)) & 1u) != 0 ? dp[m][n][e] * drop_scale : 0.f;
          }
        }
      }
    }
  };

  // Pass 1: per row the running maximum, sum of p and sum of p G (both under that maximum). Row
  // r + 8 h of block m at index 2 m + h.
  float row_max[2 * kM], row_sum[2 * kM], row_dot[2 * kM];
#pragma unroll
  for (int x = 0; x < 2 * kM; ++x) row_max[x] = -INFINITY, row_sum[x] = 0.f, row_dot[x] = 0.f;
  int64_t step = 0;
  for (; step < nkt; ++step) {
    advance(step);
    scores(step);
#pragma unroll
    for (int x = 0; x < 2 * kM; ++x) {
      const int m = x >> 1, h = x & 1;
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[m][n][2 * h], s[m][n][2 * h + 1]));
      const float new_max = fmaxf(row_max[x], mma::QuadMax(mx));
      const float base = new_max == -INFINITY ? 0.f : new_max;
      const float alpha = mma::Exp2(row_max[x] - base);
      row_max[x] = new_max;
      float sum = 0.f, dot = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          const float p = mma::Exp2(s[m][n][e] - base);
          sum += p;
          dot = fmaf(p, dp[m][n][e], dot);
        }
      }
      row_sum[x] = row_sum[x] * alpha + sum;
      row_dot[x] = row_dot[x] * alpha + dot;
    }
  }
  // Statistics: max in log2 units (0 for a fully masked row), 1 / sum (0 likewise), D = sum p G / sum.
  const int64_t n_rows = g.nbatch * g.sq;
#pragma unroll
  for (int x = 0; x < 2 * kM; ++x) {
    const float total = mma::QuadSum(row_sum[x]);
    const float dot = mma::QuadSum(row_dot[x]);
    row_max[x] = row_max[x] == -INFINITY ? 0.f : row_max[x];
    row_sum[x] = total > 0.f ? 1.f / total : 0.f;
    row_dot[x] = dot * row_sum[x];
    const int64_t i = i0 + row0 + 16 * (x >> 1) + r + 8 * (x & 1);
    if (stats != nullptr && t == 0 && i < g.sq) {
      stats[b * g.sq + i] = row_max[x];
      stats[n_rows + b * g.sq + i] = row_sum[x];
      stats[2 * n_rows + b * g.sq + i] = row_dot[x];
    }
  }
  if (dq == nullptr) return;

  // Pass 2: dS = P (G - D), dQ += dS K.
  float acc[kM][D / 8][4];
  mma::Zero(acc);
  for (; step < steps; ++step) {
    advance(step);
    scores(step);
    uint32_t ds[kM][4][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int x = 2 * m + (e >> 1);
          const float p = mma::Exp2(s[m][n][e] - row_max[x]) * row_sum[x];
          s[m][n][e] = p * (dp[m][n][e] - row_dot[x]);
        }
      }
      mma::ToFragments(ds[m], s[m]);
    }
    mma::ProductPB<D, kM>(acc, ds, kv + (step & 1) * 2 * kTile * D, lane);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][n][e] *= scale;
    }
    mma::StoreRows<D>(dq + OffsetOf(g, g.dq_stride, b), i0 + row0 + 16 * m, g.sq, g.dh, g.dq_ld, vec.dq, acc[m], lane);
  }
}

// Starts copying the statistics of queries [i0, i0 + 64) (max, 1 / sum, D; zeros past Sq) into
// the (3, 64) floats at dst.
__device__ __forceinline__ void LoadStats(float* dst, const float* st_max, int64_t n_rows, int64_t i0, int64_t sq) {
  for (int c = threadIdx.x; c < 3 * kTile; c += kThreads) {
    const int which = c / kTile, i = c % kTile;
    if (i0 + i < sq) {
      CpAsyncElement(dst + c, st_max + which * n_rows + i0 + i);
    } else {
      dst[c] = 0.f;
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    KVKernel(const FlashGeometry g, const bf16* __restrict__ d_o, const bf16* __restrict__ q,
             const bf16* __restrict__ k, const bf16* __restrict__ v, const void* __restrict__ mask,
             const float* __restrict__ stats, bf16* __restrict__ dk, bf16* __restrict__ dv, const VecFlags vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem);                  // (64, D)
  bf16* vs = ks + kTile * D;                                 // (64, D)
  bf16* qd = vs + kTile * D;                                 // stage s: Q at qd + 2 s 64 D, dO after it
  float* st = reinterpret_cast<float*>(qd + 4 * kTile * D);  // stage s: (3, 64) statistics at st + 3 s 64
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = warp * 16, r = lane >> 2, t = lane & 3;

  // As the fp32 kernel: the CTA walks the query tiles of each query head of its K/V group in order.
  const int64_t nkt = (g.sk + kTile - 1) / kTile;
  const int64_t b0 = blockIdx.x / nkt * g.kv_group;
  const int64_t j0 = (blockIdx.x % nkt) * kTile;
  const BatchOffsets off = OffsetsOf(g, b0);
  const int64_t n_rows = g.nbatch * g.sq;
  const int64_t nqt = (g.sq + kTile - 1) / kTile;
  const int64_t qt_begin = g.causal ? j0 / kTile : 0;  // queries i >= j0 only
  const int64_t per_head = nqt > qt_begin ? nqt - qt_begin : 0;
  const int64_t n_it = per_head * g.kv_group;  // step it: batch matrix b0 + it / per_head, its tile it % per_head
  auto load_qd = [&](int64_t it) {
    const int64_t b = b0 + it / per_head, i0 = (qt_begin + it % per_head) * kTile;
    const TileSource<bf16> q_src{q + OffsetOf(g, g.q_stride, b), g.dh, g.q_ld, vec.q};
    const TileSource<bf16> do_src{d_o + OffsetOf(g, g.o_stride, b), g.dv, g.o_ld, vec.d_o};
    LoadTilePair<bf16, D, Swizzle<D>>(qd + (it & 1) * 2 * kTile * D, q_src, do_src, i0, g.sq);
    LoadStats(st + (it & 1) * 3 * kTile, stats + b * g.sq, n_rows, i0, g.sq);
  };
  LoadTilePair<bf16, D, Swizzle<D>>(ks, {k + off.k, g.dh, g.k_ld, vec.k}, {v + off.v, g.dv, g.v_ld, vec.v}, j0,
                                    g.sk);  // K, V
  if (n_it > 0) load_qd(0);
  CpAsyncCommit();
  if (n_it == 0) CpAsyncWaitAll();  // no query tile: dK = dV = 0

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  const float scale = static_cast<float>(g.scale), drop_scale = static_cast<float>(g.drop_scale);
  float dk_acc[1][D / 8][4], dv_acc[1][D / 8][4];
  mma::Zero(dk_acc);
  mma::Zero(dv_acc);

  for (int64_t it = 0; it < n_it; ++it) {
    CpAsyncWaitAll();
    __syncthreads();  // step it's tiles landed; every warp is done with step it - 1
    if (it + 1 < n_it) {
      load_qd(it + 1);
      CpAsyncCommit();
    }
    const bf16* qs = qd + (it & 1) * 2 * kTile * D;
    const bf16* dos = qs + kTile * D;
    const float* c_max = st + (it & 1) * 3 * kTile;
    const float* c_inv = c_max + kTile;
    const float* c_dot = c_max + 2 * kTile;
    const int64_t b = b0 + it / per_head;
    const int64_t i0 = (qt_begin + it % per_head) * kTile;
    const int64_t mask_offset = OffsetOf(g, g.mask_stride, b);
    auto row_counter = [&](int64_t i) { return g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk); };

    float st[1][8][4], dpt[1][8][4];
    mma::Zero(st);
    mma::Zero(dpt);
    mma::ProductABt<D, 1>(st, ks, row0, qs, lane);    // S^T: keys x queries
    mma::ProductABt<D, 1>(dpt, vs, row0, dos, lane);  // (dO V^T)^T
    float(&s)[8][4] = st[0];
    float(&dp)[8][4] = dpt[0];
    uint32_t keep[8][2];
    if (g.dropout) mma::KeepColTile(keep, stream, j0 + row0, i0, g.sq, lane, row_counter);
    const bool all_visible = BlockAllVisible(g, i0, j0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * t + (e & 1);  // the query's column in the tile
        const float x =
            mma::Log2Score(g, mask, mask_offset, all_visible, i0 + c, j0 + row0 + r + 8 * (e >> 1), s[n][e], scale);
        const float p = mma::Exp2(x - c_max[c]) * c_inv[c];
        const bool kept = !g.dropout || ((keep[n][e >> 1] >> (e & 1)) & 1u) != 0;
        const float gv = kept ? (g.dropout ? dp[n][e] * drop_scale : dp[n][e]) : 0.f;
        s[n][e] = kept ? (g.dropout ? p * drop_scale : p) : 0.f;  // dropout(P)
        dp[n][e] = p * (gv - c_dot[c]);                           // dS
      }
    }
    uint32_t frag[1][4][4];
    mma::ToFragments(frag[0], s);
    mma::ProductPB<D, 1>(dv_acc, frag, dos, lane);
    mma::ToFragments(frag[0], dp);
    mma::ProductPB<D, 1>(dk_acc, frag, qs, lane);
  }

#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[0][n][e] *= scale;
  }
  if (dk != nullptr) {
    mma::StoreRows<D>(dk + OffsetOf(g, g.dk_stride, b0, g.kv_group), j0 + row0, g.sk, g.dh, g.dk_ld, vec.dk,
                      dk_acc[0], lane);
  }
  if (dv != nullptr) {
    mma::StoreRows<D>(dv + OffsetOf(g, g.dv_stride, b0, g.kv_group), j0 + row0, g.sk, g.dv, g.dv_ld, vec.dv,
                      dv_acc[0], lane);
  }
}

template <int D, int kM = kQBlocks<D>>
cudaError_t Launch(const FlashGeometry& g, const void* d_o, const void* q, const void* k, const void* v,
                   const void* mask, void* dq, void* dk, void* dv, void* stats, cudaStream_t stream) {
  if (const char* e = getenv("FLASH_BF16_Q_KM"); e != nullptr && kM == kQBlocks<D>) {
    if (atoi(e) == 1 && kM != 1) return Launch<D, 1>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
    if (atoi(e) == 2 && kM != 2) return Launch<D, 2>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
  }
  const bool want_kv = dk != nullptr || dv != nullptr;
  if (want_kv && stats == nullptr) return cudaErrorInvalidValue;
  VecFlags vec = LoadVecFlags(g, sizeof(bf16), q, k, v, d_o);
  SetStoreVecFlags(vec, g, /*align=*/4, /*chunk=*/2, nullptr, dq, dk, dv);
  constexpr int kQRows = kM * kTile;
  const int64_t q_blocks = (g.sq + kQRows - 1) / kQRows * g.nbatch;
  if (q_blocks > INT_MAX) return cudaErrorInvalidValue;
  if (q_blocks > 0 && (dq != nullptr || want_kv)) {
    constexpr size_t smem = QSmemBytes<D, kM>();
    if (cudaError_t e = mma::SetSharedMemory(QKernel<D, kM>, smem); e != cudaSuccess) return e;
    QKernel<D, kM><<<static_cast<unsigned>(q_blocks), kThreads, smem, stream>>>(
        g, static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
        static_cast<const bf16*>(v), mask, static_cast<bf16*>(dq), want_kv ? static_cast<float*>(stats) : nullptr, vec);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int64_t kv_blocks = (g.sk + kTile - 1) / kTile * (g.nbatch / g.kv_group);  // one per K/V batch matrix
  if (kv_blocks > INT_MAX) return cudaErrorInvalidValue;
  if (kv_blocks > 0 && want_kv) {
    constexpr size_t smem = KVSmemBytes<D>();
    if (cudaError_t e = mma::SetSharedMemory(KVKernel<D>, smem); e != cudaSuccess) return e;
    KVKernel<D><<<static_cast<unsigned>(kv_blocks), kThreads, smem, stream>>>(
        g, static_cast<const bf16*>(d_o), static_cast<const bf16*>(q), static_cast<const bf16*>(k),
        static_cast<const bf16*>(v), mask, static_cast<const float*>(stats), static_cast<bf16*>(dk),
        static_cast<bf16*>(dv), vec);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchBackwardBf16(const FlashGeometry& g, const void* d_o, const void* q, const void* k, const void* v,
                               const void* mask, void* dq, void* dk, void* dv, void* stats, cudaStream_t stream) {
  switch (g.head_tile) {
    case 64:
      return Launch<64>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
    case 128:
      return Launch<128>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace flash
}  // namespace onnxpipe::cuda
