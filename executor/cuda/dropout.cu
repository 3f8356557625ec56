// Dropout kernels: one thread per Philox block of four counters, so each 128-bit draw is made once
// and used for the (up to) four elements whose counters it covers, as the CPU backend does.
#include "executor/cpu/philox.h"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/dropout.h"
#include "executor/cuda/dropout_device.cuh"

namespace onnxpipe::cuda {
namespace {

// Active dropout: the CPU backend's scale, 1 / (1 - ratio) (0 when everything drops), rounded to the
// element type's compute precision in the kernels.
double KeepScale(const DropoutParams& p) { return p.ratio >= 1.0 ? 0.0 : 1.0 / (1.0 - p.ratio); }

// y = keep ? x * scale : 0 in the type the CPU backend scales in (Compute<T>: fp64 for fp64).
template <typename T>
__device__ __forceinline__ void StoreScaled(T* out, int64_t i, bool keep, const T* in, double scale) {
  using C = Compute<T>;
  Store(out, i, keep ? static_cast<C>(Load(in, i)) * static_cast<C>(scale) : C(0));
}
bool Active(const DropoutParams& p) { return p.training && p.ratio > 0.0; }

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

template <typename T>
__global__ void DropoutForwardKernel(cpu::DropoutStream s, const uint64_t* device_offset, uint64_t base,
                                     BlockRange range, double scale, const T* __restrict__ x, T* __restrict__ y,
                                     uint8_t* __restrict__ mask, int64_t n) {
  s = WithOffset(s, device_offset);
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < range.count;
       t += int64_t{gridDim.x} * blockDim.x) {
    ForBlockElements(s, base, n, range.first_block + t, [&](int64_t i, bool keep) {
      StoreScaled(y, i, keep, x, scale);
      if (mask != nullptr) mask[i] = keep;
    });
  }
}

template <typename T>
__global__ void DropoutBackwardStreamKernel(cpu::DropoutStream s, const uint64_t* device_offset, uint64_t base,
                                            BlockRange range, double scale, const T* __restrict__ dy, T* __restrict__ dx,
                                            int64_t n) {
  s = WithOffset(s, device_offset);
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < range.count;
       t += int64_t{gridDim.x} * blockDim.x) {
    ForBlockElements(s, base, n, range.first_block + t,
                     [&](int64_t i, bool keep) { StoreScaled(dx, i, keep, dy, scale); });
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

cpu::DropoutStream StreamOf(const DropoutParams& p) {
  return cpu::DropoutStream::Make(p.seed, p.node_key, p.offset, p.ratio);
}

}  // namespace

cudaError_t LaunchDropoutForward(const DropoutParams& p, ir::DType dtype, const void* x, void* y, uint8_t* mask,
                                 int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (!Active(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(px, nullptr, 1.0, py, mask, n);
    } else {
      const BlockRange range = BlocksFor(p.counter_base, n);
      DropoutForwardKernel<T><<<GridFor(range.count), kThreads, 0, stream>>>(
          StreamOf(p), p.device_offset, p.counter_base, range, KeepScale(p), px, py, mask, n);
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
    const double scale = Active(p) ? KeepScale(p) : 1.0;
    if (mask != nullptr || !Active(p)) {
      MaskedScaleKernel<T><<<GridFor(n), kThreads, 0, stream>>>(pdy, mask, scale, pdx, nullptr, n);
    } else {
      const BlockRange range = BlocksFor(p.counter_base, n);
      DropoutBackwardStreamKernel<T><<<GridFor(range.count), kThreads, 0, stream>>>(
          StreamOf(p), p.device_offset, p.counter_base, range, scale, pdy, pdx, n);
    }
    return cudaGetLastError();
  });
}

}  // namespace onnxpipe::cuda
