// One thread per element (grid-stride): the linear index is split into the row-major index of
// `dims`, whose dot products with the two stride vectors locate the source and destination.
// Before launching, dims of extent 1 are dropped and neighbours both layouts keep contiguous are
// merged (a Transpose that keeps the head dim moves rows, not elements), the innermost run is
// moved in the widest of 16/8/4/2/1-byte units its alignment allows, and the index arithmetic is
// 32-bit whenever every offset fits (64-bit division costs more than the copy).
#include <algorithm>
#include <cstdlib>

#include "executor/cuda/strided_copy.h"

namespace onnxpipe::cuda {
namespace {

template <typename U, typename Idx>
__global__ void StridedCopyKernel(StridedCopy c, Idx n, const U* __restrict__ src, U* __restrict__ dst) {
  Idx dims[kMaxCopyRank], ss[kMaxCopyRank], ds[kMaxCopyRank];
  for (int k = 0; k < c.rank; ++k) {
    dims[k] = static_cast<Idx>(c.dims[k]);
    ss[k] = static_cast<Idx>(c.src_strides[k]);
    ds[k] = static_cast<Idx>(c.dst_strides[k]);
  }
  const Idx step = static_cast<Idx>(gridDim.x) * static_cast<Idx>(blockDim.x);
  for (Idx i = static_cast<Idx>(blockIdx.x) * static_cast<Idx>(blockDim.x) + static_cast<Idx>(threadIdx.x); i < n;
       i += step) {
    Idx rem = i, s = static_cast<Idx>(c.src_offset), d = static_cast<Idx>(c.dst_offset);
    for (int k = c.rank - 1; k >= 0; --k) {
      const Idx idx = rem % dims[k];
      rem /= dims[k];
      s += idx * ss[k];
      d += idx * ds[k];
    }
    dst[d] = src[s];
  }
}

// Drops extent-1 dims and merges dim k into k-1 where both layouts step over k contiguously.
StridedCopy Simplify(const StridedCopy& c) {
  StridedCopy o = c;
  o.rank = 0;
  for (int k = 0; k < c.rank; ++k) {
    if (c.dims[k] == 1) continue;
    const int j = o.rank - 1;
    if (j >= 0 && o.src_strides[j] == c.src_strides[k] * c.dims[k] &&
        o.dst_strides[j] == c.dst_strides[k] * c.dims[k]) {
      o.dims[j] *= c.dims[k];
      o.src_strides[j] = c.src_strides[k];
      o.dst_strides[j] = c.dst_strides[k];
      continue;
    }
    o.dims[o.rank] = c.dims[k];
    o.src_strides[o.rank] = c.src_strides[k];
    o.dst_strides[o.rank] = c.dst_strides[k];
    ++o.rank;
  }
  if (o.rank == 0) {  // a single element
    o.rank = 1;
    o.dims[0] = 1;
    o.src_strides[0] = o.dst_strides[0] = 1;
  }
  return o;
}

// The number of elements per move unit (a power of two up to 16 bytes) that `c`'s innermost run,
// every stride, both offsets and both pointers are multiples of.
int64_t VectorFactor(const StridedCopy& c, int elem_bytes, const void* src, void* dst) {
  const int last = c.rank - 1;
  if (c.src_strides[last] != 1 || c.dst_strides[last] != 1) return 1;
  for (int64_t f = 16 / elem_bytes; f > 1; f /= 2) {
    bool ok = c.dims[last] % f == 0 && c.src_offset % f == 0 && c.dst_offset % f == 0 &&
              reinterpret_cast<uintptr_t>(src) % (f * elem_bytes) == 0 &&
              reinterpret_cast<uintptr_t>(dst) % (f * elem_bytes) == 0;
    for (int k = 0; k < last && ok; ++k) ok = c.src_strides[k] % f == 0 && c.dst_strides[k] % f == 0;
    if (ok) return f;
  }
  return 1;
}

// The largest |offset| + 1 either side can reach.
int64_t Reach(const StridedCopy& c) {
  int64_t s = std::abs(c.src_offset), d = std::abs(c.dst_offset);
  for (int k = 0; k < c.rank; ++k) {
    s += (c.dims[k] - 1) * std::abs(c.src_strides[k]);
    d += (c.dims[k] - 1) * std::abs(c.dst_strides[k]);
  }
  return std::max(s, d) + 1;
}

template <typename U>
cudaError_t Launch(const StridedCopy& c, const void* src, void* dst, cudaStream_t stream) {
  constexpr int kThreads = 256;
  int64_t n = 1;
  for (int k = 0; k < c.rank; ++k) n *= c.dims[k];
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  const auto* s = static_cast<const U*>(src);
  auto* d = static_cast<U*>(dst);
  if (std::max(n, Reach(c)) < (int64_t{1} << 30)) {  // (headroom for i + the grid's stride)
    StridedCopyKernel<U, int32_t>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(c, static_cast<int32_t>(n), s, d);
  } else {
    StridedCopyKernel<U, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(c, n, s, d);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchStridedCopy(const StridedCopy& copy, int elem_bytes, const void* src, void* dst,
                              cudaStream_t stream) {
  if (copy.rank < 0 || copy.rank > kMaxCopyRank) return cudaErrorInvalidValue;
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8) return cudaErrorInvalidValue;
  for (int k = 0; k < copy.rank; ++k)
    if (copy.dims[k] == 0) return cudaSuccess;
  StridedCopy c = Simplify(copy);
  const int64_t f = VectorFactor(c, elem_bytes, src, dst);
  if (f > 1) {  // move f elements at a time
    c.dims[c.rank - 1] /= f;
    for (int k = 0; k < c.rank - 1; ++k) {
      c.src_strides[k] /= f;
      c.dst_strides[k] /= f;
    }
    c.src_offset /= f;
    c.dst_offset /= f;
  }
  switch (elem_bytes * f) {
    case 1:
      return Launch<uint8_t>(c, src, dst, stream);
    case 2:
      return Launch<uint16_t>(c, src, dst, stream);
    case 4:
      return Launch<uint32_t>(c, src, dst, stream);
    case 8:
      return Launch<uint64_t>(c, src, dst, stream);
    case 16:
      return Launch<uint4>(c, src, dst, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace onnxpipe::cuda
