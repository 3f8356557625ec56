// One thread per element (grid-stride): the linear index is split into the row-major index of
// `dims`, whose dot products with the two stride vectors locate the source and destination.
#include "executor/cuda/strided_copy.h"

namespace onnxpipe::cuda {
namespace {

template <typename U>
__global__ void StridedCopyKernel(StridedCopy c, int64_t n, const U* __restrict__ src, U* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rem = i, s = c.src_offset, d = c.dst_offset;
    for (int k = c.rank - 1; k >= 0; --k) {
      const int64_t idx = rem % c.dims[k];
      rem /= c.dims[k];
      s += idx * c.src_strides[k];
      d += idx * c.dst_strides[k];
    }
    dst[d] = src[s];
  }
}

template <typename U>
cudaError_t Launch(const StridedCopy& c, int64_t n, const void* src, void* dst, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  StridedCopyKernel<U><<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), kThreads, 0, stream>>>(
      c, n, static_cast<const U*>(src), static_cast<U*>(dst));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchStridedCopy(const StridedCopy& c, int elem_bytes, const void* src, void* dst, cudaStream_t stream) {
  if (c.rank < 0 || c.rank > kMaxCopyRank) return cudaErrorInvalidValue;
  int64_t n = 1;
  for (int k = 0; k < c.rank; ++k) n *= c.dims[k];
  if (n == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1:
      return Launch<uint8_t>(c, n, src, dst, stream);
    case 2:
      return Launch<uint16_t>(c, n, src, dst, stream);
    case 4:
      return Launch<uint32_t>(c, n, src, dst, stream);
    case 8:
      return Launch<uint64_t>(c, n, src, dst, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace onnxpipe::cuda
