// LayerNorm / RMSNorm kernels (contract in layernorm.h).
//
// Layout of the work: a row is split into `chunks` of VEC elements (VEC = 16 bytes of T when d and
// every pointer allow, else 1); thread t of a block owns chunks t, t + blockDim.x, ... (NV of them),
// so a row lives in registers between the reductions and each thread always touches the same
// columns. The backward exploits the latter: a block walks a contiguous range of rows and keeps
// its columns' dgamma/dbeta partial sums in registers, writes them once to the workspace, and a
// second kernel sums the per-block partials column by column in a fixed order.
#include <algorithm>
#include <type_traits>

#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/layernorm.h"
#include "executor/cuda/row_kernels.cuh"

namespace onnxpipe::cuda {
namespace {

using rows::BlockSum;
using rows::FromFloat;
using rows::LoadFloats;
using rows::StoreFloats;
using rows::ToFloat;

constexpr int kMaxItems = 16;                        // elements of a row one thread keeps in registers
constexpr int kTargetThreads = 256;                  // preferred block size; larger only when d needs it
constexpr int kMaxThreads = 512;                     // keeps 128 registers per thread available
constexpr int64_t kPartialElems = int64_t{1} << 21;  // bound on (backward blocks) x d

struct RowPlan {
  int vec = 1;
  int nv = 1;
  int threads = 32;
};

// Chooses VEC, NV and the block size for rows of d elements; false when d is too large.
template <typename T>
bool PlanRow(int64_t d, bool aligned, RowPlan* plan) {
  plan->vec = aligned && d % rows::kVec16<T> == 0 ? rows::kVec16<T> : 1;
  const int64_t chunks = d / plan->vec;
  int64_t per_nv = 0;
  for (int nv = 1; nv * plan->vec <= kMaxItems; nv *= 2) {
    plan->nv = nv;
    per_nv = (chunks + nv - 1) / nv;
    if (per_nv <= kTargetThreads) break;
  }
  if (per_nv > kMaxThreads) return false;
  plan->threads = rows::ThreadsFor(per_nv, kMaxThreads);
  return true;
}

// Calls f(integral_constant VEC, integral_constant NV) for the plan's (VEC, NV).
template <int VEC, typename F>
cudaError_t WithNv(int nv, F&& f) {
  switch (nv) {
    case 1:
      return f(std::integral_constant<int, VEC>{}, std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, VEC>{}, std::integral_constant<int, 2>{});
    case 4:
      if constexpr (VEC * 4 <= kMaxItems)
        return f(std::integral_constant<int, VEC>{}, std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (VEC * 8 <= kMaxItems)
        return f(std::integral_constant<int, VEC>{}, std::integral_constant<int, 8>{});
      break;
    case 16:
      if constexpr (VEC * 16 <= kMaxItems) {
        return f(std::integral_constant<int, VEC>{}, std::integral_constant<int, 16>{});
      }
      break;
  }
  return cudaErrorInvalidValue;
}

template <typename T, typename F>
cudaError_t WithPlan(const RowPlan& plan, F&& f) {
  if (plan.vec == 1) return WithNv<1>(plan.nv, f);
  return WithNv<rows::kVec16<T>>(plan.nv, f);
}

// Block count of the backward (each block owns a contiguous range of rows): depends on (rows, d)
// only, so the workspace size and the summation order do not depend on the device.
int64_t BackwardBlocks(int64_t rows, int64_t d) {
  const int64_t max_blocks = std::max<int64_t>(1, kPartialElems / std::max<int64_t>(d, 256));
  const int64_t per_block = (rows + max_blocks - 1) / max_blocks;
  return per_block == 0 ? 0 : (rows + per_block - 1) / per_block;
}

// Mean (LayerNorm; 0 for RMSNorm) and rstd of one row held as v[NV][VEC] (zeros past the row).
template <int VEC, int NV>
__device__ __forceinline__ void RowStats(const float (&v)[NV][VEC], int chunks, int64_t d, bool layer, float epsilon,
                                         float* smem, float* mean, float* rstd) {
  const float inv_d = 1.f / static_cast<float>(d);
  float m[1] = {0.f};
  if (layer) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) m[0] += v[k][j];
    }
    BlockSum<1>(m, smem);
    m[0] *= inv_d;
  }
  float q[1] = {0.f};
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    if (static_cast<int>(threadIdx.x) + k * static_cast<int>(blockDim.x) >= chunks) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float c = v[k][j] - m[0];
      q[0] += c * c;
    }
  }
  BlockSum<1>(q, smem);
  *mean = m[0];
  *rstd = 1.f / sqrtf(q[0] * inv_d + epsilon);
}

// The forward's fused dropout as the kernel reads it (NormForwardArgs::dropout).
struct ForwardDropout {
  bool active = false;
  cpu::DropoutStream stream{};
  const uint64_t* device_offset = nullptr;
  uint64_t base = 0;  // counter of element 0
  float scale = 1.f;
};

