// Forward+backward time of the cuDNN fused attention (executor/cuda/attention.h) at the benchmark
// shape of DESIGN.md: batch 256, 16 heads, seq 256, head dim 64, bf16, no mask and causal, next to
// the reference PyTorch measured for cuDNN's SDPA on the same GPU (1.34 ms, causal 1.28 ms).
// Usage: attention_bench [iterations]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "executor/cuda/attention.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

absl::Status Run(int iterations) {
  constexpr int64_t B = 256, H = 16, S = 256, D = 64;
  const int64_t n = B * H * S * D;
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionGraphs> graphs, AttentionGraphs::Create());
  void *q, *k, *v, *o, *d_o, *dq, *dk, *dv, *stats;
  for (void** p : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(p, n * 2));
    CUDA_RETURN_IF_ERROR(cudaMemset(*p, 0x3c, n * 2));  // bf16 ~0.011: finite values
  }
  CUDA_RETURN_IF_ERROR(cudaMalloc(&stats, B * H * S * 4));
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  for (bool causal : {false, true}) {
    AttentionConfig c;
    c.batch = B;
    c.heads = H;
    c.seq_q = c.seq_kv = S;
    c.head_dim = D;
    c.causal = causal;
    ASSIGN_OR_RETURN(int64_t fwd_ws, graphs->ForwardWorkspaceBytes(c));
    ASSIGN_OR_RETURN(int64_t bwd_ws, graphs->BackwardWorkspaceBytes(c));
    void* ws = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, std::max<int64_t>({fwd_ws, bwd_ws, 1})));
    AttentionForwardArgs fa{q, k, v, nullptr, nullptr, nullptr, o, static_cast<float*>(stats)};
    AttentionBackwardArgs ba{q, k, v, o, static_cast<float*>(stats), d_o, nullptr, nullptr, nullptr, dq, dk, dv};
    float fwd_ms = 0, total_ms = 0;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
      for (int i = 0; i < iterations; ++i) RETURN_IF_ERROR(graphs->Forward(c, fa, ws, fwd_ws, stream));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&fwd_ms, start, stop));
      CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
      for (int i = 0; i < iterations; ++i) {
        RETURN_IF_ERROR(graphs->Forward(c, fa, ws, fwd_ws, stream));
        RETURN_IF_ERROR(graphs->Backward(c, ba, ws, bwd_ws, stream));
      }
      CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
      CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
      CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&total_ms, start, stop));
    }
    fwd_ms /= iterations;
    total_ms /= iterations;
    // 4 B H S^2 D forward, 2.5 times that backward; causal does about half.
    const double flops = 14.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
    std::printf(
        "attention b%lld h%lld s%lld d%lld bf16%s: forward %.3f ms, forward+backward %.3f ms "
        "(%.0f TFLOP/s), workspace fwd %lld bwd %lld bytes; PyTorch cuDNN SDPA reference %.2f ms\n",
        static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S), static_cast<long long>(D),
        causal ? " causal" : "", fwd_ms, total_ms, flops / (total_ms * 1e9), static_cast<long long>(fwd_ws),
        static_cast<long long>(bwd_ws), causal ? 1.28 : 1.34);
    CUDA_RETURN_IF_ERROR(cudaFree(ws));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace onnxpipe::cuda

int main(int argc, char** argv) {
  if (onnxpipe::cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 1;
  }
  absl::Status s = onnxpipe::cuda::Run(argc > 1 ? std::atoi(argv[1]) : 50);
  if (!s.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
