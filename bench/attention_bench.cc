// Forward and backward time of the fused attention kernels at the benchmark shapes of DESIGN.md:
// - fp32, the FlashAttention-2 style SIMT kernels (executor/cuda/flash_attention.h, exact fp32
//   FMAs, no TF32): batch 32, 16 heads, seq 256, head dim 64; plain, causal, and dropout 0.1.
//   Compare with PyTorch's fp32 SDPA on the same GPU (torch.nn.functional.scaled_dot_product_attention
//   on float32 CUDA tensors of that shape, forward and forward+backward).
// - bf16 through the tensor-core flash kernels (flash_attention.h): batch 256, 16 heads, seq 256,
//   head dims 64 and 128 (128: 8 heads); plain, causal, dropout 0.1. Each case also prints a JSON
//   line ("json {...}") that bench/attention_bench.py collects next to PyTorch's bf16 SDPA.
// - bf16 through cuDNN (executor/cuda/attention.h, where cuDNN was found): DESIGN.md's encoder shape (batch 256,
//   16 heads, seq 256, head dim 64; no mask and causal), and the causal decoder shapes of bench/llm_train_bench.py
//   (head dim 128, seq 1024 and 2048, grouped-query K and V, operands through (B, S, H, D) strides as the
//   projections lay them out). Each case also prints a JSON line.
// TFLOP/s use the usual count: 4 B H S^2 D forward, 2.5 times that backward (causal: half); the
// fp32 backward executes 18 B H S^2 D as it recomputes the statistics (flash_attention_bwd.cu).
// Usage: attention_bench [iterations] [fp32|flash-bf16|bf16|all]   (bf16: the cuDNN cases)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "executor/cuda/flash_attention.h"
#include "frontend/ir/status.h"
#include "frontend/ir/tensor.h"
#if ONNXPIPE_CUDNN_ATTENTION
#include "executor/cuda/attention.h"
#endif

namespace onnxpipe::cuda {
namespace {

// Milliseconds per call of f (after one warm-up round of `iterations` calls).
template <typename F>
absl::StatusOr<float> TimeMs(int iterations, cudaStream_t stream, F&& f) {
  cudaEvent_t start, stop;
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&start));
  CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop));
  float ms = 0;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up
    CUDA_RETURN_IF_ERROR(cudaEventRecord(start, stream));
    for (int i = 0; i < iterations; ++i) RETURN_IF_ERROR(f());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, stream));
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  }
  CUDA_RETURN_IF_ERROR(cudaEventDestroy(start));
  CUDA_RETURN_IF_ERROR(cudaEventDestroy(stop));
  return ms / iterations;
}

absl::Status RunFp32(int iterations) {
  constexpr int64_t B = 32, H = 16, S = 256, D = 64;
  const int64_t n = B * H * S * D;
  std::vector<float> host(n);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  void *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  for (void** p : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) {
    for (float& x : host) x = u(gen);
    CUDA_RETURN_IF_ERROR(cudaMalloc(p, n * sizeof(float)));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  struct Variant {
    const char* name;
    bool causal;
    double dropout;
  };
  for (const Variant& var : {Variant{"", false, 0.0}, Variant{" causal", true, 0.0}, Variant{" dropout 0.1", false, 0.1}}) {
    FlashAttentionConfig c;
    c.q_dims = c.k_dims = c.v_dims = {B, H, S, D};
    c.causal = var.causal;
    c.dropout.training = true;
    c.dropout.ratio = var.dropout;
    c.dropout.seed = 1;
    c.dropout.node_key = 2;
    c.dropout.offset = 3;
    ASSIGN_OR_RETURN(const FlashAttentionPlan plan, PlanFlashAttention(c));
    const int64_t ws_bytes = FlashAttentionBackwardWorkspaceBytes(plan, true, true, true);
    void* ws = nullptr;
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, std::max<int64_t>(ws_bytes, 1)));
    FlashBackwardBuffers b;
    b.d_o = d_o, b.q = q, b.k = k, b.v = v, b.dq = dq, b.dk = dk, b.dv = dv;
    b.workspace = ws, b.workspace_bytes = ws_bytes;
    ASSIGN_OR_RETURN(const float fwd_ms, TimeMs(iterations, stream, [&] {
                       return FlashAttentionForward(plan, q, k, v, nullptr, o, stream);
                     }));
    ASSIGN_OR_RETURN(const float bwd_ms,
                     TimeMs(iterations, stream, [&] { return FlashAttentionBackward(plan, b, stream); }));
    const double fwd_flops = 4.0 * B * H * S * S * D * (var.causal ? 0.5 : 1.0);
    std::printf(
        "flash attention b%lld h%lld s%lld d%lld fp32%s: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms "
        "(%.1f TFLOP/s), forward+backward %.3f ms (%.1f TFLOP/s); workspace %lld bytes\n",
        static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S), static_cast<long long>(D),
        var.name, fwd_ms, fwd_flops / (fwd_ms * 1e9), bwd_ms, 2.5 * fwd_flops / (bwd_ms * 1e9), fwd_ms + bwd_ms,
        3.5 * fwd_flops / ((fwd_ms + bwd_ms) * 1e9), static_cast<long long>(ws_bytes));
    CUDA_RETURN_IF_ERROR(cudaFree(ws));
  }
  for (void* p : {q, k, v, o, d_o, dq, dk, dv}) CUDA_RETURN_IF_ERROR(cudaFree(p));
  CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  return absl::OkStatus();
}

