// LayerNorm / RMSNorm kernels (contract in layernorm.h).
//
// Layout of the work: a row is split into `chunks` of VEC elements (VEC = 16 bytes of T when d and
// every pointer allow, else 1). A row is handled by a group of `tpr` threads; thread l of the group
// owns chunks l, l + tpr, ... (NV of them), so a row lives in registers between the reductions and
// each thread always touches the same columns.
//
// Forward: one block per row (the group is the block).
//
// Backward: a block walks a contiguous range of rows (its part) and keeps its columns' dgamma/dbeta
// partial sums in registers, writes them once to the workspace, and a second kernel sums the parts
// column by column in a fixed order. The row group is
//   - the whole block when d > 256 (reductions through shared memory, as in the forward);
//   - 8, 16 or 32 lanes of a warp when d <= 256 (8 elements per lane): a 256-thread block holds
//     256 / tpr groups, each walking its own rows with shuffle-only reductions (no __syncthreads in
//     the row loop); at the end the groups' sums are combined in a fixed order (xor butterfly over
//     the groups of a warp, then the warps in index order through shared memory).
// Either way a group loads ROWS rows (up to 4, as many as 16 registers per input and thread allow)
// before reducing any of them, and reduces them together: with one row at a time the loop is
// latency bound (a row's loads, then dependent reductions with barriers, then the next row's
// loads), so ROWS times more bytes are in flight and the barriers are paid once per ROWS rows.
// The number of parts depends only on (rows, d), not on the device or the pointers' alignment, so
// the workspace size and the summation order are fixed and dgamma/dbeta are bitwise reproducible.
#include <algorithm>
#include <cstring>
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

constexpr int kMaxItems = 16;                         // elements of a row one thread keeps in registers
constexpr int kTargetThreads = 256;                   // preferred block size; larger only when d needs it
constexpr int kMaxThreads = 512;                      // keeps 128 registers per thread available
constexpr int kWarpRowItems = 8;                      // elements per lane on the backward's warp path
constexpr int64_t kWarpRowMaxD = 32 * kWarpRowItems;  // largest d the warp path takes
constexpr int kWarpRowThreads = 256;                  // block size of the warp path
constexpr int kMaxRowsInFlight = 4;                   // rows a backward row group loads at once
constexpr int64_t kBackwardThreads = 65536;           // threads of all backward blocks (see BackwardBlocks)

struct RowPlan {
  int vec = 1;
  int nv = 1;
  int threads = 32;
  int tpr = 0;  // threads per row; 0: the whole block (one row at a time per block)
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

// The backward's plan: PlanRow's for d > kWarpRowMaxD; else kWarpRowItems elements per lane (NV
// chunks of VEC) and the smallest group of 8, 16 or 32 lanes that covers the row.
template <typename T>
bool PlanBackward(int64_t d, bool aligned, RowPlan* plan) {
  if (d > kWarpRowMaxD) {
    plan->tpr = 0;
    return PlanRow<T>(d, aligned, plan);
  }
  plan->vec = aligned && d % rows::kVec16<T> == 0 ? rows::kVec16<T> : 1;
  plan->nv = kWarpRowItems / plan->vec;
  const int64_t lanes = (d + kWarpRowItems - 1) / kWarpRowItems;
  plan->tpr = 8;
  while (plan->tpr < lanes) plan->tpr *= 2;
  plan->threads = kWarpRowThreads;
  return true;
}

// Calls f(integral_constant<bool, flag>).
template <typename F>
cudaError_t WithFlag(bool flag, F&& f) {
  return flag ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(integral_constant TPR) for a warp path group size.
template <typename F>
cudaError_t WithTpr(int tpr, F&& f) {
  switch (tpr) {
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
  }
  return cudaErrorInvalidValue;
}

// Block count (= parts) of the backward, each block owning a contiguous range of rows. It depends
// on (rows, d) only, so the workspace size and the summation order depend neither on the device
// nor on the plan. More parts cost workspace traffic (2 d floats written and read per part) and
// fewer leave the GPU underfilled, so the blocks together have about kBackwardThreads threads:
// one wave on an H100/H200-class GPU at <= 128 registers per thread (about 500 threads per SM),
// with several rows in flight per block. A block has about d / 8 threads (d / 16 past 2048, where
// the plan keeps 16 elements per thread; kWarpRowThreads on the warp path).
int64_t BackwardBlocks(int64_t rows, int64_t d) {
  const int64_t threads = d <= kWarpRowMaxD ? kWarpRowThreads : std::max<int64_t>(32, d / (d <= 2048 ? 8 : 16));
  const int64_t max_blocks = std::max<int64_t>(1, kBackwardThreads / threads);
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

// The fused dropout as the kernels read it (NormForwardArgs::dropout, NormBackwardArgs::dropout).
struct RowDropout {
  bool active = false;
  cpu::DropoutStream stream{};
  const uint64_t* device_offset = nullptr;
  uint64_t base = 0;  // counter of element 0
  float scale = 1.f;
};

// Keep decisions of the VEC elements from counter c0 (bit j: element c0 + j kept).
template <int VEC>
__device__ __forceinline__ uint32_t KeepBitsOf(const cpu::DropoutStream& s, uint64_t c0) {
  uint32_t bits = 0;
  if constexpr (VEC % 8 == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 8) bits |= KeepBits8(s, c0 + j) << j;
  } else if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 4) bits |= KeepBits4(s, c0 + j) << j;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) bits |= (KeepBits4(s, c0 + j) & 1u) << j;
  }
  return bits;
}

