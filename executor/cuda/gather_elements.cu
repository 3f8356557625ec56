// GatherElements forward (a thread per index: raw elements, any dtype) and backward (a thread per
// element of dX walking the indices along the axis in order); GatherND forward (a thread per output
// element) and backward (a thread per batch and slice column walking the tuples in order). No
// atomics: the sums are repeatable.
#include "executor/cuda/device_util.cuh"
#include "executor/cuda/gather_elements.h"

namespace onnxpipe::cuda {
namespace {

template <typename I>
__device__ __forceinline__ int64_t IndexAt(const I* idx, int64_t i) {
  return static_cast<int64_t>(idx[i]);
}

// Raw element of `bytes` bytes.
template <int kBytes>
struct RawOf;
template <>
struct RawOf<1> {
  using type = uint8_t;
};
template <>
struct RawOf<2> {
  using type = uint16_t;
};
template <>
struct RawOf<4> {
  using type = uint32_t;
};
template <>
struct RawOf<8> {
  using type = uint64_t;
};

template <typename U, typename I>
__global__ void GatherElementsKernel(GatherElementsShape s, const U* __restrict__ data, const I* __restrict__ idx,
                                     U* __restrict__ out, uint32_t* flag) {
  const int64_t n = s.data_dims[s.axis];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < s.num_idx;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t v = IndexAt(idx, i);
    if (v < -n || v >= n) {
      *flag = 1;
      continue;
    }
    if (v < 0) v += n;
    int64_t rest = i, off = 0, stride = 1;
#pragma unroll
    for (int d = kMaxGatherRank - 1; d >= 0; --d) {
      if (d < s.rank) {
        const int64_t q = rest / s.idx_dims[d];
        const int64_t c = rest - q * s.idx_dims[d];
        off += (d == s.axis ? v : c) * stride;
        stride *= s.data_dims[d];
        rest = q;
      }
    }
    out[i] = data[off];
  }
}

template <typename T, typename I>
__global__ void GatherElementsGradKernel(GatherElementsShape s, const T* __restrict__ dy, const I* __restrict__ idx,
                                         T* __restrict__ dx, uint32_t* flag) {
  const int64_t n = s.data_dims[s.axis], k = s.idx_dims[s.axis];
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < s.num_data;
       o += int64_t{gridDim.x} * blockDim.x) {
    // o's coordinates; the indices' offset of (coords with the axis at 0) and the axis' stride there.
    int64_t rest = o, base = 0, stride = 1, axis_stride = 1, target = 0;
    bool inside = true;
#pragma unroll
    for (int d = kMaxGatherRank - 1; d >= 0; --d) {
      if (d < s.rank) {
        const int64_t q = rest / s.data_dims[d];
        const int64_t c = rest - q * s.data_dims[d];
        if (d == s.axis) {
          target = c;
          axis_stride = stride;
        } else {
          inside = inside && c < s.idx_dims[d];
          base += c * stride;
        }
        stride *= s.idx_dims[d];
        rest = q;
      }
    }
    T acc = Convert<T>(0.0f);
    if (inside) {
      for (int64_t j = 0; j < k; ++j) {
        int64_t v = IndexAt(idx, base + j * axis_stride);
        if (v < -n || v >= n) {
          *flag = 1;
          continue;
        }
        if (v < 0) v += n;
        if (v == target) acc = Convert<T>(Load(&acc, 0) + Load(dy, base + j * axis_stride));
      }
    }
    dx[o] = acc;
  }
}

// Offset in data of tuple t (its batch's base included); -1 with the flag raised when out of range.
template <typename I>
__device__ __forceinline__ int64_t TupleOffset(const GatherNDShape& s, const I* idx, int64_t t, uint32_t* flag) {
  int64_t off = (t / s.tuples) * s.batch_stride;
  for (int j = 0; j < s.k; ++j) {
    int64_t v = IndexAt(idx, t * s.k + j);
    if (v < -s.extents[j] || v >= s.extents[j]) {
      *flag = 1;
      return -1;
    }
    if (v < 0) v += s.extents[j];
    off += v * s.strides[j];
  }
  return off;
}

template <typename U, typename I>
__global__ void GatherNDKernel(GatherNDShape s, const U* __restrict__ data, const I* __restrict__ idx,
                               U* __restrict__ out, uint32_t* flag) {
  const int64_t n = s.batches * s.tuples * s.slice;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / s.slice, c = e - t * s.slice;
    const int64_t off = TupleOffset(s, idx, t, flag);
    if (off >= 0) out[e] = data[off + c];
  }
}