// One bf16 flash attention case: forward, backward and forward+backward milliseconds.
absl::Status RunFlashBf16Case(int iterations, int64_t B, int64_t H, int64_t S, int64_t D, bool causal,
                              double dropout, cudaStream_t stream) {
  const int64_t n = B * H * S * D;
  std::vector<uint16_t> host(n);
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  void *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  for (void** p : {&q, &k, &v, &o, &d_o, &dq, &dk, &dv}) {
    for (uint16_t& x : host) x = ir::FloatToBF16(u(gen));
    CUDA_RETURN_IF_ERROR(cudaMalloc(p, n * 2));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
  FlashAttentionConfig c;
  c.dtype = ir::DType::kBF16;
  c.q_dims = c.k_dims = c.v_dims = {B, H, S, D};
  c.causal = causal;
  c.dropout.training = true;
  c.dropout.ratio = dropout;
  c.dropout.seed = 1;
  c.dropout.node_key = 2;
  c.dropout.offset = 3;
  ASSIGN_OR_RETURN(const FlashAttentionPlan plan, PlanFlashAttention(c));
  const int64_t ws_bytes = FlashAttentionBackwardWorkspaceBytes(plan, true, true, true);
  void* ws = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, std::max<int64_t>(ws_bytes, 1)));
  FlashBackwardBuffers b;
  b.d_o = d_o, b.q = q, b.k = k, b.v = v, b.dq = dq, b.dk = dk, b.dv = dv;
  b.workspace = ws, b.workspace_bytes = ws_bytes;
  auto forward = [&] { return FlashAttentionForward(plan, q, k, v, nullptr, o, stream); };
  auto backward = [&] { return FlashAttentionBackward(plan, b, stream); };
  ASSIGN_OR_RETURN(const float fwd_ms, TimeMs(iterations, stream, forward));
  ASSIGN_OR_RETURN(const float bwd_ms, TimeMs(iterations, stream, backward));
  ASSIGN_OR_RETURN(const float total_ms, TimeMs(iterations, stream, [&]() -> absl::Status {
                     RETURN_IF_ERROR(forward());
                     return backward();
                   }));
  const double fwd_flops = 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
  std::printf(
      "flash attention b%lld h%lld s%lld d%lld bf16%s%s: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms "
      "(%.0f TFLOP/s), forward+backward %.3f ms (%.0f TFLOP/s)\n",
      static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S), static_cast<long long>(D),
      causal ? " causal" : "", dropout > 0 ? " dropout" : "", fwd_ms, fwd_flops / (fwd_ms * 1e9), bwd_ms,
      2.5 * fwd_flops / (bwd_ms * 1e9), total_ms, 3.5 * fwd_flops / (total_ms * 1e9));
  std::printf(
      "json {\"impl\": \"onnxpipe_flash_bf16\", \"b\": %lld, \"h\": %lld, \"s\": %lld, \"d\": %lld, "
      "\"causal\": %s, \"dropout\": %g, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
      "\"forward_backward_ms\": %.4f}\n",
      static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(S), static_cast<long long>(D),
      causal ? "true" : "false", dropout, fwd_ms, bwd_ms, total_ms);
  std::fflush(stdout);
  CUDA_RETURN_IF_ERROR(cudaFree(ws));
  for (void* p : {q, k, v, o, d_o, dq, dk, dv}) CUDA_RETURN_IF_ERROR(cudaFree(p));
  return absl::OkStatus();
}

