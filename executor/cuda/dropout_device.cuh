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
// c0 + m is kept), exactly DropoutStream::Keep of each: one Philox block, or the two the counters
// straddle.
__device__ __forceinline__ uint32_t KeepBits4(const cpu::DropoutStream& s, uint64_t c0) {
  const uint64_t block = c0 >> 3;
  const int lane = static_cast<int>(c0 & 7);
  uint32_t bits = s.Kept8(s.Block(block));
  if (lane > 4) bits |= s.Kept8(s.Block(block + 1)) << 8;
  return (bits >> lane) & 0xFu;
}

// The same for the eight elements c0 .. c0 + 7: one block when c0 is a multiple of eight.
__device__ __forceinline__ uint32_t KeepBits8(const cpu::DropoutStream& s, uint64_t c0) {
  const uint64_t block = c0 >> 3;
  const int lane = static_cast<int>(c0 & 7);
  uint32_t bits = s.Kept8(s.Block(block));
  if (lane != 0) bits |= s.Kept8(s.Block(block + 1)) << 8;
  return (bits >> lane) & 0xFFu;
}

// Where a fused map's keep decisions come from. Bits8<kRuns>(i), i a multiple of 8 from the launch's
// first element: the decisions of elements i .. i + 7 (bit k: element i + k). Resolved() is called
// once per thread before them.
// Drawn from the stream (counter base + i); kRuns: base a multiple of eight, so that each group is
// one whole Philox block.
struct DrawnKeep {
  cpu::DropoutStream s;
  const uint64_t* device_offset;
  uint64_t base;
  __device__ __forceinline__ DrawnKeep Resolved() const { return DrawnKeep{WithOffset(s, device_offset), nullptr, base}; }
  template <bool kRuns>
  __device__ __forceinline__ uint32_t Bits8(int64_t i) const {
    const uint64_t c = base + static_cast<uint64_t>(i);
    if constexpr (kRuns) {
      return s.Kept8(s.Block(c >> 3));
    } else {
      return KeepBits8(s, c);
    }
  }
};
// Read from a forward's keep bits (op.h's KeepBits; `bits` at the launch's first element).
struct SavedKeep {
  const uint8_t* bits;
  __device__ __forceinline__ SavedKeep Resolved() const { return *this; }
  template <bool kRuns>
  __device__ __forceinline__ uint32_t Bits8(int64_t i) const {
    return bits[i >> 3];
  }
};

// Where a fused map writes its keep decisions, each optional: a byte per element (a Dropout's
// mask), a bit per element (op.h's KeepBits, the launch starting at a multiple of 8).
struct KeepOutputs {
  uint8_t* bytes = nullptr;
  uint8_t* bits = nullptr;
  KeepOutputs From(int64_t i) const {
    return {bytes == nullptr ? nullptr : bytes + i, bits == nullptr ? nullptr : bits + i / 8};
  }
};

// out[i] = f(keep_i, in[i]...) for i < n, keep_i from `keep`: an elementwise op with a dropout
// fused into it; the decisions also go to `keep_out`. Each thread takes eight consecutive elements.
// kRuns (n a multiple of eight, every byte mask and value pointer 16-byte aligned, and keep's own
// condition): 16-byte accesses per thread, nothing else in the loop (the draws cost more than the
// arithmetic, so the loop's instruction count decides the speed); otherwise element by element.
constexpr int kKeepRun = 8;
template <bool kRuns, typename Keep, typename F, typename Out, typename... In>
__global__ void MapWithKeepKernel(Keep keep_src, int64_t n, F f, KeepOutputs keep_out, Out* out, const In*... in) {
  const Keep src = keep_src.Resolved();
  const int64_t groups = (n + kKeepRun - 1) / kKeepRun;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < groups; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = t * kKeepRun;
    const uint32_t keep = src.template Bits8<kRuns>(i);
    if constexpr (kRuns) {
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
      if (keep_out.bytes != nullptr) StoreRun<kKeepRun>(keep_out.bytes, i, m);
      if (keep_out.bits != nullptr) keep_out.bits[i >> 3] = static_cast<uint8_t>(keep);
    } else {
      const int count = static_cast<int>(n - i < kKeepRun ? n - i : kKeepRun);
      for (int k = 0; k < count; ++k) {
        const bool kept = (keep >> k) & 1u;
        Store(out, i + k, f(kept, Load(in, i + k)...));
        if (keep_out.bytes != nullptr) keep_out.bytes[i + k] = kept;
      }
      if (keep_out.bits != nullptr) keep_out.bits[i >> 3] = static_cast<uint8_t>(keep & ((1u << count) - 1u));
    }
  }
}

// Launches MapWithKeepKernel over n elements: the whole runs of eight (when `runs` and the pointers
// allow), then the rest. make(i) is the keep source of a launch starting at element i.
template <typename MakeKeep, typename F, typename Out, typename... In>
cudaError_t LaunchKeepMap(bool runs, MakeKeep make, int64_t n, F f, cudaStream_t stream, KeepOutputs keep_out,
                          Out* out, const In*... in) {
  auto aligned = [](const void* q) { return q == nullptr || Aligned16(q); };
  int64_t done = 0;
  if (runs && aligned(keep_out.bytes) && aligned(out) && (aligned(in) && ...)) {
    done = n / kKeepRun * kKeepRun;
    if (done > 0) {
      MapWithKeepKernel<true><<<GridFor(done / kKeepRun), kThreads, 0, stream>>>(make(0), done, f, keep_out, out,
                                                                                in...);
    }
  }
  if (done < n) {
    const int64_t rest = n - done;
    MapWithKeepKernel<false><<<GridFor((rest + kKeepRun - 1) / kKeepRun), kThreads, 0, stream>>>(
        make(done), rest, f, keep_out.From(done), out + done, (in + done)...);
  }
  return cudaGetLastError();
}

// The map with the keep decisions drawn from the stream of `p` (active: training, ratio > 0; the
// caller runs the plain map otherwise). keep_out.bits needs n a multiple of 8.
template <typename F, typename Out, typename... In>
cudaError_t LaunchMapWithKeep(const DropoutParams& p, int64_t n, F f, cudaStream_t stream, KeepOutputs keep_out,
                              Out* out, const In*... in) {
  const cpu::DropoutStream s = cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
  auto make = [&](int64_t i) { return DrawnKeep{s, p.device_offset, p.counter_base + static_cast<uint64_t>(i)}; };
  return LaunchKeepMap(p.counter_base % cpu::DropoutStream::kPerBlock == 0, make, n, f, stream, keep_out, out, in...);
}

// The map with the keep decisions read from keep bits (n a multiple of 8).
template <typename F, typename Out, typename... In>
cudaError_t LaunchMapWithKeepBits(const uint8_t* bits, int64_t n, F f, cudaStream_t stream, Out* out,
                                  const In*... in) {
  auto make = [&](int64_t i) { return SavedKeep{bits + i / 8}; };
  return LaunchKeepMap(true, make, n, f, stream, KeepOutputs{}, out, in...);
}

}  // namespace onnxpipe::cuda
