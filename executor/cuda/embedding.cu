// Gather and GatherGrad kernels. The backward groups index positions by table row with CUB's
// stable radix sort (keys = row, values = position), so each row's contributions are summed by a
// single block in position order: no atomics on floats, the same bits every run.
#include <cub/device/device_radix_sort.cuh>

#include "executor/cuda/device_util.cuh"
#include "executor/cuda/embedding.h"

namespace onnxpipe::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr int64_t kMaxGridY = 65535;
size_t AlignUp(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// The wrapped row of index j, or -1 when out of range.
template <typename I>
__device__ __forceinline__ int64_t RowOf(const I* idx, int64_t j, int64_t n_axis) {
  int64_t v = static_cast<int64_t>(idx[j]);
  if (v < 0) v += n_axis;
  return v >= 0 && v < n_axis ? v : -1;
}

// One element of `E` (a type of the element's size) per thread iteration over out.
template <typename E, typename I>
__global__ void GatherKernel(GatherShape s, const E* __restrict__ data, const I* __restrict__ idx, E* __restrict__ out,
                             uint32_t* bad_index) {
  const int64_t total = s.outer * s.num_idx * s.inner;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % s.inner, r = i / s.inner;
    const int64_t j = r % s.num_idx, o = r / s.num_idx;
    const int64_t row = RowOf(idx, j, s.n_axis);
    if (row < 0) {
      out[i] = E{};
      if (c == 0 && bad_index != nullptr) *bad_index = 1;
    } else {
      out[i] = data[(o * s.n_axis + row) * s.inner + c];
    }
  }
}

// Sort keys: the wrapped row, n_axis for an out-of-range index (sorted last, skipped).
template <typename I>
__global__ void RowKeysKernel(const I* __restrict__ idx, int64_t num_idx, int64_t n_axis, uint32_t* keys,
                              int32_t* positions, uint32_t* bad_index) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < num_idx; j += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = RowOf(idx, j, n_axis);
    if (row < 0 && bad_index != nullptr) *bad_index = 1;
    keys[j] = static_cast<uint32_t>(row < 0 ? n_axis : row);
    positions[j] = static_cast<int32_t>(j);
  }
}

// Block (x = sorted position, y = tile of the outer x inner columns, grid-strided past the grid's
// y limit): the first position of each row's run sums the run's dy rows for its columns, in
// position order.
template <typename G, typename T>
__global__ void ScatterRunsKernel(GatherShape s, const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos,
                                  const G* __restrict__ dy, T* __restrict__ dtable, bool accumulate) {
  const int64_t first = blockIdx.x;
  const uint32_t row = keys[first];
  if (row == static_cast<uint32_t>(s.n_axis) || (first > 0 && keys[first - 1] == row)) return;
  const int64_t columns = s.outer * s.inner;
  for (int64_t q = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; q < columns; q += int64_t{gridDim.y} * blockDim.x) {
    const int64_t o = q / s.inner, c = q % s.inner;
    float sum = 0.f;
    for (int64_t t = first; t < s.num_idx && keys[t] == row; ++t) {
      sum += static_cast<float>(Load(dy, (o * s.num_idx + pos[t]) * s.inner + c));
    }
    const int64_t at = (o * s.n_axis + row) * s.inner + c;
    Store(dtable, at, accumulate ? static_cast<float>(Load(dtable, at)) + sum : sum);
  }
}

template <typename F>
cudaError_t DispatchIndex(ir::DType dt, F&& f) {
  switch (dt) {
    case ir::DType::kI64:
      return f(TypeTag<int64_t>{});
    case ir::DType::kI32:
      return f(TypeTag<int32_t>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Scratch layout inside the workspace: keys in/out, positions in/out, then CUB's temp storage.
struct SortScratch {
  uint32_t *keys_in, *keys_out;
  int32_t *pos_in, *pos_out;
  void* temp;
  size_t temp_bytes;
};

int KeyBits(int64_t n_axis) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= static_cast<uint64_t>(n_axis)) ++bits;
  return bits;
}

size_t CubTempBytes(const GatherShape& s) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(s.num_idx), 0, KeyBits(s.n_axis));
  return bytes;
}

