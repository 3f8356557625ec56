// Bandwidth of the normalisation and softmax kernels at the benchmark shape (B*S = 65536 rows,
// d = 1024): time per call (CUDA events, median of 5 runs of 20 calls after warm-up) and the
// achieved GB/s counting the bytes each kernel must move (inputs read once, outputs written once;
// the backward's dgamma/dbeta workspace traffic is reported separately). Not a test.
// H200 (2026-12-05, bench/results/norm_20261205_h200.json), bf16 (65536, 1024): LayerNorm fwd 2789 GB/s,
// bwd 2809, fwd+bwd 2801 (240 us); residual-fused fwd 3636, bwd 3507; RMSNorm fwd+bwd 2986;
// cross-entropy (8192, 50257) 2276.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "executor/cuda/dropout.h"
#include "executor/cuda/layernorm.h"
#include "executor/cuda/softmax.h"

namespace onnxpipe::cuda {
namespace {

// Milliseconds per call of `fn`.
double TimeMs(const std::function<absl::Status()>& fn) {
  for (int i = 0; i < 3; ++i) {
    if (absl::Status st = fn(); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> runs;
  constexpr int kCalls = 20;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(start);
    for (int i = 0; i < kCalls; ++i) (void)fn();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    runs.push_back(ms / kCalls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

void Report(const char* what, double ms, double bytes) {
  std::printf("%-58s %8.1f us  %7.0f GB/s\n", what, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
}

template <typename T>
T* Alloc(int64_t n) {
  T* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %lld elements failed\n", static_cast<long long>(n));
    std::exit(1);
  }
  cudaMemset(p, 0, n * sizeof(T));
  return p;
}

// Fills a bf16 or float buffer with values in [-2, 2) (a fixed pattern; timing does not depend on it).
template <typename T>
void Fill(T* p, int64_t n) {
  std::vector<T> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<T>(static_cast<float>((i * 7919) % 4001) / 1000.f - 2.f);
  cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
}

template <typename T>
void BenchNorm(const char* dtype, NormKind kind, int64_t rows, int64_t d) {
  const int64_t n = rows * d;
  const double e = sizeof(T);
  T *x = Alloc<T>(n), *r = Alloc<T>(n), *sum = Alloc<T>(n), *y = Alloc<T>(n), *dy = Alloc<T>(n), *dx = Alloc<T>(n);
  T *gamma = Alloc<T>(d), *beta = Alloc<T>(d);
  float *mean = Alloc<float>(rows), *rstd = Alloc<float>(rows), *dgamma = Alloc<float>(d), *dbeta = Alloc<float>(d);
  const int64_t ws_bytes = NormBackwardWorkspaceBytes(rows, d);
  float* ws = Alloc<float>(ws_bytes / 4);
  Fill(x, n);
  Fill(r, n);
  Fill(dy, n);
  Fill(gamma, d);
  Fill(beta, d);
  const bool layer = kind == NormKind::kLayerNorm;
  NormForwardArgs<T> f;
  f.kind = kind;
  f.rows = rows;
  f.d = d;
  f.x = x;
  f.gamma = gamma;
  f.beta = layer ? beta : nullptr;
  f.y = y;
  f.mean = layer ? mean : nullptr;
  f.rstd = rstd;
  NormBackwardArgs<T> b;
  b.kind = kind;
  b.rows = rows;
  b.d = d;
  b.dy = dy;
  b.x = x;
  b.gamma = gamma;
  b.mean = layer ? mean : nullptr;
  b.rstd = rstd;
  b.dx = dx;
  b.dgamma = dgamma;
  b.dbeta = layer ? dbeta : nullptr;
  b.workspace = ws;
  const std::string tag = std::string(layer ? "LayerNorm" : "RMSNorm") + " " + dtype + " (" + std::to_string(rows) +
                          ", " + std::to_string(d) + ")";
  const double stats = rows * 4.0 * (layer ? 2 : 1);
  const double fwd_ms = TimeMs([&] { return NormForward(f, nullptr); });
  Report((tag + " fwd").c_str(), fwd_ms, 2 * n * e + stats);
  const double bwd_ms = TimeMs([&] { return NormBackward(b, nullptr); });
  Report((tag + " bwd").c_str(), bwd_ms, 3 * n * e + stats);
  Report((tag + " fwd+bwd").c_str(), fwd_ms + bwd_ms, 5 * n * e + 2 * stats);
  std::printf("%-58s %8.1f MB (written and read once per backward)\n", (tag + " bwd dgamma/dbeta workspace").c_str(),
              ws_bytes / 1e6);
  // Fused residual: read x, residual; write sum, y. Backward adds dresidual: read x, dy, dres; write dx.
  f.residual = r;
  f.sum = sum;
  b.dresidual = r;
  const double rf_ms = TimeMs([&] { return NormForward(f, nullptr); });
  Report((tag + " fwd, residual add fused").c_str(), rf_ms, 4 * n * e + stats);
  const double rb_ms = TimeMs([&] { return NormBackward(b, nullptr); });
  Report((tag + " bwd, residual gradient fused").c_str(), rb_ms, 4 * n * e + stats);
  if (layer) {
    // A post-LN encoder's norm: two incoming gradients summed, the fused residual dropout's gradient written
    // beside dx. Read x, dy, dy2; write dx, dx_dropped.
    const DropoutParams drop{.ratio = 0.1, .seed = 1, .node_key = 2};
    b.dresidual = nullptr;
    b.dy2 = r;
    b.dropout = &drop;
    b.dx_dropped = sum;
    const double pb_ms = TimeMs([&] { return NormBackward(b, nullptr); });
    Report((tag + " bwd, dy + dy2, dropout dX written (post-LN)").c_str(), pb_ms, 5 * n * e + stats);
    // The same with the dropped dX's column sums (LayerNormGrad's dXDroppedSums: the bias gradient of the
    // Linear before the dropout, instead of its dW GEMM's BGRAD epilogue).
    float* sums = Alloc<float>(d);
    b.dx_sums = sums;
    b.sums_of_dropped = true;
    const double ps_ms = TimeMs([&] { return NormBackward(b, nullptr); });
    Report((tag + " bwd, post-LN, with the dropped dX's column sums").c_str(), ps_ms, 5 * n * e + stats);
    cudaFree(sums);
  }
  for (void* p : std::vector<void*>{x, r, sum, y, dy, dx, gamma, beta, mean, rstd, dgamma, dbeta, ws}) cudaFree(p);
}

void BenchSoftmax(int64_t rows, int64_t n) {
  using T = __nv_bfloat16;
  T *x = Alloc<T>(rows * n), *y = Alloc<T>(rows * n), *dy = Alloc<T>(rows * n);
  Fill(x, rows * n);
  Fill(dy, rows * n);
  const std::string tag = "Softmax bf16 (" + std::to_string(rows) + ", " + std::to_string(n) + ")";
  Report((tag + " fwd").c_str(), TimeMs([&] { return SoftmaxForward(x, y, rows, n, false, nullptr); }),
         2.0 * rows * n * 2);
  Report((tag + " bwd").c_str(), TimeMs([&] { return SoftmaxBackward(dy, y, x, rows, n, false, nullptr); }),
         3.0 * rows * n * 2);
  cudaFree(x);
  cudaFree(y);
  cudaFree(dy);
}

void BenchCrossEntropy(int64_t rows, int64_t classes) {
  using T = __nv_bfloat16;
  T *logits = Alloc<T>(rows * classes), *dlogits = Alloc<T>(rows * classes);
  int64_t* labels = Alloc<int64_t>(rows);
  float *loss = Alloc<float>(1), *ws = Alloc<float>(CrossEntropyWorkspaceBytes(rows) / 4);
  Fill(logits, rows * classes);
  CrossEntropyArgs<T, int64_t> a;
  a.rows = rows;
  a.classes = classes;
  a.logits = logits;
  a.labels = labels;
  a.loss = loss;
  a.dlogits = dlogits;
  a.workspace = ws;
  const std::string tag = "CrossEntropy bf16 (" + std::to_string(rows) + ", " + std::to_string(classes) + ")";
  Report((tag + " loss + dlogits").c_str(), TimeMs([&] { return CrossEntropy(a, nullptr); }), 2.0 * rows * classes * 2);
  for (void* p : std::vector<void*>{logits, dlogits, labels, loss, ws}) cudaFree(p);
}

}  // namespace
}  // namespace onnxpipe::cuda

int main() {
  using namespace onnxpipe::cuda;
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "norm_bench: no CUDA device\n");
    return 1;
  }
  auto info = GetDeviceInfo(0);
  std::printf("device: %s\n", info.ok() ? info->name.c_str() : "?");
  BenchNorm<__nv_bfloat16>("bf16", NormKind::kLayerNorm, 65536, 1024);
  BenchNorm<__nv_bfloat16>("bf16", NormKind::kRmsNorm, 65536, 1024);
  BenchNorm<float>("fp32", NormKind::kLayerNorm, 65536, 1024);
  BenchNorm<__nv_bfloat16>("bf16", NormKind::kLayerNorm, 16384, 4096);
  BenchNorm<__nv_bfloat16>("bf16", NormKind::kLayerNorm, 262144, 256);  // the backward's warp-per-row path
  BenchSoftmax(65536, 1024);
  BenchCrossEntropy(65536, 10);
  BenchCrossEntropy(8192, 50257);
  return 0;
}
