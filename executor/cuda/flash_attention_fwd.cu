// Forward of the fused attention (flash_attention.h): one CTA per (batch matrix, 64-query tile).
// Q stays in shared memory; 64-key tiles of K and V stream through two shared-memory stages
// (cp.async, the next tile loads while this one computes); each warp turns its 16 x 64 scores into
// probabilities with the running row maximum and sum (online softmax), drops them with the CPU's
// Philox stream, passes them through a warp-private buffer and accumulates P V in registers.
#include <climits>

#include "executor/cuda/flash_attention.cuh"

namespace onnxpipe::cuda {
namespace flash {
namespace {

template <typename T, int D>
constexpr size_t ForwardSmemBytes() {
  return sizeof(T) * (kTile * D + 4 * kTile * D + kWarps * 16 * kTile);  // Q, 2 x (K, V), P per warp
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const FlashGeometry g, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                  const void* __restrict__ mask, T* __restrict__ o, const VecFlags vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  T* qs = reinterpret_cast<T*>(smem);  // (64, D)
  T* kv = qs + kTile * D;              // stage s: K at kv + 2 s 64 D, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = RowGroup(lane), cg = ColGroup(lane);
  T* pw = kv + 4 * kTile * D + warp * 16 * kTile;  // this warp's (16, 64) probabilities
  const int arow = warp * 16 + rg * 4;

  const int64_t nqt = (g.sq + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / nqt;
  int64_t qt = blockIdx.x % nqt;
  if (g.causal) qt = nqt - 1 - qt;  // the tiles with the most keys first
  const int64_t i0 = qt * kTile;
  const BatchOffsets off = OffsetsOf(g, b);
  const T* qg = q + off.q;
  const T* kg = k + off.k;
  const T* vg = v + off.v;
  int64_t nkt = (g.sk + kTile - 1) / kTile;
  if (g.causal) nkt = min(nkt, (min(i0 + kTile, g.sq) - 1) / kTile + 1);

  const TileSource<T> k_src{kg, g.dh, g.k_ld, vec.k}, v_src{vg, g.dv, g.v_ld, vec.v};
  LoadTile<T, D>(qs, qg, i0, g.sq, g.dh, g.q_ld, vec.q);
  if (nkt > 0) {
    LoadTilePair<T, D>(kv, k_src, v_src, 0, g.sk);
  }
  CpAsyncCommit();
  if (nkt == 0) CpAsyncWaitAll();  // no key tile (every key masked): O = 0

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  const T scale = static_cast<T>(g.scale);
  T row_max[4], row_sum[4], acc[4][D / 8];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    row_max[m] = NegInf<T>();
    row_sum[m] = 0;
#pragma unroll
    for (int e = 0; e < D / 8; ++e) acc[m][e] = 0;
  }

  for (int64_t kt = 0; kt < nkt; ++kt) {
    CpAsyncWaitAll();
    __syncthreads();  // tile kt landed; every warp is done with tile kt - 1 (its stage and P)
    if (kt + 1 < nkt) {
      LoadTilePair<T, D>(kv + ((kt + 1) & 1) * 2 * kTile * D, k_src, v_src, (kt + 1) * kTile, g.sk);
      CpAsyncCommit();
    }
    const T* ks = kv + (kt & 1) * 2 * kTile * D;
    const T* vs = ks + kTile * D;
    const int64_t j0 = kt * kTile;

    T s[4][8];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
#pragma unroll
      for (int c = 0; c < 8; ++c) s[m][c] = 0;
    }
    ProductABt<T, D>(s, qs, arow, ks, cg);
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
    // Online softmax: rescale what was accumulated under the previous maximum.
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      T mx = s[m][0];
#pragma unroll
      for (int c = 1; c < 8; ++c) mx = max(mx, s[m][c]);
      const T new_max = max(row_max[m], GroupMax(mx));
      const T base = new_max == NegInf<T>() ? T(0) : new_max;  // every key so far masked: p = 0
      const T alpha = ExpNonPositive(row_max[m] - base);
      row_max[m] = new_max;
      T sum = 0;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        s[m][c] = ExpNonPositive(s[m][c] - base);
        sum += s[m][c];
      }
      row_sum[m] = row_sum[m] * alpha + sum;
#pragma unroll
      for (int e = 0; e < D / 8; ++e) acc[m][e] *= alpha;
    }
    if (g.dropout) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int64_t i = i0 + arow + m;
        if (i >= g.sq) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint64_t c0 = g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk + j0 + 4 * (cg + 8 * h));
          const uint32_t keep = KeepBits4(stream, c0);
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            if (((keep >> n) & 1u) == 0) s[m][4 * h + n] = 0;
          }
        }
      }
    }
    StoreTile(pw, rg * 4, cg, s);
    __syncwarp();
    ProductPB<T, D>(acc, pw, rg * 4, vs, cg);
  }

  // O = drop_scale * acc / sum; rows whose keys were all masked (sum 0) are zeros.
  const T drop_scale = static_cast<T>(g.drop_scale);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const T total = GroupSum(row_sum[m]);
    const T f = total > T(0) ? drop_scale / total : T(0);
    const int64_t i = i0 + arow + m;
    if (g.lse != nullptr && cg == 0 && i < g.sq) {
      g.lse[b * g.sq + i] = static_cast<float>(row_max[m] + log(static_cast<double>(total)));
    }
#pragma unroll
    for (int e = 0; e < D / 8; ++e) acc[m][e] *= f;
  }
  StoreRows<T, D>(o + OffsetOf(g, g.o_stride, b), i0 + arow, g.sq, g.dv, g.o_ld, cg, vec.o, acc);
}

template <typename T, int D>
cudaError_t Launch(const FlashGeometry& g, const void* q, const void* k, const void* v, const void* mask, void* o,
                   cudaStream_t stream) {
  const int64_t blocks = (g.sq + kTile - 1) / kTile * g.nbatch;
  if (blocks == 0 || g.dv == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  VecFlags vec = LoadVecFlags(g, sizeof(T), q, k, v, nullptr);
  SetStoreVecFlags(vec, g, 4 * sizeof(T), 4, o, nullptr, nullptr, nullptr);
  constexpr size_t smem = ForwardSmemBytes<T, D>();
  if (cudaError_t e = cudaFuncSetAttribute(ForwardKernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess) {
    return e;
  }
  ForwardKernel<T, D><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      g, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), mask, static_cast<T*>(o), vec);
  return cudaGetLastError();
}

}  // namespace
}  // namespace flash

cudaError_t LaunchFlashAttentionForward(ir::DType dtype, const FlashGeometry& g, const void* q, const void* k,
                                        const void* v, const void* mask, void* o, cudaStream_t stream) {
  if (dtype == ir::DType::kF32) {
    switch (g.head_tile) {
      case 32:
        return flash::Launch<float, 32>(g, q, k, v, mask, o, stream);
      case 64:
        return flash::Launch<float, 64>(g, q, k, v, mask, o, stream);
      case 128:
        return flash::Launch<float, 128>(g, q, k, v, mask, o, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (dtype == ir::DType::kF64) {
    switch (g.head_tile) {
      case 32:
        return flash::Launch<double, 32>(g, q, k, v, mask, o, stream);
      case 64:
        return flash::Launch<double, 64>(g, q, k, v, mask, o, stream);
      default:
        return cudaErrorInvalidValue;
    }
  }
  if (dtype == ir::DType::kBF16) return flash::LaunchForwardBf16(g, q, k, v, mask, o, stream);
  return cudaErrorInvalidValue;
}

}  // namespace onnxpipe::cuda
