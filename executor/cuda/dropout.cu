// Dropout kernels: one thread per Philox block of four counters, so each 128-bit draw is made once
// and used for the (up to) four elements whose counters it covers, as the CPU backend does.
#include "executor/cpu/philox.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/dropout.h"
#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

// y = keep ? x * scale : 0 in the type the CPU backend scales in (Compute<T>: fp64 for fp64).
template <typename T>
__device__ __forceinline__ void StoreScaled(T* out, int64_t i, bool keep, const T* in, double scale) {
  using C = Compute<T>;
  Store(out, i, keep ? static_cast<C>(Load(in, i)) * static_cast<C>(scale) : C(0));
}

// Grid over the Philox blocks covering counters [base, base + n).
struct BlockRange {
  uint64_t first_block;
  int64_t count;
};
BlockRange BlocksFor(uint64_t base, int64_t n) {
  const uint64_t first = base >> 2, last = (base + static_cast<uint64_t>(n) - 1) >> 2;
  return {first, static_cast<int64_t>(last - first + 1)};
}

// Calls f(i, keep) for every element i in [0, n) whose counter lies in Philox block t of the range.
template <typename F>
__device__ __forceinline__ void ForBlockElements(const cpu::DropoutStream& s, uint64_t base, int64_t n, uint64_t block,
                                                 F&& f) {
  const cpu::Philox4x32 r = s.Block(block);
  for (int lane = 0; lane < 4; ++lane) {
    const uint64_t c = block * 4 + lane;
    if (c < base || c - base >= static_cast<uint64_t>(n)) continue;
    f(static_cast<int64_t>(c - base), r.v[lane] >= s.threshold);
  }
}

// out = keep ? in * scale : 0 over the elements of Philox block `block`: as four-element runs
// (one access each for in, out and the mask) when `runs` (base a multiple of four, pointers aligned
// for it) and the block lies inside [base, base + n), else element by element.
template <typename T>
__device__ __forceinline__ void DropBlock(const cpu::DropoutStream& s, uint64_t base, int64_t n, uint64_t block,
                                          bool runs, double scale, const T* in, T* out, uint8_t* mask) {
  const uint64_t c0 = block * 4;
  if (runs && c0 >= base && c0 - base + 4 <= static_cast<uint64_t>(n)) {
    const int64_t i = static_cast<int64_t>(c0 - base);
    const cpu::Philox4x32 r = s.Block(block);
    const Run<T, 4> x = LoadRun<4>(in, i);
    Run<T, 4> y;
    Run<uint8_t, 4> m;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      m.v[k] = r.v[k] >= s.threshold;
      y.v[k] = Convert<T>(m.v[k] ? x[k] * static_cast<Compute<T>>(scale) : Compute<T>(0));
    }
    StoreRun<4>(out, i, y);
    if (mask != nullptr) StoreRun<4>(mask, i, m);
    return;
  }
  ForBlockElements(s, base, n, block, [&](int64_t i, bool keep) {
    StoreScaled(out, i, keep, in, scale);
    if (mask != nullptr) mask[i] = keep;
  });
}

template <typename T>
__global__ void DropoutStreamKernel(cpu::DropoutStream s, const uint64_t* device_offset, uint64_t base,
                                    BlockRange range, bool runs, double scale, const T* __restrict__ in,
                                    T* __restrict__ out, uint8_t* __restrict__ mask, int64_t n) {
  s = WithOffset(s, device_offset);
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < range.count;
       t += int64_t{gridDim.x} * blockDim.x) {
    DropBlock(s, base, n, range.first_block + t, runs, scale, in, out, mask);
  }
}

// Inactive forward: y = x (a copy unless in place), mask = 1. Backward with a mask:
// dx = mask ? dy * scale : 0 (scale 1 when inactive).
template <typename T>
__global__ void MaskedScaleKernel(const T* __restrict__ in, const uint8_t* __restrict__ mask, double scale,
                                  T* __restrict__ out, uint8_t* __restrict__ mask_out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const bool keep = mask == nullptr || mask[i];
    StoreScaled(out, i, keep, in, scale);
    if (mask_out != nullptr) mask_out[i] = 1;
  }
}

// keep ? x * scale : 0 (the backward from a saved mask), scaled as StoreScaled.
struct MaskedScaleFn {
  double scale;
  template <typename C>
  __device__ __forceinline__ C operator()(C x, uint8_t keep) const {
    return keep ? x * static_cast<C>(scale) : C(0);
  }
};

cpu::DropoutStream StreamOf(const DropoutParams& p) {
  return cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
}

// out (and mask) from the stream of `p` over counters [p.counter_base, + n).
template <typename T>
void LaunchStream(const DropoutParams& p, double scale, const T* in, T* out, uint8_t* mask, int64_t n,
                  cudaStream_t stream) {
  const BlockRange range = BlocksFor(p.counter_base, n);
  auto aligned = [](const void* q, size_t bytes) {
    return q == nullptr || reinterpret_cast<uintptr_t>(q) % bytes == 0;
  };
  const bool runs =
      p.counter_base % 4 == 0 && aligned(in, 4 * sizeof(T)) && aligned(out, 4 * sizeof(T)) && aligned(mask, 4);
  DropoutStreamKernel<T><<<GridFor(range.count), kThreads, 0, stream>>>(StreamOf(p), p.device_offset, p.counter_base,
                                                                        range, runs, scale, in, out, mask, n);
}

}  // namespace

cudaError_t LaunchDropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask,
                                 int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (!DropoutActive(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(px, nullptr, 1.0, py, mask, n);
    } else {
      LaunchStream<T>(p, KeepScale(p), px, py, mask, n, stream);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchDropoutBackward(const DropoutParams& p, ir::DType dtype, const void* dy, const uint8_t* mask,
                                  void* dx, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const T* pdy = static_cast<const T*>(dy);
    T* pdx = static_cast<T*>(dx);
    const double scale = DropoutActive(p) ? KeepScale(p) : 1.0;
    if (mask != nullptr) {
      return LaunchMap(n, MaskedScaleFn{scale}, stream, pdx, pdy, mask);
    } else if (!DropoutActive(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(pdy, nullptr, scale, pdx, nullptr, n);
    } else {
      LaunchStream<T>(p, scale, pdy, pdx, nullptr, n, stream);
    }
    return cudaGetLastError();
  });
}

}  // namespace onnxpipe::cuda
