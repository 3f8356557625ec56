// Device-side pieces of the CPU backend's dropout stream (executor/cpu/philox.h) shared by the
// kernels that drop elements on the GPU: the Dropout family (dropout.cu) and the fused attention
// (flash_attention_*.cu). .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "executor/cpu/philox.h"

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

}  // namespace onnxpipe::cuda