absl::Status RunFlashBf16(int iterations) {
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  struct Shape {
    int64_t h, d;
  };
  for (const Shape& sh : {Shape{16, 64}, Shape{8, 128}}) {
    for (const auto& [causal, dropout] : {std::pair{false, 0.0}, std::pair{true, 0.0}, std::pair{false, 0.1}}) {
      RETURN_IF_ERROR(RunFlashBf16Case(iterations, /*B=*/256, sh.h, /*S=*/256, sh.d, causal, dropout, stream));
    }
  }
  CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  return absl::OkStatus();
}

#if ONNXPIPE_CUDNN_ATTENTION
// One cuDNN SDPA case: K and V with `hkv` heads (grouped-query attention when below h); `bshd`: Q, K, V and O
// read and written through (B, S, H, D) strides, as the projections of a transformer lay them out.
struct CudnnCase {
  int64_t b, h, hkv, s, d;
  bool causal, bshd;
};

absl::Status RunCudnnCase(int iterations, AttentionGraphs& graphs, const CudnnCase& k, cudaStream_t stream) {
  const int64_t nq = k.b * k.h * k.s * k.d, nkv = k.b * k.hkv * k.s * k.d;
  void *q, *kk, *v, *o, *d_o, *dq, *dk, *dv, *stats;
  for (auto [p, n] : {std::pair{&q, nq}, {&kk, nkv}, {&v, nkv}, {&o, nq}, {&d_o, nq}, {&dq, nq}, {&dk, nkv},
                      {&dv, nkv}}) {
    CUDA_RETURN_IF_ERROR(cudaMalloc(p, n * 2));
    CUDA_RETURN_IF_ERROR(cudaMemset(*p, 0x3c, n * 2));  // bf16 ~0.011: finite values
  }
  CUDA_RETURN_IF_ERROR(cudaMalloc(&stats, k.b * k.h * k.s * 4));
  auto strides = [&](int64_t heads) -> std::vector<int64_t> {
    if (!k.bshd) return {};
    return {k.s * heads * k.d, k.d, heads * k.d, 1};
  };
  AttentionConfig c;
  c.batch = k.b;
  c.heads = k.h;
  c.kv_heads = k.hkv;
  c.seq_q = c.seq_kv = k.s;
  c.head_dim = c.value_dim = k.d;
  c.causal = k.causal;
  c.q_strides = c.o_strides = strides(k.h);
  c.k_strides = c.v_strides = strides(k.hkv);
  ASSIGN_OR_RETURN(int64_t fwd_ws, graphs.ForwardWorkspaceBytes(c));
  ASSIGN_OR_RETURN(int64_t bwd_ws, graphs.BackwardWorkspaceBytes(c));
  void* ws = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, std::max<int64_t>({fwd_ws, bwd_ws, 1})));
  AttentionForwardArgs fa{q, kk, v, nullptr, nullptr, nullptr, o, static_cast<float*>(stats)};
  AttentionBackwardArgs ba{q, kk, v, o, static_cast<float*>(stats), d_o, nullptr, nullptr, nullptr, dq, dk, dv};
  auto forward = [&] { return graphs.Forward(c, fa, ws, fwd_ws, stream); };
  auto backward = [&] { return graphs.Backward(c, ba, ws, bwd_ws, stream); };
  ASSIGN_OR_RETURN(const float fwd_ms, TimeMs(iterations, stream, forward));
  ASSIGN_OR_RETURN(const float bwd_ms, TimeMs(iterations, stream, backward));
  ASSIGN_OR_RETURN(const float total_ms, TimeMs(iterations, stream, [&]() -> absl::Status {
                     RETURN_IF_ERROR(forward());
                     return backward();
                   }));
  // 4 B H S^2 D forward, 2.5 times that backward; causal does about half.
  const double fwd_flops = 4.0 * k.b * k.h * k.s * k.s * k.d * (k.causal ? 0.5 : 1.0);
  std::printf(
      "cudnn attention b%lld h%lld hkv%lld s%lld d%lld bf16%s%s: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms "
      "(%.0f TFLOP/s), forward+backward %.3f ms; workspace fwd %lld bwd %lld bytes\n",
      static_cast<long long>(k.b), static_cast<long long>(k.h), static_cast<long long>(k.hkv),
      static_cast<long long>(k.s), static_cast<long long>(k.d), k.causal ? " causal" : "", k.bshd ? " bshd" : "",
      fwd_ms, fwd_flops / (fwd_ms * 1e9), bwd_ms, 2.5 * fwd_flops / (bwd_ms * 1e9), total_ms,
      static_cast<long long>(fwd_ws), static_cast<long long>(bwd_ws));
  std::printf(
      "json {\"impl\": \"onnxpipe_cudnn_bf16\", \"b\": %lld, \"h\": %lld, \"hkv\": %lld, \"s\": %lld, "
      "\"d\": %lld, \"causal\": %s, \"bshd\": %s, \"dropout\": 0, \"forward_ms\": %.4f, \"backward_ms\": %.4f, "
      "\"forward_backward_ms\": %.4f}\n",
      static_cast<long long>(k.b), static_cast<long long>(k.h), static_cast<long long>(k.hkv),
      static_cast<long long>(k.s), static_cast<long long>(k.d), k.causal ? "true" : "false",
      k.bshd ? "true" : "false", fwd_ms, bwd_ms, total_ms);
  std::fflush(stdout);
  CUDA_RETURN_IF_ERROR(cudaFree(ws));
  for (void* p : {q, kk, v, o, d_o, dq, dk, dv, stats}) CUDA_RETURN_IF_ERROR(cudaFree(p));
  return absl::OkStatus();
}