template <typename T, int VEC, int NV>
__global__ void __launch_bounds__(kMaxThreads) NormForwardKernel(NormForwardArgs<T> a, RowDropout drop) {
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

// Rows a backward row group loads before reducing them: as many as keep one input's slices of
// them within 16 registers per thread (4 for 16-byte slices), at most kMaxRowsInFlight.
template <typename T, int VEC, int NV>
constexpr int kRowsInFlight = std::clamp(16 / (NV * ((VEC * static_cast<int>(sizeof(T)) + 3) / 4)), 1,
                                         kMaxRowsInFlight);

// Sums each v[k] over a row group: TPR lanes of a warp (xor butterfly) or, for TPR = 0, the whole
// block (BlockSum). Every member receives the same, reproducibly ordered, result.
template <int TPR, int N>
__device__ __forceinline__ void GroupSum(float (&v)[N], float* smem) {
  if constexpr (TPR == 0) {
    BlockSum<N>(v, smem);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) {
#pragma unroll
      for (int off = TPR / 2; off > 0; off /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
}

// The bits of v rounded to bf16.
__device__ __forceinline__ uint32_t Bf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// VEC elements of T in 32-bit words: fp32 as their bits, bf16 two to a word (a lone bf16 as the
// bits of its float). Held this way, a bf16 row slice takes half a register per element; as an
// array of bf16 the compiler gives each element its own register once loads and zeros merge.
template <typename T, int VEC>
struct Slice {
  static constexpr bool kPairs = std::is_same_v<T, __nv_bfloat16> && VEC % 2 == 0;
  static constexpr int kWords = kPairs ? VEC / 2 : VEC;
  uint32_t w[kWords];

  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void Load(const T* p) {
    const rows::Pack<T, VEC> pk = *reinterpret_cast<const rows::Pack<T, VEC>*>(p);
    if constexpr (std::is_same_v<T, float> || kPairs) {
      memcpy(w, &pk, sizeof(w));
    } else {
      uint16_t h[VEC];
      memcpy(h, &pk, sizeof(h));
#pragma unroll
      for (int j = 0; j < VEC; ++j) w[j] = uint32_t{h[j]} << 16;
    }
  }
  // Element j as a float (exact).
  __device__ __forceinline__ float operator[](int j) const {
    if constexpr (kPairs) return __uint_as_float(j % 2 == 0 ? w[j / 2] << 16 : w[j / 2] & 0xffff0000u);
    return __uint_as_float(w[j]);
  }
  // Adds `o` element by element, each sum rounded to T (what an Add of the two stores).
  __device__ __forceinline__ void AddRounded(const Slice& o) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        w[i] = __float_as_uint(__uint_as_float(w[i]) + __uint_as_float(o.w[i]));
      } else if constexpr (kPairs) {
        const uint32_t lo = Bf16Bits((*this)[2 * i] + o[2 * i]), hi = Bf16Bits((*this)[2 * i + 1] + o[2 * i + 1]);
        w[i] = lo | hi << 16;
      } else {
        w[i] = Bf16Bits((*this)[i] + o[i]) << 16;
      }
    }
  }
};

