// GEMM throughput of the CUDA backend (executor/cuda/gemm.h) on the benchmark model's Linear shapes, forward and
// both gradients, in bf16 (the --dtype bf16 mode: bf16 operands, fp32 accumulation, bf16 out or fp32 weight
// gradients; with the fused bias/GELU/dGELU/bias-gradient epilogues), exact fp32 and TF32, once with the heuristic's
// first algorithm and once with timed tactics. Prints one JSON line per measurement (ms and TFLOP/s). Not a test.
//   gemm_bench [tactic_cache.json]   (default: gemm_tactics.json in the current folder)
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "executor/cuda/cuda_status.h"
#include "executor/cuda/gemm.h"

namespace onnxpipe::cuda {
namespace {

using ir::DType;

struct BenchCase {
  std::string name;
  GemmDesc desc;
};

// The DESIGN.md benchmark classifier: tokens = batch 256 x seq 256, d 1024, ffn 4096. Linear weights are stored
// (out, in): forward Y = X W^T, dX = dY W, dW = dY^T X accumulated in fp32.
std::vector<BenchCase> Cases() {
  constexpr int64_t kTokens = 256 * 256;
  std::vector<BenchCase> cases = {{"square_4096", {.m = 4096, .n = 4096, .k = 4096}}};
  struct Linear { const char* name; int64_t in, out; GemmEpilogue fwd_epilogue, dx_epilogue; };
  for (const Linear& l : {Linear{"fc1", 1024, 4096, GemmEpilogue::kBiasGeluTanh, GemmEpilogue::kNone},
                          Linear{"fc2", 4096, 1024, GemmEpilogue::kBias, GemmEpilogue::kDGeluTanhBGrad},
                          Linear{"proj", 1024, 1024, GemmEpilogue::kBias, GemmEpilogue::kNone}}) {
    const std::string n = l.name;
    const GemmDesc fwd{.m = kTokens, .n = l.out, .k = l.in, .trans_b = true};
    const GemmDesc dx{.m = kTokens, .n = l.in, .k = l.out};
    const GemmDesc dw{.m = l.out, .n = l.in, .k = kTokens, .trans_a = true, .output_type = DType::kF32, .beta = 1};
    cases.push_back({n + "_fwd", fwd});
    // fp32 training (onnxpipe's default dtype): exact fp32 and TF32 tensor cores, as PyTorch's allow_tf32.
    for (const bool tf32 : {false, true}) {
      for (const auto& [suffix, base] : {std::pair<const char*, GemmDesc>{"_fwd", fwd}, {"_dX", dx}, {"_dW", dw}}) {
        GemmDesc f = base;
        f.input_type = f.output_type = DType::kF32;
        f.allow_tf32 = tf32;
        f.beta = 0;
        cases.push_back({n + suffix + (tf32 ? "_tf32" : "_fp32"), f});
      }
    }
    GemmDesc fused = fwd;
    fused.epilogue = l.fwd_epilogue;
    cases.push_back({n + "_fwd", fused});
    cases.push_back({n + "_dX", dx});
    if (l.dx_epilogue != GemmEpilogue::kNone) {
      GemmDesc dx_fused = dx;
      dx_fused.epilogue = l.dx_epilogue;
      cases.push_back({n + "_dX", dx_fused});
    }
    cases.push_back({n + "_dW", dw});
    GemmDesc dw_bgrad = dw;
    dw_bgrad.epilogue = GemmEpilogue::kBGradA;
    cases.push_back({n + "_dW", dw_bgrad});
  }
  // The language-model head of the bf16 mode (GPT-2's odd vocabulary: bf16 rows of 50257 are only 2-byte aligned)
  // on an eighth of the tokens: forward with bias, dX, and dW accumulated in fp32.
  constexpr int64_t kHeadTokens = kTokens / 8, kVocab = 50257, kModel = 1024;
  cases.push_back({"lm_head_fwd", {.m = kHeadTokens, .n = kVocab, .k = kModel, .trans_b = true,
                                   .epilogue = GemmEpilogue::kBias}});
  cases.push_back({"lm_head_dX", {.m = kHeadTokens, .n = kModel, .k = kVocab}});
  cases.push_back({"lm_head_dW", {.m = kVocab, .n = kModel, .k = kHeadTokens, .trans_a = true,
                                  .output_type = DType::kF32, .beta = 1}});
  return cases;
}

// Device buffer filled with bf16 values in [-1, 1] (or fp32 zeros).
struct Buffer {
  void* ptr = nullptr;
  Buffer(int64_t elems, DType t) {
    const size_t bytes = std::max<int64_t>(elems, 1) * ir::DTypeSize(t);
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) {
      ptr = nullptr;
      return;
    }
    if (t != DType::kBF16) {
      cudaMemset(ptr, 0, bytes);
      return;
    }
    static const std::vector<uint16_t> block = [] {
      std::vector<uint16_t> v(1 << 24);
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> dist(-1, 1);
      for (uint16_t& h : v) {
        const float f = dist(rng);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        h = static_cast<uint16_t>(u >> 16);
      }
      return v;
    }();
    for (size_t at = 0; at < bytes; at += block.size() * 2) {
      cudaMemcpy(static_cast<char*>(ptr) + at, block.data(), std::min(bytes - at, block.size() * 2),
                 cudaMemcpyHostToDevice);
    }
  }
  ~Buffer() { cudaFree(ptr); }
};

absl::StatusOr<double> TimeMs(GemmContext& ctx, const GemmDesc& d, const GemmBuffers& b, int iterations) {
  for (int i = 0; i < 3; ++i) {
    if (absl::Status s = ctx.Run(d, b, nullptr); !s.ok()) return s;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, nullptr);
  for (int i = 0; i < iterations; ++i) ctx.Run(d, b, nullptr).IgnoreError();
  cudaEventRecord(stop, nullptr);
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iterations;
}

int Main(int argc, char** argv) {
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "gemm_bench: no CUDA device\n");
    return 1;
  }
  const std::string cache_path = argc > 1 ? argv[1] : "gemm_tactics.json";
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(0);
  auto heuristic = GemmContext::Create();
  auto timed = GemmContext::Create({.tactic_cache_path = cache_path});
  if (!info.ok() || !heuristic.ok() || !timed.ok()) {
    std::fprintf(stderr, "gemm_bench: set-up failed\n");
    return 1;
  }
  const int64_t workspace_bytes = GemmWorkspaceBytes(info->compute_major);
  Buffer workspace(workspace_bytes, DType::kU8);
  std::printf("{\"bench\": \"gemm\", \"device\": \"%s\", \"workspace_bytes\": %lld}\n", info->name.c_str(),
              static_cast<long long>(workspace_bytes));
  for (const BenchCase& c : Cases()) {
    const GemmDesc& d = c.desc;
    Buffer a(d.m * d.k, d.input_type), b(d.k * d.n, d.input_type), out(d.m * d.n, d.output_type),
        bias(d.n, d.output_type), aux(d.m * d.n, d.output_type), bias_grad(std::max(d.m, d.n), d.output_type);
    const GemmBuffers buf{.a = a.ptr, .b = b.ptr, .c = out.ptr, .bias = bias.ptr, .aux = aux.ptr,
                          .bias_grad = bias_grad.ptr, .workspace = workspace.ptr,
                          .workspace_bytes = workspace_bytes};
    const double flop = 2.0 * d.m * d.n * d.k * d.batch;
    for (auto& [label, ctx] : {std::pair<const char*, GemmContext*>{"heuristic", heuristic->get()},
                               std::pair<const char*, GemmContext*>{"timed", timed->get()}}) {
      absl::StatusOr<GemmTactic> tactic = ctx->Prepare(d, buf, nullptr);
      absl::StatusOr<double> ms = tactic.ok() ? TimeMs(*ctx, d, buf, /*iterations=*/20) : tactic.status();
      std::printf("{\"name\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"in\": \"%s\", \"out\": \"%s\", "
                  "\"epilogue\": \"%s\", \"tactic\": \"%s\", ",
                  c.name.c_str(), static_cast<long long>(d.m), static_cast<long long>(d.n),
                  static_cast<long long>(d.k), std::string(ir::DTypeName(d.input_type)).c_str(),
                  std::string(ir::DTypeName(d.output_type)).c_str(), std::string(GemmEpilogueName(d.epilogue)).c_str(),
                  label);
      if (!ms.ok()) {
        std::printf("\"error\": \"%s\"}\n", std::string(ms.status().message()).c_str());
        continue;
      }
      std::printf("\"algo_id\": %d, \"ms\": %.4f, \"tflops\": %.1f}\n", tactic->algo_id, *ms, flop / (*ms * 1e9));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace onnxpipe::cuda

int main(int argc, char** argv) { return onnxpipe::cuda::Main(argc, argv); }