// DESIGN.md's encoder shape, then the decoder shapes of bench/llm_train_bench.py's Llama preset (grouped and
// not, seq 1024 and 2048).
absl::Status RunBf16(int iterations) {
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionGraphs> graphs, AttentionGraphs::Create());
  cudaStream_t stream;
  CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
  for (const CudnnCase& k : {CudnnCase{256, 16, 16, 256, 64, false, false}, CudnnCase{256, 16, 16, 256, 64, true, false},
                             CudnnCase{8, 16, 4, 1024, 128, true, true}, CudnnCase{8, 16, 16, 1024, 128, true, true},
                             CudnnCase{8, 16, 4, 1024, 128, true, false}, CudnnCase{4, 16, 4, 2048, 128, true, true}}) {
    RETURN_IF_ERROR(RunCudnnCase(iterations, *graphs, k, stream));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamDestroy(stream));
  return absl::OkStatus();
}
#endif

}  // namespace
}  // namespace onnxpipe::cuda

int main(int argc, char** argv) {
  if (onnxpipe::cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 1;
  }
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 50;
  const std::string which = argc > 2 ? argv[2] : "all";
  absl::Status s;
  if (which == "fp32" || which == "all") s = onnxpipe::cuda::RunFp32(iterations);
  if (s.ok() && (which == "flash-bf16" || which == "all")) s = onnxpipe::cuda::RunFlashBf16(iterations);
#if ONNXPIPE_CUDNN_ATTENTION
  if (s.ok() && (which == "bf16" || which == "all")) s = onnxpipe::cuda::RunBf16(iterations);
#endif
  if (!s.ok()) {
    std::fprintf(stderr, "attention_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