// Block b handles rows [b * rows_per_block, ...) in row groups of TPR lanes (0: the whole block),
// ROWS rows per group at a time; with dgamma/dbeta requested it writes its column sums to
// workspace rows b (dgamma) and gridDim.x + b (dbeta), each of d floats. Row data stay packed
// (Slice) and are converted where used. The minimum of 1 block per SM is spelled out because
// without it ptxas held some instantiations to 64 registers, spilling.
template <typename T, int VEC, int NV, int TPR, bool kSums>
__global__ void __launch_bounds__(kMaxThreads, 1)
    NormBackwardKernel(NormBackwardArgs<T> a, int64_t rows_per_block, RowDropout drop) {
  using S = Slice<T, VEC>;
  constexpr int ROWS = kRowsInFlight<T, VEC, NV>;
  static_assert(kMaxRowsInFlight % ROWS == 0, "a group's rows are walked ROWS at a time");
  constexpr int kAcc = kSums ? 3 : 2;  // column sums kept: dgamma, dbeta and (kSums) dx_sums
  // Block reductions of 2 ROWS values, or the warp path's combination of the column sums.
  __shared__ float smem[TPR == 0 ? 32 * 2 * ROWS : kAcc * kWarpRowMaxD];
  const int tpr = TPR > 0 ? TPR : static_cast<int>(blockDim.x);
  const int lane = TPR > 0 ? static_cast<int>(threadIdx.x) % TPR : static_cast<int>(threadIdx.x);
  const int group = TPR > 0 ? static_cast<int>(threadIdx.x) / TPR : 0;
  const int groups = TPR > 0 ? static_cast<int>(blockDim.x) / TPR : 1;
  const int d = static_cast<int>(a.d);
  const int chunks = d / VEC;
  const bool layer = a.kind == NormKind::kLayerNorm;
  const bool saved = a.rstd != nullptr;
  const float inv_d = 1.f / static_cast<float>(a.d);
  const cpu::DropoutStream stream = drop.active ? WithOffset(drop.stream, drop.device_offset) : drop.stream;
  S gam[NV];
  float acc[kAcc][NV][VEC];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = lane + k * tpr;
    gam[k].Zero();
    if (c < chunks) gam[k].Load(a.gamma + int64_t{c} * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
#pragma unroll
      for (int s = 0; s < kAcc; ++s) acc[s][k][j] = 0.f;
    }
  }
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t row_end = row_begin + rows_per_block < a.rows ? row_begin + rows_per_block : a.rows;
  // Rows are dealt to the groups kMaxRowsInFlight at a time (group g takes rows base + 4 g + [0, 4)),
  // which a group then walks ROWS at a time: the rows each group sums into dgamma/dbeta, and so the
  // summation order, do not depend on ROWS (which depends on VEC, i.e. on alignment). The trip
  // counts are the same for every thread, as the reductions need all lanes (all threads for
  // TPR = 0): rows past row_end are carried as zeros and neither stored nor accumulated.
  for (int64_t base = row_begin; base < row_end; base += int64_t{groups} * kMaxRowsInFlight) {
#pragma unroll 1
    for (int sub = 0; sub < kMaxRowsInFlight && base + sub < row_end; sub += ROWS) {
      const int64_t first = base + int64_t{group} * kMaxRowsInFlight + sub;  // rows first .. first + ROWS - 1
      const int64_t first_off = first * a.d;                                 // offsets within these rows fit in an int
      // All loads of the ROWS rows come before any use, so they are in flight together.
      S xs[ROWS][NV], dys[ROWS][NV], drs[ROWS][NV];
      float mean[ROWS], rstd[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int64_t row = first + r;
        const bool valid = row < row_end;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int c = lane + k * tpr;
          xs[r][k].Zero();
          dys[r][k].Zero();
          drs[r][k].Zero();
          if (!valid || c >= chunks) continue;
          const int off = r * d + c * VEC;
          xs[r][k].Load(a.x + first_off + off);
          dys[r][k].Load(a.dy + first_off + off);
          if (a.dy2 != nullptr) {
            S more;
            more.Load(a.dy2 + first_off + off);
            dys[r][k].AddRounded(more);
          }
          if (a.dresidual != nullptr) drs[r][k].Load(a.dresidual + first_off + off);
        }
        mean[r] = rstd[r] = 0.f;
        if (valid && saved) {
          rstd[r] = a.rstd[row];
          if (layer) mean[r] = a.mean[row];
        }
      }
      if (!saved) {
        // Two-pass statistics (mean, then the centred sum of squares), the rows reduced together.
        float m[ROWS] = {}, q[ROWS] = {};
        if (layer) {
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int k = 0; k < NV; ++k) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) m[r] += xs[r][k][j];
            }
          }
          GroupSum<TPR>(m, smem);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) mean[r] = m[r] * inv_d;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
          for (int k = 0; k < NV; ++k) {
            if (lane + k * tpr >= chunks) continue;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              const float c = xs[r][k][j] - mean[r];
              q[r] += c * c;
            }
          }
        }
        GroupSum<TPR>(q, smem);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) rstd[r] = 1.f / sqrtf(q[r] * inv_d + a.epsilon);
      }
      float sums[2 * ROWS] = {};  // per row: sum(g), sum(g xh)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          if (lane + k * tpr >= chunks) continue;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xh = (xs[r][k][j] - mean[r]) * rstd[r];
            const float g = dys[r][k][j] * gam[k][j];
            sums[2 * r] += g;
            sums[2 * r + 1] += g * xh;
          }
        }
      }
      GroupSum<TPR>(sums, smem);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const int64_t row = first + r;
        if (row >= row_end) continue;
        const float mg = layer ? sums[2 * r] * inv_d : 0.f;
        const float mgx = sums[2 * r + 1] * inv_d;
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int c = lane + k * tpr;
          if (c >= chunks) continue;
          float out[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float dy = dys[r][k][j];
            const float xh = (xs[r][k][j] - mean[r]) * rstd[r];
            out[j] = rstd[r] * (dy * gam[k][j] - mg - xh * mgx) + drs[r][k][j];
            acc[0][k][j] += dy * xh;
            acc[1][k][j] += dy;
          }
          StoreFloats<T, VEC>(a.dx + first_off + (r * d + c * VEC), out);
          if constexpr (kSums) {
            if (!a.sums_of_dropped) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) acc[kAcc - 1][k][j] += ToFloat(FromFloat<T>(out[j]));
            }
          }
          if (a.dx_dropped != nullptr) {  // DropoutGrad of dx as stored
            const int64_t off = first_off + (r * d + c * VEC);
            const uint32_t keep = drop.active ? KeepBitsOf<VEC>(stream, drop.base + static_cast<uint64_t>(off)) : ~0u;
#pragma unroll
            for (int j = 0; j < VEC; ++j) out[j] = (keep >> j) & 1u ? ToFloat(FromFloat<T>(out[j])) * drop.scale : 0.f;
            StoreFloats<T, VEC>(a.dx_dropped + off, out);
            if constexpr (kSums) {
              if (a.sums_of_dropped) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) acc[kAcc - 1][k][j] += ToFloat(FromFloat<T>(out[j]));
              }
            }
          }
        }
      }
    }
  }
  if (a.dgamma == nullptr && a.dbeta == nullptr && !kSums) return;
  // Workspace rows s * gridDim.x + b: block b's partial sums of column sum s (dgamma, dbeta, dx_sums).
  float* part[kAcc];
  const float* const wanted[3] = {a.dgamma, a.dbeta, a.dx_sums};
