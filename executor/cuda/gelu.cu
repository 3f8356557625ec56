// GELU kernels: dense maps (map.cuh) over a flat (n) buffer, computing in fp32.
#include "executor/cuda/activation.cuh"
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/dropout_device.cuh"
#include "executor/cuda/gelu.h"
#include "executor/cuda/map.cuh"

namespace onnxpipe::cuda {
namespace {

// The functors take the form as a template argument: one kernel per form, no per-element branch.
template <bool kTanh>
struct GeluFn {
  __device__ __forceinline__ float operator()(float x) const { return GeluValue(x, kTanh); }
};

template <bool kTanh>
struct GeluGradFn {
  __device__ __forceinline__ float operator()(float dy, float x) const { return dy * GeluDerivative(x, kTanh); }
};

// With the fused dropout: kept elements scaled (forward: the result; backward: dy), the others 0.
template <bool kTanh>
struct GeluDropFn {
  float scale;
  __device__ __forceinline__ float operator()(bool keep, float x) const {
    return keep ? GeluValue(x, kTanh) * scale : 0.f;
  }
};

template <bool kTanh>
struct GeluGradDropFn {
  float scale;
  __device__ __forceinline__ float operator()(bool keep, float dy, float x) const {
    return (keep ? dy * scale : 0.f) * GeluDerivative(x, kTanh);
  }
};

// No dropout: every element kept (GeluGradDropFn with scale 1 is GeluGradFn to the bit).
struct AllKept {
  __device__ __forceinline__ AllKept Resolved() const { return *this; }
};

// The keep decisions of elements i .. i + 7 (bit k: element i + k).
__device__ __forceinline__ uint32_t KeepAt(const AllKept&, int64_t) { return 0xFFu; }
__device__ __forceinline__ uint32_t KeepAt(const SavedKeep& k, int64_t i) {
  return static_cast<uint32_t>(k.bits[i >> 3]) >> (i & 7);  // V <= 8 - i % 8: within one byte
}
__device__ __forceinline__ uint32_t KeepAt(const DrawnKeep& k, int64_t i) { return k.Bits8<false>(i); }

constexpr int kSumsThreads = 128;
constexpr int64_t kSumsTargetThreads = int64_t{1} << 18;  // threads of all parts, for the memory system
constexpr int64_t kSumsMaxParts = 1024;

// Thread (chunk, part): columns chunk * V .. + V - 1 over the part's rows; dx stored, its values as
// stored summed in fp32 into partial[part, column].
template <typename T, int V, typename Keep, typename F>
__global__ void __launch_bounds__(kSumsThreads)
    MapColumnSumsKernel(Keep keep_src, int64_t rows, int64_t cols, int64_t rows_per_part, F f, T* __restrict__ out,
                        const T* __restrict__ dy, const T* __restrict__ x, float* __restrict__ partial) {
  const int64_t c0 = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * V;
  if (c0 >= cols) return;
  const Keep keep = keep_src.Resolved();
  const int64_t r0 = blockIdx.y * rows_per_part, r1 = r0 + rows_per_part < rows ? r0 + rows_per_part : rows;
  float acc[V] = {};
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r * cols + c0;
    const Run<T, V> a = LoadRun<V>(dy, i), b = LoadRun<V>(x, i);
    const uint32_t bits = KeepAt(keep, i);
    Run<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      o.v[k] = Convert<T>(f((bits >> k) & 1u, a[k], b[k]));
      acc[k] += static_cast<float>(o[k]);
    }
    StoreRun<V>(out, i, o);
  }
#pragma unroll
  for (int k = 0; k < V; ++k) partial[blockIdx.y * cols + c0 + k] = acc[k];
}

// f(integral_constant<bool, tanh_approx>).
template <typename F>
cudaError_t WithForm(bool tanh_approx, F&& f) {
  return tanh_approx ? f(std::true_type{}) : f(std::false_type{});
}

bool Active(const DropoutParams* p) { return p != nullptr && DropoutActive(*p); }

}  // namespace

template <typename T>
cudaError_t LaunchGeluForward(const T* x, T* y, int64_t n, bool tanh_approx, const DropoutParams* dropout,
                              uint8_t* keep_bits, cudaStream_t stream) {
  return WithForm(tanh_approx, [&](auto form) {
    constexpr bool kTanh = decltype(form)::value;
    if (!Active(dropout)) {
      if (keep_bits != nullptr) {
        const cudaError_t e = cudaMemsetAsync(keep_bits, 0xFF, n / 8, stream);
        if (e != cudaSuccess) return e;
      }
      return LaunchMap(n, GeluFn<kTanh>{}, stream, y, x);
    }
    const float scale = static_cast<float>(KeepScale(*dropout));
    return LaunchMapWithKeep(*dropout, n, GeluDropFn<kTanh>{scale}, stream, KeepOutputs{nullptr, keep_bits}, y, x);
  });
}

