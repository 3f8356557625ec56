// The gradient of an attention's additive mask (a learned bias, T5's relative positions): dMask = dS
// summed over the dims where the mask broadcasts, with dS_ij = P_ij (dP_ij - D_i), P the softmax of the
// scaled, masked scores, dP_ij = dO_i . V_j kept and scaled by the forward's dropout (the CPU's stream, as
// the flash kernels draw it) and D_i = sum_j P_ij dP_ij (= dO_i . O_i). One warp per query row, three
// passes over its keys (the row's maximum and sum, D_i, dS); dot products and sums in fp32; dS added
// atomically into an fp32 buffer laid out as the mask.
#include <cuda_bf16.h>

#include "executor/cuda/device_util.cuh"
#include "executor/cuda/flash_attention.cuh"
#include "executor/cuda/row_kernels.cuh"

namespace onnxpipe::cuda {
namespace {

constexpr int kRowWarps = 4;

__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <typename T>
__global__ void __launch_bounds__(32 * kRowWarps)
    MaskGradKernel(FlashGeometry g, const T* d_o, const T* q, const T* k, const T* v, const T* mask, float* dmask) {
  extern __shared__ float row_data[];  // per warp: Q_i (dh floats), then dO_i (dv floats)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = blockIdx.x * int64_t{kRowWarps} + warp;
  if (row >= g.nbatch * g.sq) return;  // the whole warp
  const int64_t b = row / g.sq, i = row % g.sq;
  float* qi = row_data + warp * (g.dh + g.dv);
  float* doi = qi + g.dh;
  const flash::BatchOffsets off = flash::OffsetsOf(g, b);
  for (int64_t c = lane; c < g.dh; c += 32) qi[c] = rows::ToFloat(q[off.q + i * g.q_ld + c]);
  for (int64_t c = lane; c < g.dv; c += 32) doi[c] = rows::ToFloat(d_o[flash::OffsetOf(g, g.o_stride, b) + i * g.o_ld + c]);
  __syncwarp();
  const float scale = static_cast<float>(g.scale), drop_scale = static_cast<float>(g.drop_scale);
  const cpu::DropoutStream stream = g.dropout ? WithOffset(g.stream, g.device_offset) : g.stream;
  const uint64_t counter = g.counter_base + static_cast<uint64_t>(row) * static_cast<uint64_t>(g.sk);
  auto score = [&](int64_t j) {
    const T* kj = k + off.k + j * g.k_ld;
    float s = 0.f;
    for (int64_t c = 0; c < g.dh; ++c) s = fmaf(qi[c], rows::ToFloat(kj[c]), s);
    return flash::MaskedScore<float, T>(g, mask, off.mask, i, j, s * scale);
  };
  auto dprob = [&](int64_t j) {
    if (g.dropout && !stream.Keep(counter + static_cast<uint64_t>(j))) return 0.f;
    const T* vj = v + off.v + j * g.v_ld;
    float s = 0.f;
    for (int64_t c = 0; c < g.dv; ++c) s = fmaf(doi[c], rows::ToFloat(vj[c]), s);
    return g.dropout ? s * drop_scale : s;
  };
  // The row's maximum, then its sum of exponentials.
  float m = -INFINITY;
  for (int64_t j = lane; j < g.sk; j += 32) m = fmaxf(m, score(j));
  m = WarpMax(m);
  if (m == -INFINITY) return;  // every key masked: no gradient (the buffer holds zeros)
  float l = 0.f;
  for (int64_t j = lane; j < g.sk; j += 32) l += expf(score(j) - m);
  const float inv_l = 1.f / WarpSum(l);
  float d = 0.f;
  for (int64_t j = lane; j < g.sk; j += 32) {
    const float p = expf(score(j) - m) * inv_l;
    if (p != 0.f) d += p * dprob(j);
  }
  d = WarpSum(d);
  for (int64_t j = lane; j < g.sk; j += 32) {
    const float p = expf(score(j) - m) * inv_l;
    if (p != 0.f) atomicAdd(dmask + off.mask + i * g.mask_row_stride + j * g.mask_col_stride, p * (dprob(j) - d));
  }
}

}  // namespace

cudaError_t LaunchAttentionMaskGradient(ir::DType dtype, const FlashGeometry& g, const void* d_o, const void* q,
                                        const void* k, const void* v, const void* mask, float* dmask,
                                        cudaStream_t stream) {
  if (g.mask != FlashMask::kAdditive) return cudaErrorInvalidValue;
  const int64_t n_rows = g.nbatch * g.sq;
  if (n_rows == 0 || g.sk == 0) return cudaSuccess;
  const int64_t blocks = (n_rows + kRowWarps - 1) / kRowWarps;
  const size_t smem = sizeof(float) * kRowWarps * static_cast<size_t>(g.dh + g.dv);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    MaskGradKernel<T><<<blocks, 32 * kRowWarps, smem, stream>>>(
        g, static_cast<const T*>(d_o), static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<const T*>(mask), dmask);
    return cudaGetLastError();
  };
  if (dtype == ir::DType::kF32) return launch(float{});
  if (dtype == ir::DType::kBF16) return launch(__nv_bfloat16{});
  return cudaErrorInvalidValue;
}

}  // namespace onnxpipe::cuda