#pragma unroll
  for (int s = 0; s < kAcc; ++s) {
    part[s] = wanted[s] == nullptr ? nullptr : a.workspace + static_cast<int64_t>(s * gridDim.x + blockIdx.x) * a.d;
  }
  if constexpr (TPR == 0) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = lane + k * tpr;
      if (c >= chunks) continue;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
#pragma unroll
        for (int s = 0; s < kAcc; ++s) {
          if (part[s] != nullptr) part[s][int64_t{c} * VEC + j] = acc[s][k][j];
        }
      }
    }
  } else {
    // The groups of a warp own the same columns: combine them with an xor butterfly over the group
    // bits of the lane, after which group 0 of each warp adds its warp's sums into shared memory,
    // warp after warp.
#pragma unroll
    for (int off = TPR; off < 32; off *= 2) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
#pragma unroll
          for (int s = 0; s < kAcc; ++s) acc[s][k][j] += __shfl_xor_sync(0xffffffffu, acc[s][k][j], off);
        }
      }
    }
    const int warp = static_cast<int>(threadIdx.x) / 32;
    for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) {
      if (warp == w && static_cast<int>(threadIdx.x) % 32 < TPR) {
#pragma unroll
        for (int k = 0; k < NV; ++k) {
          const int c = lane + k * tpr;
          if (c >= chunks) continue;
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const int i = c * VEC + j;
#pragma unroll
            for (int s = 0; s < kAcc; ++s) {
              float* const into = smem + s * kWarpRowMaxD;
              into[i] = w == 0 ? acc[s][k][j] : into[i] + acc[s][k][j];
            }
          }
        }
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < a.d; i += blockDim.x) {
#pragma unroll
      for (int s = 0; s < kAcc; ++s) {
        if (part[s] != nullptr) part[s][i] = smem[s * kWarpRowMaxD + i];
      }
    }
  }
}

