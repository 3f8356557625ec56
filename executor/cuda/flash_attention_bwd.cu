// Backward of the fused attention (flash_attention.h), recomputing the probabilities:
//   P = softmax(S) (S the masked, scaled scores), G = dropout'(dO V^T) (dropped entries 0, kept
//   ones times 1 / (1 - ratio)), D_i = sum_j P_ij G_ij (= dO_i . O_i), dS = P * (G - D),
//   dQ = scale dS K,  dK = scale dS^T Q,  dV = dropout(P)^T dO   (as executor/cpu/grad_attention.cc).
// Two kernels, no atomics:
// - QKernel, one CTA per (batch matrix, 64-query tile): pass 1 over the key tiles computes S and
//   dO V^T and keeps online the row maximum, sum and sum_j p_ij G_ij (rescaled like the forward's
//   output), giving each row's statistics (max, 1 / sum, D); pass 2 recomputes S and dO V^T, forms
//   dS and accumulates dS K. The statistics go to the workspace for the second kernel.
// - KVKernel, one CTA per (batch matrix, 64-key tile): K and V stay in shared memory while the
//   query tiles (Q, dO) stream through two stages; it computes S^T = K Q^T and V dO^T directly in
//   the transposed layout (each thread owns 4 keys x 8 queries), so dV += dropout(P)^T dO and
//   dK += dS^T Q are register-tiled products like the forward's P V.
// Both kernels sum each score's products in the same order (ProductABt in either operand order),
// so a recomputed score exceeds pass 1's row maximum by rounding at most.
#include <climits>

#include "executor/cuda/flash_attention.cuh"