// Keep decisions of the VEC elements from counter c0 (bit j: element c0 + j kept).
template <int VEC>
__device__ __forceinline__ uint32_t KeepBitsOf(const cpu::DropoutStream& s, uint64_t c0) {
  if constexpr (VEC < 4) {
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) bits |= (KeepBits4(s, c0 + j) & 1u) << j;
    return bits;
  } else {
    uint32_t bits = 0;
#pragma unroll
    for (int j = 0; j < VEC; j += 4) bits |= KeepBits4(s, c0 + j) << j;
    return bits;
  }
}

template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(kMaxThreads) NormForwardKernel(NormForwardArgs<T> a, ForwardDropout drop) {
  __shared__ float smem[32];
  const cpu::DropoutStream stream = drop.active ? WithOffset(drop.stream, drop.device_offset) : drop.stream;
  const int chunks = static_cast<int>(a.d / VEC);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * a.d;
  float v[NV][VEC];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= chunks) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[k][j] = 0.f;
      continue;
    }
    const int64_t off = base + int64_t{c} * VEC;
    LoadFloats<T, VEC>(a.x + off, v[k]);
    if (a.residual != nullptr) {
      float r[VEC];
      LoadFloats<T, VEC>(a.residual + off, r);
      if (drop.active) {  // x * scale and + r rounded separately, as the CPU's Dropout then Add (no FMA)
        const uint32_t keep = KeepBitsOf<VEC>(stream, drop.base + static_cast<uint64_t>(off));
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[k][j] = (keep >> j) & 1u ? __fmul_rn(v[k][j], drop.scale) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[k][j] = ToFloat(FromFloat<T>(__fadd_rn(r[j], v[k][j])));  // as stored
      if (a.sum != nullptr) StoreFloats<T, VEC>(a.sum + off, v[k]);
    }
  }
  const bool layer = a.kind == NormKind::kLayerNorm;
  float mean, rstd;
  RowStats<VEC, NV>(v, chunks, a.d, layer, a.epsilon, smem, &mean, &rstd);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= chunks) continue;
    float g[VEC], b[VEC] = {};
    LoadFloats<T, VEC>(a.gamma + int64_t{c} * VEC, g);
    if (a.beta != nullptr) LoadFloats<T, VEC>(a.beta + int64_t{c} * VEC, b);
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = (v[k][j] - mean) * rstd * g[j] + b[j];
    StoreFloats<T, VEC>(a.y + base + int64_t{c} * VEC, out);
  }
  if (threadIdx.x == 0) {
    if (a.mean != nullptr) a.mean[blockIdx.x] = mean;
    if (a.rstd != nullptr) a.rstd[blockIdx.x] = rstd;
  }
}

// Block b handles rows [b * rows_per_block, ...); with dgamma/dbeta requested it writes its
// column partials to workspace rows b (dgamma) and gridDim.x + b (dbeta), each of d floats.
template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(kMaxThreads) NormBackwardKernel(NormBackwardArgs<T> a, int64_t rows_per_block) {
  __shared__ float smem[64];
  const int chunks = static_cast<int>(a.d / VEC);
  const bool layer = a.kind == NormKind::kLayerNorm;
  const float inv_d = 1.f / static_cast<float>(a.d);
  float gam[NV][VEC], dg[NV][VEC], db[NV][VEC];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
#pragma unroll
    for (int j = 0; j < VEC; ++j) gam[k][j] = dg[k][j] = db[k][j] = 0.f;
    if (c < chunks) LoadFloats<T, VEC>(a.gamma + int64_t{c} * VEC, gam[k]);
  }
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < a.rows ? row_begin + rows_per_block : a.rows;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t base = row * a.d;
    float xh[NV][VEC], dy[NV][VEC];
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c < chunks) {
        LoadFloats<T, VEC>(a.x + base + int64_t{c} * VEC, xh[k]);
        LoadFloats<T, VEC>(a.dy + base + int64_t{c} * VEC, dy[k]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) xh[k][j] = dy[k][j] = 0.f;
      }
    }
    float mean = 0.f, rstd;
    if (a.rstd != nullptr) {
      rstd = a.rstd[row];
      if (layer) mean = a.mean[row];
    } else {
      RowStats<VEC, NV>(xh, chunks, a.d, layer, a.epsilon, smem, &mean, &rstd);
    }
    float sums[2] = {0.f, 0.f};  // sum(g), sum(g xh)
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c >= chunks) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        xh[k][j] = (xh[k][j] - mean) * rstd;
        const float g = dy[k][j] * gam[k][j];
        sums[0] += g;
        sums[1] += g * xh[k][j];
      }
    }
    BlockSum<2>(sums, smem);
    const float mg = layer ? sums[0] * inv_d : 0.f;
    const float mgx = sums[1] * inv_d;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = threadIdx.x + k * blockDim.x;
      if (c >= chunks) continue;
      const int64_t off = base + int64_t{c} * VEC;
      float dres[VEC] = {};
      if (a.dresidual != nullptr) LoadFloats<T, VEC>(a.dresidual + off, dres);
      float out[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        out[j] = rstd * (dy[k][j] * gam[k][j] - mg - xh[k][j] * mgx) + dres[j];
        dg[k][j] += dy[k][j] * xh[k][j];
        db[k][j] += dy[k][j];
      }
      StoreFloats<T, VEC>(a.dx + off, out);
    }
  }
  if (a.dgamma == nullptr && a.dbeta == nullptr) return;
  float* part_g = a.workspace + static_cast<int64_t>(blockIdx.x) * a.d;
  float* part_b = a.workspace + static_cast<int64_t>(gridDim.x + blockIdx.x) * a.d;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c >= chunks) continue;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      part_g[int64_t{c} * VEC + j] = dg[k][j];
      part_b[int64_t{c} * VEC + j] = db[k][j];
    }
  }
}