// One column sum of the parts' partials per thread column: dgamma from the first `parts` rows of
// `partial` (blockIdx.y = 0), dbeta from the next `parts` (blockIdx.y = 1), dx_sums from the `parts`
// after those (blockIdx.y = 2), so that several times as many SMs share the (latency bound) work.
// Fixed order: thread row ty sums parts ty, ty + 32, ... in order, then the 32 results are added in
// ty order.
__global__ void __launch_bounds__(1024)
    ColumnSumKernel(const float* __restrict__ partial, int64_t parts, int64_t d, float* __restrict__ dgamma,
                    float* __restrict__ dbeta, float* __restrict__ dx_sums) {
  __shared__ float s[32][33];
  float* const out = blockIdx.y == 0 ? dgamma : blockIdx.y == 1 ? dbeta : dx_sums;
  if (out == nullptr) return;  // the same for the whole block
  const float* const src = partial + blockIdx.y * parts * d;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float t = 0.f;
  if (col < d) {
#pragma unroll 4
    for (int64_t p = threadIdx.y; p < parts; p += 32) t += src[p * d + col];
  }
  s[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y != 0 || col >= d) return;
  float sum = 0.f;
  for (int y = 0; y < 32; ++y) sum += s[y][threadIdx.x];
  out[col] = sum;
}

// The kernels' view of `p` (inactive when null or not dropping).
RowDropout RowDropoutOf(const DropoutParams* p) {
  RowDropout drop;
  if (p == nullptr || !DropoutActive(*p)) return drop;
  drop.active = true;
  drop.stream = cpu::DropoutStream::Make(p->seed, p->node_key, p->offset, p->ratio);
  drop.device_offset = p->device_offset;
  drop.base = p->counter_base;
  drop.scale = static_cast<float>(KeepScale(*p));
  return drop;
}

}  // namespace

