// Forward of the bf16 fused attention (flash_attention.h) on tensor cores: one CTA per (batch
// matrix, 64-query tile), 16 queries per warp. Q stays in shared memory; 64-key tiles of K and V
// stream through two shared-memory stages (cp.async, the next tile loads while this one computes).
// Each warp computes its 16 x 64 scores S = Q K^T with mma.sync into fp32 accumulators, applies
// scale, masks and the online softmax in fp32, drops probabilities with the CPU's Philox stream,
// and feeds them, rounded to bf16, straight from the accumulators into O += P V.
#include <climits>

#include "executor/cuda/flash_attention_mma.cuh"

namespace onnxpipe::cuda {
namespace flash {
namespace {

using mma::bf16;

template <int D>
using Swizzle = mma::ChunkSwizzle<D>;

template <int D>
constexpr size_t ForwardSmemBytes() {
  return sizeof(bf16) * 5 * kTile * D;  // Q, 2 stages of (K, V)
}

template <int D>
__global__ void __launch_bounds__(kThreads) ForwardKernel(const FlashGeometry g, const bf16* __restrict__ q,
                                                          const bf16* __restrict__ k, const bf16* __restrict__ v,
                                                          const void* __restrict__ mask, bf16* __restrict__ o,
                                                          const VecFlags vec) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* qs = reinterpret_cast<bf16*>(smem);  // (64, D)
  bf16* kv = qs + kTile * D;                 // stage s: K at kv + 2 s 64 D, V after it
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row0 = warp * 16, r = lane >> 2, t = lane & 3;

  const int64_t nqt = (g.sq + kTile - 1) / kTile;
  const int64_t b = blockIdx.x / nqt;
  int64_t qt = blockIdx.x % nqt;
  if (g.causal) qt = nqt - 1 - qt;  // the tiles with the most keys first
  const int64_t i0 = qt * kTile;
  const BatchOffsets off = OffsetsOf(g, b);
  const bf16* kg = k + off.k;
  const bf16* vg = v + off.v;
  int64_t nkt = (g.sk + kTile - 1) / kTile;
  if (g.causal) nkt = min(nkt, (min(i0 + kTile, g.sq) - 1) / kTile + 1);

  LoadTile<bf16, D, Swizzle<D>>(qs, q + off.q, i0, g.sq, g.dh, vec.q);
  if (nkt > 0) LoadTilePair<bf16, D, Swizzle<D>>(kv, kg, g.dh, vec.k, vg, g.dv, vec.v, 0, g.sk);
  CpAsyncCommit();
  if (nkt == 0) CpAsyncWaitAll();  // no key tile (every key masked): O = 0

  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  auto row_counter = [&](int64_t i) { return g.counter_base + static_cast<uint64_t>((b * g.sq + i) * g.sk); };
  const float scale = static_cast<float>(g.scale);
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};
  float acc[D / 8][4];
  mma::Zero(acc);

  for (int64_t kt = 0; kt < nkt; ++kt) {
    CpAsyncWaitAll();
    __syncthreads();  // tile kt landed; every warp is done with tile kt - 1
    if (kt + 1 < nkt) {
      LoadTilePair<bf16, D, Swizzle<D>>(kv + ((kt + 1) & 1) * 2 * kTile * D, kg, g.dh, vec.k, vg, g.dv, vec.v,
                                        (kt + 1) * kTile, g.sk);
      CpAsyncCommit();
    }
    const bf16* ks = kv + (kt & 1) * 2 * kTile * D;
    const bf16* vs = ks + kTile * D;
    const int64_t j0 = kt * kTile;

    float s[8][4];
    mma::Zero(s);
    mma::ProductABt<D>(s, qs, row0, ks, lane);
    const bool all_visible = BlockAllVisible(g, i0, j0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * scale;
        if (!all_visible) {
          x = MaskedScore<float, bf16>(g, mask, off.mask, i0 + row0 + r + 8 * (e >> 1), j0 + 8 * n + 2 * t + (e & 1),
                                       x);
        }
        s[n][e] = x;
      }
    }
    // Online softmax per row h (row r + 8 h of the warp): rescale what was accumulated.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float new_max = fmaxf(row_max[h], mma::QuadMax(mx));
      const float base = new_max == -INFINITY ? 0.f : new_max;  // every key so far masked: p = 0
      const float alpha = ExpNonPositive(row_max[h] - base);
      row_max[h] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) {
          s[n][e] = ExpNonPositive(s[n][e] - base);
          sum += s[n][e];
        }
      }
      row_sum[h] = row_sum[h] * alpha + sum;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[n][2 * h] *= alpha;
        acc[n][2 * h + 1] *= alpha;
      }
    }
    if (g.dropout) {
      uint32_t keep[8][2];
      mma::KeepRowTile(keep, stream, i0 + row0, g.sq, j0, lane, row_counter);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (((keep[n][e >> 1] >> (e & 1)) & 1u) == 0) s[n][e] = 0.f;
        }
      }
    }
    uint32_t p[4][4];
    mma::ToFragments(p, s);
    mma::ProductPB<D>(acc, p, vs, lane);
  }

  // O = drop_scale * acc / sum; rows whose keys were all masked (sum 0) are zeros.
  const float drop_scale = static_cast<float>(g.drop_scale);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = mma::QuadSum(row_sum[h]);
    const float f = total > 0.f ? drop_scale / total : 0.f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][2 * h] *= f;
      acc[n][2 * h + 1] *= f;
    }
  }
  mma::StoreRows<D>(o + b * g.sq * g.dv, i0 + row0, g.sq, g.dv, vec.o, acc, lane);
}

template <int D>
cudaError_t Launch(const FlashGeometry& g, const void* q, const void* k, const void* v, const void* mask, void* o,
                   cudaStream_t stream) {
  const int64_t blocks = (g.sq + kTile - 1) / kTile * g.nbatch;
  if (blocks == 0 || g.dv == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  VecFlags vec = LoadVecFlags(g, sizeof(bf16), q, k, v, nullptr);
  vec.o = g.dv % 2 == 0 && Aligned(o, 4);
  constexpr size_t smem = ForwardSmemBytes<D>();
  if (cudaError_t e = cudaFuncSetAttribute(ForwardKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess) {
    return e;
  }
  ForwardKernel<D><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
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
