// Time of the dropout kernels at the benchmark's FFN shape (65536 x 4096 bf16 elements, ratio 0.1):
// Dropout and DropoutGrad (regenerating the mask), GELU with its fused dropout and its gradient (also
// with the gradient's column sums), a plain GELU, and a device copy of the same bytes as the bandwidth
// reference. CUDA events, mean of 10 calls after one warm-up call. Not a test; run by hand on the GPU machine.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>

#include "executor/cuda/dropout.h"
#include "executor/cuda/gelu.h"

namespace onnxpipe::cuda {
namespace {

float MeanMs(const std::function<void()>& f, int reps = 10) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  f();
  cudaDeviceSynchronize();
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

int Main() {
  const int64_t n = int64_t{65536} * 4096;
  __nv_bfloat16 *x = nullptr, *y = nullptr, *dy = nullptr;
  uint8_t* bits = nullptr;
  if (cudaMalloc(&x, n * 2) != cudaSuccess || cudaMalloc(&y, n * 2) != cudaSuccess ||
      cudaMalloc(&dy, n * 2) != cudaSuccess || cudaMalloc(&bits, n / 8) != cudaSuccess) {
    std::fprintf(stderr, "no GPU memory for %lld bf16 elements\n", static_cast<long long>(n));
    return 1;
  }
  cudaMemset(x, 0x3c, n * 2);
  cudaMemset(dy, 0x3c, n * 2);
  DropoutParams p;
  p.ratio = 0.1;
  p.seed = 1;
  p.node_key = 7;
  p.offset = 3;
  auto report = [&](const char* what, float ms, double bytes) {
    std::printf("%-32s %8.1f us  %6.2f TB/s\n", what, ms * 1e3, bytes / (ms * 1e-3) / 1e12);
  };
  const ir::DType bf16 = ir::DType::kBF16;
  report("copy", MeanMs([&] { cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice); }), 4.0 * n);
  report("gelu", MeanMs([&] { LaunchGeluForward(x, y, n, false, nullptr, nullptr, nullptr); }), 4.0 * n);
  report("gelu + dropout", MeanMs([&] { LaunchGeluForward(x, y, n, false, &p, nullptr, nullptr); }), 4.0 * n);
  report("gelu grad + dropout", MeanMs([&] { LaunchGeluBackward(dy, x, y, n, false, &p, nullptr, nullptr); }), 6.0 * n);
  report("gelu + dropout, keep bits", MeanMs([&] { LaunchGeluForward(x, y, n, false, &p, bits, nullptr); }),
         4.125 * n);
  report("gelu grad, keep bits", MeanMs([&] { LaunchGeluBackward(dy, x, y, n, false, &p, bits, nullptr); }),
         6.125 * n);
  // GeluGrad with dXSums: the same gradient and its column sums (the next Linear's bias gradient), which
  // replace the dW GEMM's BGRAD epilogue; fp32 sums of 4096 columns.
  float *sums = nullptr, *ws = nullptr;
  const int64_t rows = n / 4096, ws_bytes = GeluSumsWorkspaceBytes(rows, 4096);
  if (cudaMalloc(&sums, 4096 * 4) != cudaSuccess || cudaMalloc(&ws, ws_bytes) != cudaSuccess) return 1;
  report("gelu grad, keep bits, column sums", MeanMs([&] {
           (void)GeluBackwardWithSums(dy, x, y, rows, 4096, false, &p, bits, ir::DType::kF32, sums, ws, nullptr);
         }),
         6.125 * n);
  report("dropout", MeanMs([&] { LaunchDropoutForward(p, bf16, x, y, nullptr, n, nullptr); }), 4.0 * n);
  report("dropout grad (regenerated mask)",
         MeanMs([&] { LaunchDropoutBackward(p, bf16, dy, nullptr, y, n, nullptr); }), 4.0 * n);
  const cudaError_t err = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}

}  // namespace
}  // namespace onnxpipe::cuda

int main() { return onnxpipe::cuda::Main(); }