SortScratch CarveScratch(const GatherShape& s, void* workspace) {
  auto* base = static_cast<char*>(workspace);
  const size_t words = AlignUp(static_cast<size_t>(s.num_idx) * 4);
  SortScratch sc;
  sc.keys_in = reinterpret_cast<uint32_t*>(base);
  sc.keys_out = reinterpret_cast<uint32_t*>(base + words);
  sc.pos_in = reinterpret_cast<int32_t*>(base + 2 * words);
  sc.pos_out = reinterpret_cast<int32_t*>(base + 3 * words);
  sc.temp = base + 4 * words;
  sc.temp_bytes = CubTempBytes(s);
  return sc;
}

}  // namespace

cudaError_t LaunchGather(const GatherShape& s, ir::DType dtype, const void* data, ir::DType index_dtype,
                         const void* indices, void* out, uint32_t* bad_index, cudaStream_t stream) {
  const int64_t total = s.outer * s.num_idx * s.inner;
  if (total == 0) return cudaSuccess;
  return DispatchIndex(index_dtype, [&](auto itag) -> cudaError_t {
    using I = typename decltype(itag)::type;
    auto launch = [&](auto etag) -> cudaError_t {
      using E = typename decltype(etag)::type;
      GatherKernel<E, I><<<GridFor(total), kThreads, 0, stream>>>(
          s, static_cast<const E*>(data), static_cast<const I*>(indices), static_cast<E*>(out), bad_index);
      return cudaGetLastError();
    };
    switch (ir::DTypeSize(dtype)) {
      case 1:
        return launch(TypeTag<uint8_t>{});
      case 2:
        return launch(TypeTag<uint16_t>{});
      case 4:
        return launch(TypeTag<uint32_t>{});
      case 8:
        return launch(TypeTag<uint64_t>{});
      default:
        return cudaErrorInvalidValue;
    }
  });
}

size_t GatherGradWorkspaceBytes(const GatherShape& s) {
  return 4 * AlignUp(static_cast<size_t>(s.num_idx) * 4) + AlignUp(CubTempBytes(s));
}

cudaError_t LaunchGatherGrad(const GatherShape& s, ir::DType dy_dtype, const void* dy, ir::DType index_dtype,
                             const void* indices, ir::DType out_dtype, void* dtable, bool accumulate, void* workspace,
                             size_t workspace_bytes, uint32_t* bad_index, cudaStream_t stream) {
  const int64_t table = s.outer * s.n_axis * s.inner;
  if (table == 0) return cudaSuccess;
  if (workspace_bytes < GatherGradWorkspaceBytes(s)) return cudaErrorInvalidValue;
  if (!accumulate) {
    const cudaError_t err = cudaMemsetAsync(dtable, 0, table * ir::DTypeSize(out_dtype), stream);
    if (err != cudaSuccess) return err;
  }
  if (s.num_idx == 0 || s.inner == 0) return cudaSuccess;
  SortScratch sc = CarveScratch(s, workspace);
  cudaError_t err = DispatchIndex(index_dtype, [&](auto itag) -> cudaError_t {
    using I = typename decltype(itag)::type;
    RowKeysKernel<I><<<GridFor(s.num_idx), kThreads, 0, stream>>>(static_cast<const I*>(indices), s.num_idx, s.n_axis,
                                                                  sc.keys_in, sc.pos_in, bad_index);
    return cudaGetLastError();
  });
  if (err != cudaSuccess) return err;
  err = cub::DeviceRadixSort::SortPairs(sc.temp, sc.temp_bytes, sc.keys_in, sc.keys_out, sc.pos_in, sc.pos_out,
                                        static_cast<int>(s.num_idx), 0, KeyBits(s.n_axis), stream);
  if (err != cudaSuccess) return err;
  return DispatchFloat(dy_dtype, [&](auto gtag) -> cudaError_t {
    using G = typename decltype(gtag)::type;
    return DispatchFloat(out_dtype, [&](auto ttag) -> cudaError_t {
      using T = typename decltype(ttag)::type;
      const int64_t tiles = std::min<int64_t>((s.outer * s.inner + kThreads - 1) / kThreads, kMaxGridY);
      const dim3 grid(static_cast<unsigned>(s.num_idx), static_cast<unsigned>(tiles));
      ScatterRunsKernel<G, T><<<grid, kThreads, 0, stream>>>(s, sc.keys_out, sc.pos_out, static_cast<const G*>(dy),
                                                             static_cast<T*>(dtable), accumulate);
      return cudaGetLastError();
    });
  });
}

}  // namespace onnxpipe::cuda
