// Device-side pieces of the CPU backend's dropout stream (executor/cpu/philox.h) shared by the
// kernels that drop elements on the GPU: the Dropout family (dropout.cu) and the fused attention
// (flash_attention_*.cu). .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cpu/philox.h"
#include "executor/cuda/dropout.h"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {

// The stream with its step offset read from device memory when one is given (CUDA graphs update
// that value before each replay).
__device__ __forceinline__ cpu::DropoutStream WithOffset(cpu::DropoutStream s, const uint64_t* device_offset) {
  if (device_offset != nullptr) {
    const uint64_t offset = *device_offset;
    s.off_lo = static_cast<uint32_t>(offset);
    s.off_hi = static_cast<uint32_t>(offset >> 32);
  }
  return s;
}

// Keep decisions of the four consecutive elements with counters c0 .. c0 + 3 (bit m set: element
// c0 + m is kept), exactly DropoutStream::Keep of each: one Philox block when c0 is a multiple of
// four, else the two blocks the counters straddle.
__device__ __forceinline__ uint32_t KeepBits4(const cpu::DropoutStream& s, uint64_t c0) {
  const uint64_t block = c0 >> 2;
  const int lane = static_cast<int>(c0 & 3);
  const cpu::Philox4x32 r0 = s.Block(block);
  uint32_t bits = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) bits |= static_cast<uint32_t>(r0.v[w] >= s.threshold) << w;
  if (lane != 0) {
    const cpu::Philox4x32 r1 = s.Block(block + 1);
#pragma unroll
    for (int w = 0; w < 4; ++w) bits |= static_cast<uint32_t>(r1.v[w] >= s.threshold) << (w + 4);
  }
  return (bits >> lane) & 0xFu;
}

// Whether `p` drops anything: training with a ratio over 0.
inline bool DropoutActive(const DropoutParams& p) { return p.training && p.ratio > 0.0; }
// The CPU backend's scale of a kept element, 1 / (1 - ratio) (0 when everything drops).
inline double KeepScale(const DropoutParams& p) { return p.ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - p.ratio); }

// out[i] = f(keep_i, in[i]...) for i < n, keep_i the dropout decision of element i (counter
// base + i) of stream `s`: an elementwise op with a dropout fused into it. Each thread takes four
// consecutive elements, one Philox block when base is a multiple of four, moved in single accesses
// when `runs` (every pointer aligned for four elements).
template <typename F, typename Out, typename... In>
__global__ void MapWithKeepKernel(cpu::DropoutStream s, const uint64_t* device_offset, uint64_t base, bool runs,
                                  int64_t n, F f, Out* out, const In*... in) {
  s = WithOffset(s, device_offset);
  const int64_t groups = (n + 3) / 4;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < groups; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t * 4;
    const uint32_t keep = KeepBits4(s, base + static_cast<uint64_t>(i));
    if (runs && i + 4 <= n) {
      const ::cuda::std::tuple<Run<In, 4>...> args{LoadRun<4>(in, i)...};
      Run<Out, 4> r;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool kept = (keep >> k) & 1u;
        r.v[k] = Convert<Out>(::cuda::std::apply([&](const auto&... a) { return f(kept, a[k]...); }, args));
      }
      StoreRun<4>(out, i, r);
    } else {
      for (int k = 0; k < 4 && i + k < n; ++k) Store(out, i + k, f(((keep >> k) & 1u) != 0, Load(in, i + k)...));
    }
  }
}

// Launches MapWithKeepKernel with the stream of `p` (active: training, ratio > 0; the caller runs
// the plain map otherwise).
template <typename F, typename Out, typename... In>
cudaError_t LaunchMapWithKeep(const DropoutParams& p, int64_t n, F f, cudaStream_t stream, Out* out, const In*... in) {
  if (n == 0) return cudaSuccess;
  auto aligned = [](const auto* q) { return reinterpret_cast<uintptr_t>(q) % (4 * sizeof(*q)) == 0; };
  const bool runs = aligned(out) && (aligned(in) && ...);
  const cpu::DropoutStream s = cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
  MapWithKeepKernel<<<GridFor((n + 3) / 4), kThreads, 0, stream>>>(s, p.device_offset, p.counter_base, runs, n, f, out,
                                                                   in...);
  return cudaGetLastError();
}

}  // namespace onnxpipe::cuda