int64_t NormBackwardWorkspaceBytes(int64_t rows, int64_t d) {
  return 3 * BackwardBlocks(rows, d) * d * static_cast<int64_t>(sizeof(float));
}

template <typename T>
cudaError_t LaunchNormForward(const NormForwardArgs<T>& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  RowPlan plan;
  const bool aligned = rows::AllAligned(16, a.x, a.residual, a.sum, a.gamma, a.beta, a.y);
  if (!PlanRow<T>(a.d, aligned, &plan) || a.rows > 0x7fffffff) return cudaErrorInvalidValue;
  const RowDropout drop = a.residual != nullptr ? RowDropoutOf(a.dropout) : RowDropout{};
  return WithPlan<T>(plan, [&](auto vec, auto nv) {
    NormForwardKernel<T, decltype(vec)::value, decltype(nv)::value>
        <<<static_cast<unsigned>(a.rows), plan.threads, 0, stream>>>(a, drop);
    return cudaGetLastError();
  });
}

template <typename T>
cudaError_t LaunchNormBackward(const NormBackwardArgs<T>& a, cudaStream_t stream) {
  if (a.rows == 0) {
    float* const sums[3] = {a.dgamma, a.dbeta, a.dx_sums};  // sums over no rows
    for (float* p : sums) {
      if (p == nullptr) continue;
      const cudaError_t err = cudaMemsetAsync(p, 0, a.d * sizeof(float), stream);
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
  RowPlan plan;
  const bool aligned = rows::AllAligned(16, a.dy, a.dy2, a.x, a.gamma, a.dresidual, a.dx, a.dx_dropped);
  if (!PlanBackward<T>(a.d, aligned, &plan)) return cudaErrorInvalidValue;
  const int64_t blocks = BackwardBlocks(a.rows, a.d);
  const int64_t rows_per_block = (a.rows + blocks - 1) / blocks;
  const RowDropout drop = a.dx_dropped != nullptr ? RowDropoutOf(a.dropout) : RowDropout{};
  const bool sums = a.dx_sums != nullptr;
  cudaError_t err = WithFlag(sums, [&](auto with_sums) {
    constexpr bool kSums = decltype(with_sums)::value;
    if (plan.tpr == 0) {
      return WithPlan<T>(plan, [&](auto vec, auto nv) {
        NormBackwardKernel<T, decltype(vec)::value, decltype(nv)::value, 0, kSums>
            <<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(a, rows_per_block, drop);
        return cudaGetLastError();
      });
    }
    return WithTpr(plan.tpr, [&](auto tpr) {
      constexpr int kTpr = decltype(tpr)::value;
      if (plan.vec == 1) {
        NormBackwardKernel<T, 1, kWarpRowItems, kTpr, kSums>
            <<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(a, rows_per_block, drop);
      } else {
        constexpr int kVec = rows::kVec16<T>;
        NormBackwardKernel<T, kVec, kWarpRowItems / kVec, kTpr, kSums>
            <<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(a, rows_per_block, drop);
      }
      return cudaGetLastError();
    });
  });
  if (err != cudaSuccess || (a.dgamma == nullptr && a.dbeta == nullptr && !sums)) return err;
  const unsigned kinds = sums ? 3 : 2;
  ColumnSumKernel<<<dim3(static_cast<unsigned>((a.d + 31) / 32), kinds), dim3(32, 32), 0, stream>>>(
      a.workspace, blocks, a.d, a.dgamma, a.dbeta, a.dx_sums);
  return cudaGetLastError();
}

template cudaError_t LaunchNormForward<float>(const NormForwardArgs<float>&, cudaStream_t);
template cudaError_t LaunchNormForward<__nv_bfloat16>(const NormForwardArgs<__nv_bfloat16>&, cudaStream_t);
template cudaError_t LaunchNormBackward<float>(const NormBackwardArgs<float>&, cudaStream_t);
template cudaError_t LaunchNormBackward<__nv_bfloat16>(const NormBackwardArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace onnxpipe::cuda
