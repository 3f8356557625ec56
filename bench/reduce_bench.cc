// Bandwidth of ReduceToShapeOf (executor/cuda/reduce.h, the gradient of a broadcast) over leading,
// middle and trailing axes against a device-to-device copy of the same input bytes: time per call
// (CUDA events, median of 5 runs of 20 calls after warm-up), GB/s counting the input read once and
// the output written once (the copy: its input read and written), and the ratio of the two.
// Workspace as the backend gives it (ReduceWorkspaceBytes). Not a test.
// Usage: reduce_bench [out.json]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "executor/cuda/reduce.h"

namespace onnxpipe::cuda {
namespace {

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

void* Alloc(int64_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes > 0 ? bytes : 1) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %lld bytes failed\n", static_cast<long long>(bytes));
    std::exit(1);
  }
  cudaMemset(p, 0, bytes > 0 ? bytes : 1);
  return p;
}

std::string DimsText(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + ")";
}

// One row: ReduceToShapeOf(x (in), like) in `dtype`, and the copy of x's bytes.
std::string Bench(const char* what, ir::DType dtype, const std::vector<int64_t>& in, const std::vector<int64_t>& like) {
  auto plan = MakeReduceToShapePlan(in, like);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s\n", std::string(plan.status().message()).c_str());
    std::exit(1);
  }
  const int64_t e = ir::DTypeSize(dtype);
  const int64_t in_bytes = plan->num_out * plan->num_reduced * e, out_bytes = plan->num_out * e;
  const int64_t ws_bytes = ReduceWorkspaceBytes(*plan, dtype);
  void *x = Alloc(in_bytes), *y = Alloc(out_bytes), *copy = Alloc(in_bytes), *ws = Alloc(ws_bytes);
  const double ms = TimeMs([&] { return Reduce(ReduceKind::kSum, *plan, dtype, x, dtype, y, nullptr, ws, ws_bytes); });
  const double copy_ms = TimeMs([&] {
    cudaMemcpyAsync(copy, x, in_bytes, cudaMemcpyDeviceToDevice, nullptr);
    return absl::OkStatus();
  });
  const double gbs = (in_bytes + out_bytes) / (ms * 1e-3) / 1e9, copy_gbs = 2.0 * in_bytes / (copy_ms * 1e-3) / 1e9;
  const std::string shape = DimsText(in) + " -> " + DimsText(like) + " " + std::string(ir::DTypeName(dtype));
  std::printf("%-12s %-46s %8.1f us %6.0f GB/s | copy %7.1f us %6.0f GB/s | %.2f of copy, ws %.1f MB\n", what,
              shape.c_str(), ms * 1e3, gbs, copy_ms * 1e3, copy_gbs, gbs / copy_gbs, ws_bytes / 1e6);
  for (void* p : {x, y, copy, ws}) cudaFree(p);
  char row[512];
  std::snprintf(row, sizeof(row),
                "  {\"case\": \"%s\", \"shape\": \"%s\", \"us\": %.1f, \"gb_s\": %.0f, \"copy_us\": %.1f, "
                "\"copy_gb_s\": %.0f, \"of_copy\": %.2f, \"workspace_mb\": %.2f}",
                what, shape.c_str(), ms * 1e3, gbs, copy_ms * 1e3, copy_gbs, gbs / copy_gbs, ws_bytes / 1e6);
  return row;
}

}  // namespace
}  // namespace onnxpipe::cuda

int main(int argc, char** argv) {
  using namespace onnxpipe::cuda;
  using onnxpipe::ir::DType;
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "reduce_bench: no CUDA device\n");
    return 1;
  }
  auto info = GetDeviceInfo(0);
  const std::string device = info.ok() ? info->name : "?";
  std::printf("device: %s\n", device.c_str());
  std::vector<std::string> rows;
  for (DType t : {DType::kBF16, DType::kF32}) {
    // Llama GQA repeat_kv gradient (B 8, Hkv 4, n_rep 4, S 1024, Dh 128) and a wider repeat.
    rows.push_back(Bench("middle", t, {8, 4, 4, 1024, 128}, {8, 4, 1, 1024, 128}));
    rows.push_back(Bench("middle", t, {4, 8, 8, 2048, 64}, {4, 8, 1, 2048, 64}));
    rows.push_back(Bench("middle", t, {8, 2, 2, 512, 64}, {8, 2, 1, 512, 64}));
    // Bias gradients: leading axes.
    rows.push_back(Bench("leading", t, {8, 1024, 2048}, {2048}));
    rows.push_back(Bench("leading", t, {256, 256, 1024}, {1024}));
    rows.push_back(Bench("leading", t, {8, 1024, 32000}, {32000}));
    // Trailing axes and everything.
    rows.push_back(Bench("trailing", t, {8192, 2048}, {8192, 1}));
    rows.push_back(Bench("trailing", t, {65536, 256}, {65536, 1}));
    rows.push_back(Bench("all", t, {16 << 20}, {}));
    // Two reduced groups: (B, H, S, Dh) -> (1, H, 1, Dh), a per-head broadcast's gradient.
    rows.push_back(Bench("mixed", t, {64, 16, 1024, 64}, {1, 16, 1, 64}));
  }
  if (argc > 1) {
    FILE* f = std::fopen(argv[1], "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "{\n \"benchmark\": \"reduce_bench (bench/reduce_bench.cc)\",\n \"device\": \"%s\",\n",
                 device.c_str());
    std::fprintf(f,
                 " \"method\": \"ReduceToShapeOf sum with the backend's workspace; GB/s = (input + output bytes) / "
                 "time; copy = cudaMemcpyAsync device-to-device of the input bytes, GB/s = 2 x bytes / time; CUDA "
                 "events, median of 5 x 20 calls\",\n \"rows\": [\n");
    for (size_t i = 0; i < rows.size(); ++i) std::fprintf(f, "%s%s\n", rows[i].c_str(), i + 1 < rows.size() ? "," : "");
    std::fprintf(f, " ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