namespace onnxpipe::cuda {
namespace flash {
namespace {

template <typename T, int D>
constexpr size_t BackwardSmemBytes() {
  // Two resident (64, D) tiles, two stages of two streamed tiles, a (16, 64) buffer per warp.
  return sizeof(T) * (2 * kTile * D + 4 * kTile * D + kWarps * 16 * kTile);
}

template <typename T>
__device__ __forceinline__ void Zero(T (&x)[4][8]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int c = 0; c < 8; ++c) x[m][c] = 0;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    QKernel(const FlashGeometry g, const T* __restrict__ d_o, const T* __restrict__ q, const T* __restrict__ k,
            const T* __restrict__ v, const void* __restrict__ mask, T* __restrict__ dq, T* __restrict__ stats,
            const VecFlags vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // (64, D)
  T* dos = qs + kTile * D;             // (64, D)
  T* kv = dos + kTile * D;             // stage s: K at kv + 2 s 64 D, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = RowGroup(lane), cg = ColGroup(lane);
  T* pw = kv + 4 * kTile * D + warp * 16 * kTile;  // this warp's (16, 64) dS
  const int arow = warp * 16 + rg * 4;

  const int64_t nqt = (g.sq + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / nqt;
  int64_t qt = blockIdx.x % nqt;
  if (g.causal) qt = nqt - 1 - qt;
  const int64_t i0 = qt * kTile;
  const BatchOffsets off = OffsetsOf(g, b);
  const T* kg = k + off.k;
  const T* vg = v + off.v;
  int64_t nkt = (g.sk + kTile - 1) / kTile;
  if (g.causal) nkt = min(nkt, (min(i0 + kTile, g.sq) - 1) / kTile + 1);
  // Steps: the key tiles once for the statistics, once more for dQ.
  const int64_t steps = nkt * (dq != nullptr ? 2 : 1);
  const TileSource<T> k_src{kg, g.dh, g.k_ld, vec.k}, v_src{vg, g.dv, g.v_ld, vec.v};
  auto load_kv = [&](int64_t step) {
    const int64_t j0 = (step % nkt) * kTile;
    LoadTilePair<T, D>(kv + (step & 1) * 2 * kTile * D, k_src, v_src, j0, g.sk);
  };
  LoadTilePair<T, D>(qs, {q + off.q, g.dh, g.q_ld, vec.q}, {d_o + OffsetOf(g, g.o_stride, b), g.dv, g.o_ld, vec.d_o},
                     i0, g.sq);  // Q, dO
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
  const T scale = static_cast<T>(g.scale), drop_scale = static_cast<T>(g.drop_scale);
  // S (masked, scaled) and G of the current tile.
  T s[4][8], dp[4][8];
  auto scores = [&](int64_t step) {
    const T* ks = kv + (step & 1) * 2 * kTile * D;
    const int64_t j0 = (step % nkt) * kTile;
    Zero(s);
    Zero(dp);
    ProductABt<T, D>(s, qs, arow, ks, cg);
    ProductABt<T, D>(dp, dos, arow, ks + kTile * D, cg);
    const bool all_visible = BlockAllVisible(g, i0, j0);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        T x = s[m][c] * scale;
        if (!all_visible) {
          x = MaskedScore(g, mask, off.mask, i0 + arow + m, j0 + 4 * (cg + 8 * (c >> 2)) + (c & 3), x);
        }
        s[m][c] = x;
      }
    }
    if (g.dropout) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int64_t i = i0 + arow + m;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint64_t c0 = g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk + j0 + 4 * (cg + 8 * h));
          const uint32_t keep = i < g.sq ? KeepBits4(stream, c0) : 0u;
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            dp[m][4 * h + n] = ((keep >> n) & 1u) != 0 ? dp[m][4 * h + n] * drop_scale : T(0);
          }
        }
      }
    }
  };

  // Pass 1: per row the running maximum, sum of p and sum of p G (both under that maximum).
  T row_max[4], row_sum[4], row_dot[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    row_max[m] = NegInf<T>();
    row_sum[m] = 0;
    row_dot[m] = 0;
  }
  int64_t step = 0;
  for (; step < nkt; ++step) {
    advance(step);
    scores(step);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      T mx = s[m][0];
#pragma unroll
      for (int c = 1; c < 8; ++c) mx = max(mx, s[m][c]);
      const T new_max = max(row_max[m], GroupMax(mx));
      const T base = new_max == NegInf<T>() ? T(0) : new_max;
      const T alpha = ExpNonPositive(row_max[m] - base);
      row_max[m] = new_max;
      T sum = 0, dot = 0;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const T p = ExpNonPositive(s[m][c] - base);
        sum += p;
        dot = fma(p, dp[m][c], dot);
      }
      row_sum[m] = row_sum[m] * alpha + sum;
      row_dot[m] = row_dot[m] * alpha + dot;
    }
  }
  // Statistics: max (0 for a fully masked row), 1 / sum (0 likewise), D = sum p G / sum.
  const int64_t n_rows = g.nbatch * g.sq;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const T total = GroupSum(row_sum[m]);
    const T dot = GroupSum(row_dot[m]);
    row_max[m] = row_max[m] == NegInf<T>() ? T(0) : row_max[m];
    row_sum[m] = total > T(0) ? T(1) / total : T(0);
    row_dot[m] = dot * row_sum[m];
    const int64_t i = i0 + arow + m;
    if (stats != nullptr && cg == 0 && i < g.sq) {
      stats[b * g.sq + i] = row_max[m];
      stats[n_rows + b * g.sq + i] = row_sum[m];
      stats[2 * n_rows + b * g.sq + i] = row_dot[m];
    }
  }
  if (dq == nullptr) return;

  // Pass 2: dS = P (G - D) through the warp's buffer, dQ += dS K.
  T acc[4][D / 8];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < D / 8; ++e) acc[m][e] = 0;
  }
  for (; step < steps; ++step) {
    advance(step);
    scores(step);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const T p = ExpNonPositive(s[m][c] - row_max[m]) * row_sum[m];
        s[m][c] = p * (dp[m][c] - row_dot[m]);
      }
    }
    StoreTile(pw, rg * 4, cg, s);
    __syncwarp();
    ProductPB<T, D>(acc, pw, rg * 4, kv + (step & 1) * 2 * kTile * D, cg);
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < D / 8; ++e) acc[m][e] *= scale;
  }
  StoreRows<T, D>(dq + OffsetOf(g, g.dq_stride, b), i0 + arow, g.sq, g.dh, g.dq_ld, cg, vec.dq, acc);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    KVKernel(const FlashGeometry g, const T* __restrict__ d_o, const T* __restrict__ q, const T* __restrict__ k,
             const T* __restrict__ v, const void* __restrict__ mask, const T* __restrict__ stats, T* __restrict__ dk,
             T* __restrict__ dv, const VecFlags vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* ks = reinterpret_cast<T*>(smem);  // (64, D)
  T* vs = ks + kTile * D;              // (64, D)
  T* qd = vs + kTile * D;              // stage s: Q at qd + 2 s 64 D, dO after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = RowGroup(lane), cg = ColGroup(lane);
  T* pw = qd + 4 * kTile * D + warp * 16 * kTile;  // this warp's (16 keys, 64 queries) buffer
  const int arow = warp * 16 + rg * 4;

  // A CTA owns 64 keys of one K/V batch matrix and walks the query tiles of each query head that
  // reads it (kv_group of them, consecutive batch matrices from b0: grouped-query attention), in
  // order, so a grouped dK and dV are summed in registers, the same way every run.
  const int64_t nkt = (g.sk + kTile - 1) / kTile;
  const int64_t b0 = blockIdx.x / nkt * g.kv_group;
  const int64_t j0 = (blockIdx.x % nkt) * kTile;
  const BatchOffsets off = OffsetsOf(g, b0);
  const int64_t nqt = (g.sq + kTile - 1) / kTile;
  const int64_t qt_begin = g.causal ? j0 / kTile : 0;  // queries i >= j0 only
  const int64_t per_head = nqt > qt_begin ? nqt - qt_begin : 0;
  const int64_t n_it = per_head * g.kv_group;  // step it: batch matrix b0 + it / per_head, its tile it % per_head
  auto load_qd = [&](int64_t it) {
    const int64_t b = b0 + it / per_head;
    const TileSource<T> q_src{q + OffsetOf(g, g.q_stride, b), g.dh, g.q_ld, vec.q};
    const TileSource<T> do_src{d_o + OffsetOf(g, g.o_stride, b), g.dv, g.o_ld, vec.d_o};
    LoadTilePair<T, D>(qd + (it & 1) * 2 * kTile * D, q_src, do_src, (qt_begin + it % per_head) * kTile, g.sq);
  };
  LoadTilePair<T, D>(ks, {k + off.k, g.dh, g.k_ld, vec.k}, {v + off.v, g.dv, g.v_ld, vec.v}, j0, g.sk);  // K, V
  if (n_it > 0) load_qd(0);
  CpAsyncCommit();
  if (n_it == 0) CpAsyncWaitAll();  // no query tile: dK = dV = 0

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  const T scale = static_cast<T>(g.scale), drop_scale = static_cast<T>(g.drop_scale);
  const int64_t n_rows = g.nbatch * g.sq;
  T dk_acc[4][D / 8], dv_acc[4][D / 8];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < D / 8; ++e) dk_acc[m][e] = dv_acc[m][e] = 0;
  }

  for (int64_t it = 0; it < n_it; ++it) {
    CpAsyncWaitAll();
    __syncthreads();  // step it's tiles landed; every warp is done with step it - 1
    if (it + 1 < n_it) {
      load_qd(it + 1);
      CpAsyncCommit();
    }
    const T* qs = qd + (it & 1) * 2 * kTile * D;
    const T* dos = qs + kTile * D;
    const int64_t b = b0 + it / per_head;
    const int64_t i0 = (qt_begin + it % per_head) * kTile;
    const int64_t mask_offset = OffsetOf(g, g.mask_stride, b);
    const T* st_max = stats + b * g.sq;
    const T* st_inv = st_max + n_rows;
    const T* st_dot = st_max + 2 * n_rows;
    // The row statistics of this thread's 8 queries (zeros past Sq).
    T c_max[8], c_inv[8], c_dot[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int64_t i = i0 + 4 * (cg + 8 * (c >> 2)) + (c & 3);
      const bool in = i < g.sq;
      c_max[c] = in ? st_max[i] : T(0);
      c_inv[c] = in ? st_inv[i] : T(0);
      c_dot[c] = in ? st_dot[i] : T(0);
    }
    T s[4][8], dp[4][8];
    Zero(s);
    Zero(dp);
    ProductABt<T, D>(s, ks, arow, qs, cg);    // S^T: keys x queries
    ProductABt<T, D>(dp, vs, arow, dos, cg);  // (dO V^T)^T
    const bool all_visible = BlockAllVisible(g, i0, j0);
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int64_t i = i0 + 4 * (cg + 8 * (c >> 2)) + (c & 3);
      // Keys j0 + arow + m, m < 4, are consecutive counters of query i's row.
      const uint32_t keep =
          !g.dropout ? 0xFu
          : i < g.sq ? KeepBits4(stream, g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk + j0 + arow))
                     : 0u;
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        T x = s[m][c] * scale;
        if (!all_visible) x = MaskedScore(g, mask, mask_offset, i, j0 + arow + m, x);
        const T p = ExpNonPositive(x - c_max[c]) * c_inv[c];
        const bool kept = ((keep >> m) & 1u) != 0;
        const T gv = g.dropout ? (kept ? dp[m][c] * drop_scale : T(0)) : dp[m][c];
        s[m][c] = g.dropout ? (kept ? p * drop_scale : T(0)) : p;  // dropout(P)
        dp[m][c] = p * (gv - c_dot[c]);                            // dS
      }
    }
    StoreTile(pw, rg * 4, cg, s);
    __syncwarp();
    ProductPB<T, D>(dv_acc, pw, rg * 4, dos, cg);
    __syncwarp();
    StoreTile(pw, rg * 4, cg, dp);
    __syncwarp();
    ProductPB<T, D>(dk_acc, pw, rg * 4, qs, cg);
  }