template <typename T>
cudaError_t LaunchGeluBackward(const T* dy, const T* x, T* dx, int64_t n, bool tanh_approx,
                               const DropoutParams* dropout, const uint8_t* keep_bits, cudaStream_t stream) {
  return WithForm(tanh_approx, [&](auto form) {
    constexpr bool kTanh = decltype(form)::value;
    if (!Active(dropout)) return LaunchMap(n, GeluGradFn<kTanh>{}, stream, dx, dy, x);
    const GeluGradDropFn<kTanh> f{static_cast<float>(KeepScale(*dropout))};
    if (keep_bits != nullptr) return LaunchMapWithKeepBits(keep_bits, n, f, stream, dx, dy, x);
    return LaunchMapWithKeep(*dropout, n, f, stream, KeepOutputs{}, dx, dy, x);
  });
}

int64_t GeluSumsParts(int64_t rows, int64_t cols) {
  const int64_t chunks = (cols + 7) / 8;  // shape only, whatever VEC is
  int64_t parts = kSumsTargetThreads / (chunks > 0 ? chunks : 1);
  parts = parts < 1 ? 1 : parts > kSumsMaxParts ? kSumsMaxParts : parts;
  if (parts > rows) parts = rows > 0 ? rows : 1;
  const int64_t per = (rows + parts - 1) / parts;
  return per > 0 ? (rows + per - 1) / per : 1;
}

int64_t GeluSumsWorkspaceBytes(int64_t rows, int64_t cols) {
  return GeluSumsParts(rows, cols) * cols * static_cast<int64_t>(sizeof(float));
}

template <typename T>
cudaError_t LaunchGeluBackwardPartialSums(const T* dy, const T* x, T* dx, int64_t rows, int64_t cols, bool tanh_approx,
                                          const DropoutParams* dropout, const uint8_t* keep_bits, float* partial,
                                          bool* launched, cudaStream_t stream) {
  constexpr int V = static_cast<int>(16 / sizeof(T));
  *launched = false;
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (cols % V != 0 || !Aligned16(dy) || !Aligned16(x) || !Aligned16(dx) || (keep_bits != nullptr && cols % 8 != 0)) {
    return cudaSuccess;
  }
  const int64_t parts = GeluSumsParts(rows, cols), per = (rows + parts - 1) / parts;
  const dim3 grid(static_cast<unsigned>((cols / V + kSumsThreads - 1) / kSumsThreads), static_cast<unsigned>(parts));
  *launched = true;
  return WithForm(tanh_approx, [&](auto form) {
    constexpr bool kTanh = decltype(form)::value;
    const bool active = Active(dropout);
    const GeluGradDropFn<kTanh> f{active ? static_cast<float>(KeepScale(*dropout)) : 1.f};
    auto launch = [&](auto keep) {
      MapColumnSumsKernel<T, V><<<grid, kSumsThreads, 0, stream>>>(keep, rows, cols, per, f, dx, dy, x, partial);
      return cudaGetLastError();
    };
    if (!active) return launch(AllKept{});
    if (keep_bits != nullptr) return launch(SavedKeep{keep_bits});
    const cpu::DropoutStream st =
        cpu::DropoutStream::Make(dropout->seed, dropout->node_key, dropout->offset, dropout->ratio);
    return launch(DrawnKeep{st, dropout->device_offset, dropout->counter_base});
  });
}

template cudaError_t LaunchGeluBackwardPartialSums<float>(const float*, const float*, float*, int64_t, int64_t, bool,
                                                          const DropoutParams*, const uint8_t*, float*, bool*,
                                                          cudaStream_t);
template cudaError_t LaunchGeluBackwardPartialSums<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*,
                                                                  __nv_bfloat16*, int64_t, int64_t, bool,
                                                                  const DropoutParams*, const uint8_t*, float*, bool*,
                                                                  cudaStream_t);
template cudaError_t LaunchGeluForward<float>(const float*, float*, int64_t, bool, const DropoutParams*, uint8_t*,
                                              cudaStream_t);
template cudaError_t LaunchGeluForward<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, int64_t, bool,
                                                      const DropoutParams*, uint8_t*, cudaStream_t);
template cudaError_t LaunchGeluBackward<float>(const float*, const float*, float*, int64_t, bool, const DropoutParams*,
                                               const uint8_t*, cudaStream_t);
template cudaError_t LaunchGeluBackward<__nv_bfloat16>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*,
                                                       int64_t, bool, const DropoutParams*, const uint8_t*,
                                                       cudaStream_t);

}  // namespace onnxpipe::cuda