// dgamma[col] = sum over p of partial[p][col], dbeta from the second half; fixed order: thread
// row ty sums parts ty, ty + 32, ..., then the 32 results are added in ty order.
__global__ void ColumnSumKernel(const float* __restrict__ partial, int64_t parts, int64_t d, float* __restrict__ dgamma,
                                float* __restrict__ dbeta) {
  __shared__ float sg[32][33], sb[32][33];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float g = 0.f, b = 0.f;
  if (col < d) {
    for (int64_t p = threadIdx.y; p < parts; p += 32) {
      if (dgamma != nullptr) g += partial[p * d + col];
      if (dbeta != nullptr) b += partial[(parts + p) * d + col];
    }
  }
  sg[threadIdx.y][threadIdx.x] = g;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || col >= d) return;
  float tg = 0.f, tb = 0.f;
  for (int y = 0; y < 32; ++y) {
    tg += sg[y][threadIdx.x];
    tb += sb[y][threadIdx.x];
  }
  if (dgamma != nullptr) dgamma[col] = tg;
  if (dbeta != nullptr) dbeta[col] = tb;
}

}  // namespace

int64_t NormBackwardWorkspaceBytes(int64_t rows, int64_t d) {
  return 2 * BackwardBlocks(rows, d) * d * static_cast<int64_t>(sizeof(float));
}

template <typename T>
cudaError_t LaunchNormForward(const NormForwardArgs<T>& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  RowPlan plan;
  const bool aligned = rows::AllAligned(16, a.x, a.residual, a.sum, a.gamma, a.beta, a.y);
  if (!PlanRow<T>(a.d, aligned, &plan) || a.rows > 0x7fffffff) return cudaErrorInvalidValue;
  ForwardDropout drop;
  if (a.dropout != nullptr && a.residual != nullptr && DropoutActive(*a.dropout)) {
    const DropoutParams& p = *a.dropout;
    drop.active = true;
    drop.stream = cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
    drop.device_offset = p.device_offset;
    drop.base = p.counter_base;
    drop.scale = static_cast<float>(KeepScale(p));
  }
  return WithPlan<T>(plan, [&](auto vec, auto nv) {
    NormForwardKernel<T, decltype(vec)::value, decltype(nv)::value>
        <<<static_cast<unsigned>(a.rows), plan.threads, 0, stream>>>(a, drop);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t LaunchNormBackward(const NormBackwardArgs<T>& a, cudaStream_t stream) {
  if (a.rows == 0) {
    float* const sums[2] = {a.dgamma, a.dbeta};  // sums over no rows
    for (float* p : sums) {
      if (p == nullptr) continue;
      const cudaError_t err = cudaMemsetAsync(p, 0, a.d * sizeof(float), stream);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  RowPlan plan;
  const bool aligned = rows::AllAligned(16, a.dy, a.x, a.gamma, a.dresidual, a.dx);
  if (!PlanRow<T>(a.d, aligned, &plan)) return cudaErrorInvalidValue;
  const int64_t blocks = BackwardBlocks(a.rows, a.d);
  const int64_t rows_per_block = (a.rows + blocks - 1) / blocks;
  cudaError_t err = WithPlan<T>(plan, [&](auto vec, auto nv) {
    NormBackwardKernel<T, decltype(vec)::value, decltype(nv)::value>
        <<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(a, rows_per_block);
    return cudaGetLastError();
  });
  if (err != cudaSuccess || (a.dgamma == nullptr && a.dbeta == nullptr)) return err;
  ColumnSumKernel<<<static_cast<unsigned>((a.d + 31) / 32), dim3(32, 32), 0, stream>>>(a.workspace, blocks, a.d,
                                                                                       a.dgamma, a.dbeta);
  return cudaGetLastError();
}

template cudaError_t LaunchNormForward<float>(const NormForwardArgs<float>&, cudaStream_t);
template cudaError_t LaunchNormForward<__nv_bfloat16>(const NormForwardArgs<__nv_bfloat16>&, cudaStream_t);
template cudaError_t LaunchNormBackward<float>(const NormBackwardArgs<float>&, cudaStream_t);
template cudaError_t LaunchNormBackward<__nv_bfloat16>(const NormBackwardArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace onnxpipe::cuda