#pragma unroll
  for (int m = 0; m < 4; ++m) {
#pragma unroll
    for (int e = 0; e < D / 8; ++e) dk_acc[m][e] *= scale;
  }
  if (dk != nullptr) {
    StoreRows<T, D>(dk + OffsetOf(g, g.dk_stride, b0, g.kv_group), j0 + arow, g.sk, g.dh, g.dk_ld, cg, vec.dk,
                    dk_acc);
  }
  if (dv != nullptr) {
    StoreRows<T, D>(dv + OffsetOf(g, g.dv_stride, b0, g.kv_group), j0 + arow, g.sk, g.dv, g.dv_ld, cg, vec.dv,
                    dv_acc);
  }
}

template <typename T, int D>
cudaError_t Launch(const FlashGeometry& g, const void* d_o, const void* q, const void* k, const void* v,
                   const void* mask, void* dq, void* dk, void* dv, void* stats, cudaStream_t stream) {
  const bool want_kv = dk != nullptr || dv != nullptr;
  if (want_kv && stats == nullptr) return cudaErrorInvalidValue;
  VecFlags vec = LoadVecFlags(g, sizeof(T), q, k, v, d_o);
  SetStoreVecFlags(vec, g, 4 * sizeof(T), 4, nullptr, dq, dk, dv);
  constexpr size_t smem = BackwardSmemBytes<T, D>();
  const int64_t q_blocks = (g.sq + kTile - 1) / kTile * g.nbatch;
  if (q_blocks > INT_MAX) return cudaErrorInvalidValue;
  if (q_blocks > 0 && (dq != nullptr || want_kv)) {
    if (cudaError_t e = cudaFuncSetAttribute(QKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess) {
      return e;
    }
    QKernel<T, D><<<static_cast<unsigned>(q_blocks), kThreads, smem, stream>>>(
        g, static_cast<const T*>(d_o), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        mask, static_cast<T*>(dq), want_kv ? static_cast<T*>(stats) : nullptr, vec);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  const int64_t kv_blocks = (g.sk + kTile - 1) / kTile * (g.nbatch / g.kv_group);  // one per K/V batch matrix
  if (kv_blocks > INT_MAX) return cudaErrorInvalidValue;
  if (kv_blocks > 0 && want_kv) {
    if (cudaError_t e = cudaFuncSetAttribute(KVKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess) {
      return e;
    }
    KVKernel<T, D><<<static_cast<unsigned>(kv_blocks), kThreads, smem, stream>>>(
        g, static_cast<const T*>(d_o), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        mask, static_cast<const T*>(stats), static_cast<T*>(dk), static_cast<T*>(dv), vec);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace flash

cudaError_t LaunchFlashAttentionBackward(ir::DType dtype, const FlashGeometry& g, const void* d_o, const void* q,
                                         const void* k, const void* v, const void* mask, void* dq, void* dk, void* dv,
                                         void* stats, cudaStream_t stream) {
  if (dtype == ir::DType::kF32) {
    switch (g.head_tile) {
      case 32:
        return flash::Launch<float, 32>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
      case 64:
        return flash::Launch<float, 64>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
      case 128:
        return flash::Launch<float, 128>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (dtype == ir::DType::kF64) {
    switch (g.head_tile) {
      case 32:
        return flash::Launch<double, 32>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
      case 64:
        return flash::Launch<double, 64>(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (dtype == ir::DType::kBF16) {
    return flash::LaunchBackwardBf16(g, d_o, q, k, v, mask, dq, dk, dv, stats, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace onnxpipe::cuda
