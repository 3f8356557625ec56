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

// Keep decisions of a Philox block's four draws (bit w: draw w >= the threshold), compared in 32
// bits: a threshold of 2^32 keeps nothing.
__device__ __forceinline__ uint32_t KeptBits(const cpu::DropoutStream& s, const cpu::Philox4x32& r) {
  if (s.threshold > 0xFFFFFFFFull) return 0;
  const uint32_t t = static_cast<uint32_t>(s.threshold);
  return static_cast<uint32_t>(r.v[0] >= t) | static_cast<uint32_t>(r.v[1] >= t) << 1 |
         static_cast<uint32_t>(r.v[2] >= t) << 2 | static_cast<uint32_t>(r.v[3] >= t) << 3;
}

// Keep decisions of the four consecutive elements with counters c0 .. c0 + 3 (bit m set: element
// c0 + m is kept), exactly DropoutStream::Keep of each: one Philox block when c0 is a multiple of
// four, else the two blocks the counters straddle.
__device__ __forceinline__ uint32_t KeepBits4(const cpu::DropoutStream& s, uint64_t c0) {
  const uint64_t block = c0 >> 2;
  const int lane = static_cast<int>(c0 & 3);
  uint32_t bits = KeptBits(s, s.Block(block));
  if (lane != 0) bits |= KeptBits(s, s.Block(block + 1)) << 4;
  return (bits >> lane) & 0xFu;
}

// The same for the eight elements c0 .. c0 + 7.
__device__ __forceinline__ uint32_t KeepBits8(const cpu::DropoutStream& s, uint64_t c0) {
  return KeepBits4(s, c0) | KeepBits4(s, c0 + 4) << 4;
}

// out[i] = f(keep_i, in[i]...) for i < n, keep_i the dropout decision of element i (counter
// base + i) of stream `s`: an elementwise op with a dropout fused into it; keep_out (optional)
// receives keep_i as a byte. Each thread takes eight consecutive elements. kRuns (base a multiple
// of four, n of eight, every pointer 16-byte aligned): two whole Philox blocks and 16-byte
// accesses per thread, nothing else in the loop (the draws cost more than the arithmetic, so the
// loop's instruction count decides the speed); otherwise element by element.
constexpr int kKeepRun = 8;
template <bool kRuns, typename F, typename Out, typename... In>
__global__ void MapWithKeepKernel(cpu::DropoutStream s, const uint64_t* device_offset, uint64_t base, int64_t n, F f,
                                  uint8_t* keep_out, Out* out, const In*... in) {
  s = WithOffset(s, device_offset);
  const int64_t groups = (n + kKeepRun - 1) / kKeepRun;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < groups; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t * kKeepRun;
    if constexpr (kRuns) {
      const uint64_t block = (base + static_cast<uint64_t>(i)) >> 2;
      const uint32_t keep = KeptBits(s, s.Block(block)) | KeptBits(s, s.Block(block + 1)) << 4;
      const ::cuda::std::tuple<Run<In, kKeepRun>...> args{LoadRun<kKeepRun>(in, i)...};
      Run<Out, kKeepRun> r;
      Run<uint8_t, kKeepRun> m;
#pragma unroll
      for (int k = 0; k < kKeepRun; ++k) {
        const bool kept = (keep >> k) & 1u;
        m.v[k] = kept;
        r.v[k] = Convert<Out>(::cuda::std::apply([&](const auto&... a) { return f(kept, a[k]...); }, args));
      }
      StoreRun<kKeepRun>(out, i, r);
      if (keep_out != nullptr) StoreRun<kKeepRun>(keep_out, i, m);
    } else {
      const uint32_t keep = KeepBits8(s, base + static_cast<uint64_t>(i));
      for (int k = 0; k < kKeepRun && i + k < n; ++k) {
        const bool kept = (keep >> k) & 1u;
        Store(out, i + k, f(kept, Load(in, i + k)...));
        if (keep_out != nullptr) keep_out[i + k] = kept;
      }
    }
  }
}

// Launches MapWithKeepKernel with the stream of `p` (active: training, ratio > 0; the caller runs
// the plain map otherwise): the whole runs of eight, then the tail. keep_out may be null.
template <typename F, typename Out, typename... In>
cudaError_t LaunchMapWithKeep(const DropoutParams& p, int64_t n, F f, cudaStream_t stream, uint8_t* keep_out, Out* out,
                              const In*... in) {
  auto aligned = [](const void* q) { return q == nullptr || Aligned16(q); };
  const cpu::DropoutStream s = cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
  int64_t done = 0;
  if (p.counter_base % 4 == 0 && aligned(keep_out) && aligned(out) && (aligned(in) && ...)) {
    done = n / kKeepRun * kKeepRun;
    if (done > 0) {
      MapWithKeepKernel<true><<<GridFor(done / kKeepRun), kThreads, 0, stream>>>(s, p.device_offset, p.counter_base,
                                                                                 done, f, keep_out, out, in...);
    }
  }
  if (done < n) {
    const int64_t rest = n - done;
    MapWithKeepKernel<false><<<GridFor((rest + kKeepRun - 1) / kKeepRun), kThreads, 0, stream>>>(
        s, p.device_offset, p.counter_base + static_cast<uint64_t>(done), rest, f,
        keep_out == nullptr ? nullptr : keep_out + done, out + done, (in + done)...);
  }
  return cudaGetLastError();
}

}  // namespace onnxpipe::cuda