// dx zeroed; thread (batch, c) adds dy[t, c] for the batch's tuples t in order.
template <typename T, typename I>
__global__ void GatherNDGradKernel(GatherNDShape s, const T* __restrict__ dy, const I* __restrict__ idx,
                                   T* __restrict__ dx, uint32_t* flag) {
  const int64_t n = s.batches * s.slice;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < n; w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t batch = w / s.slice, c = w - batch * s.slice;
    for (int64_t t = batch * s.tuples; t < (batch + 1) * s.tuples; ++t) {
      const int64_t off = TupleOffset(s, idx, t, flag);
      if (off < 0) continue;
      dx[off + c] = Convert<T>(Load(dx, off + c) + Load(dy, t * s.slice + c));
    }
  }
}

template <typename F>
cudaError_t DispatchIndex(ir::DType t, F&& f) {
  if (t == ir::DType::kI64) return f(TypeTag<int64_t>{});
  if (t == ir::DType::kI32) return f(TypeTag<int32_t>{});
  return cudaErrorInvalidValue;
}

template <int kBytes>
cudaError_t LaunchRaw(const GatherElementsShape& s, const void* data, ir::DType idx_dtype, const void* indices,
                      void* out, uint32_t* flag, cudaStream_t stream) {
  using U = typename RawOf<kBytes>::type;
  return DispatchIndex(idx_dtype, [&](auto itag) -> cudaError_t {
    using I = typename decltype(itag)::type;
    GatherElementsKernel<U, I><<<GridFor(s.num_idx), kThreads, 0, stream>>>(
        s, static_cast<const U*>(data), static_cast<const I*>(indices), static_cast<U*>(out), flag);
    return cudaGetLastError();
  });
}

template <int kBytes>
cudaError_t LaunchRawND(const GatherNDShape& s, const void* data, ir::DType idx_dtype, const void* indices, void* out,
                        uint32_t* flag, cudaStream_t stream) {
  using U = typename RawOf<kBytes>::type;
  return DispatchIndex(idx_dtype, [&](auto itag) -> cudaError_t {
    using I = typename decltype(itag)::type;
    GatherNDKernel<U, I><<<GridFor(s.batches * s.tuples * s.slice), kThreads, 0, stream>>>(
        s, static_cast<const U*>(data), static_cast<const I*>(indices), static_cast<U*>(out), flag);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t LaunchGatherND(const GatherNDShape& s, int elem_bytes, const void* data, ir::DType idx_dtype,
                           const void* indices, void* out, uint32_t* flag, cudaStream_t stream) {
  if (s.batches * s.tuples * s.slice == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1:
      return LaunchRawND<1>(s, data, idx_dtype, indices, out, flag, stream);
    case 2:
      return LaunchRawND<2>(s, data, idx_dtype, indices, out, flag, stream);
    case 4:
      return LaunchRawND<4>(s, data, idx_dtype, indices, out, flag, stream);
    case 8:
      return LaunchRawND<8>(s, data, idx_dtype, indices, out, flag, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGatherNDGrad(const GatherNDShape& s, int64_t num_data, ir::DType dtype, const void* dy,
                               ir::DType idx_dtype, const void* indices, void* dx, uint32_t* flag,
                               cudaStream_t stream) {
  if (num_data == 0) return cudaSuccess;
  const cudaError_t zero = cudaMemsetAsync(dx, 0, num_data * ir::DTypeSize(dtype), stream);
  if (zero != cudaSuccess || s.batches * s.tuples * s.slice == 0) return zero;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return DispatchIndex(idx_dtype, [&](auto itag) -> cudaError_t {
      using I = typename decltype(itag)::type;
      GatherNDGradKernel<T, I><<<GridFor(s.batches * s.slice), kThreads, 0, stream>>>(
          s, static_cast<const T*>(dy), static_cast<const I*>(indices), static_cast<T*>(dx), flag);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchGatherElements(const GatherElementsShape& s, int elem_bytes, const void* data, ir::DType idx_dtype,
                                 const void* indices, void* out, uint32_t* flag, cudaStream_t stream) {
  if (s.num_idx == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1:
      return LaunchRaw<1>(s, data, idx_dtype, indices, out, flag, stream);
    case 2:
      return LaunchRaw<2>(s, data, idx_dtype, indices, out, flag, stream);
    case 4:
      return LaunchRaw<4>(s, data, idx_dtype, indices, out, flag, stream);
    case 8:
      return LaunchRaw<8>(s, data, idx_dtype, indices, out, flag, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchGatherElementsGrad(const GatherElementsShape& s, ir::DType dtype, const void* dy, ir::DType idx_dtype,
                                     const void* indices, void* dx, uint32_t* flag, cudaStream_t stream) {
  if (s.num_data == 0) return cudaSuccess;
  return DispatchFloat(dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    return DispatchIndex(idx_dtype, [&](auto itag) -> cudaError_t {
      using I = typename decltype(itag)::type;
      GatherElementsGradKernel<T, I><<<GridFor(s.num_data), kThreads, 0, stream>>>(
          s, static_cast<const T*>(dy), static_cast<const I*>(indices), static_cast<T*>(dx), flag);
      return cudaGetLastError();
    });
  });
}

}  // namespace onnxpipe::cuda
