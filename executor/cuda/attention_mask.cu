// Small kernels around cuDNN's SDPA (attention.h): key-padding masks to per-batch lengths, the
// all-Sq query lengths its padding mode needs, zeroing the gradient rows of padded keys, and the
// device dropout seed and offset (written by a kernel, so the values travel as launch arguments:
// nothing on the host has to outlive the call, and a captured CUDA graph holds them).
#include "executor/cuda/attention.h"

namespace onnxpipe::cuda {
namespace {

// One block per batch row: the first false's index (Sk when none) via a block-wide min.
__global__ void KeyMaskToLengthsKernel(const bool* __restrict__ mask, int32_t* __restrict__ lengths, int64_t seq_kv) {
  const bool* row = mask + blockIdx.x * seq_kv;
  int64_t first_false = seq_kv;
  for (int64_t j = threadIdx.x; j < seq_kv; j += blockDim.x) {
    if (!row[j]) {
      first_false = j;
      break;  // j only grows for this thread
    }
  }
  __shared__ int64_t partial[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    first_false = min(first_false, __shfl_down_sync(0xffffffffu, first_false, offset));
  }
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = first_false;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t m = seq_kv;
    for (int w = 0; w < blockDim.x / 32; ++w) m = min(m, partial[w]);
    lengths[blockIdx.x] = static_cast<int32_t>(m);
  }
}

__global__ void FillLengthsKernel(int32_t* lengths, int64_t batch, int32_t value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < batch; i += int64_t{gridDim.x} * blockDim.x) {
    lengths[i] = value;
  }
}

// Grid-stride over (B, H, S) rows; rows at or past their batch's length are zeroed, 4-byte words.
__global__ void ZeroPaddedRowsKernel(uint32_t* x, const int32_t* __restrict__ lengths, int64_t heads, int64_t seq,
                                     int64_t row_words, int64_t rows) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t j = r % seq;
    const int64_t b = r / (seq * heads);
    if (j < lengths[b]) continue;
    uint32_t* row = x + r * row_words;
    for (int64_t w = threadIdx.x; w < row_words; w += blockDim.x) row[w] = 0u;
  }
}

__global__ void WriteDropoutSeedKernel(int64_t* out, uint64_t keyed, uint64_t step, const uint64_t* device_step,
                                       uint64_t row_offset) {
  const uint64_t s = device_step != nullptr ? *device_step : step;
  out[0] = static_cast<int64_t>(Mix64(Mix64(keyed ^ s) ^ row_offset));
  out[1] = 0;
}

}  // namespace

cudaError_t LaunchWriteDropoutSeed(int64_t* out, uint64_t keyed, uint64_t step, const uint64_t* device_step,
                                   uint64_t row_offset, cudaStream_t stream) {
  WriteDropoutSeedKernel<<<1, 1, 0, stream>>>(out, keyed, step, device_step, row_offset);
  return cudaGetLastError();
}

cudaError_t LaunchKeyMaskToLengths(const bool* key_mask, int32_t* lengths, int64_t batch, int64_t seq_kv,
                                   cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  KeyMaskToLengthsKernel<<<static_cast<unsigned>(batch), 256, 0, stream>>>(key_mask, lengths, seq_kv);
  return cudaGetLastError();
}

cudaError_t LaunchFillLengths(int32_t* lengths, int64_t batch, int32_t value, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const int blocks = static_cast<int>(batch / 256 + 1 < 1024 ? batch / 256 + 1 : 1024);
  FillLengthsKernel<<<blocks, 256, 0, stream>>>(lengths, batch, value);
  return cudaGetLastError();
}

cudaError_t LaunchZeroPaddedRows(void* x, const int32_t* lengths, int64_t batch, int64_t heads, int64_t seq,
                                 int64_t dim, int elem_bytes, cudaStream_t stream) {
  const int64_t rows = batch * heads * seq;
  if (rows == 0 || dim == 0) return cudaSuccess;
  if ((dim * elem_bytes) % 4 != 0) return cudaErrorInvalidValue;
  const int64_t row_words = dim * elem_bytes / 4;
  const int blocks = static_cast<int>(rows < 65535 ? rows : 65535);
  ZeroPaddedRowsKernel<<<blocks, 64, 0, stream>>>(static_cast<uint32_t*>(x), lengths, heads, seq, row_words, rows);
  return cudaGetLastError();
}

}  // namespace onnxpipe::cuda
