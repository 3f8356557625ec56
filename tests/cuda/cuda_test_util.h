// Helpers for the CUDA kernel tests: device buffers, host bf16 rounding, CPU-backend evaluation
// of one IR node, deterministic inputs and error measures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "frontend/ir/graph.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda::testing {

// Round to nearest even, as __float2bfloat16_rn (finite inputs).
inline uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::vector<float> RoundToBf16(std::vector<float> v) {
  for (float& f : v) f = Bf16ToFloat(Bf16Bits(f));
  return v;
}
// Values exactly representable in T (float: unchanged).
template <typename T>
std::vector<float> Representable(std::vector<float> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return RoundToBf16(std::move(v));
  return v;
}

// Owns `n` elements of device memory; null for n == 0.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t n) : n_(n) {
    if (n > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, n * sizeof(T)), cudaSuccess);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  int64_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  int64_t n_ = 0;
};

// Host floats -> device T (bf16 rounded to nearest even).
template <typename T>
void Upload(const std::vector<float>& host, DeviceBuffer<T>& dev) {
  ASSERT_EQ(static_cast<int64_t>(host.size()), dev.size());
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    std::vector<uint16_t> bits(host.size());
    for (size_t i = 0; i < host.size(); ++i) bits[i] = Bf16Bits(host[i]);
    ASSERT_EQ(cudaMemcpy(dev.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  } else {
    ASSERT_EQ(cudaMemcpy(dev.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
}
template <typename T>
std::vector<float> Download(const DeviceBuffer<T>& dev) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> host(dev.size());
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    std::vector<uint16_t> bits(dev.size());
    EXPECT_EQ(cudaMemcpy(bits.data(), dev.get(), bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < bits.size(); ++i) host[i] = Bf16ToFloat(bits[i]);
  } else {
    EXPECT_EQ(cudaMemcpy(host.data(), dev.get(), host.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}
template <typename T>
void UploadRaw(const std::vector<T>& host, DeviceBuffer<T>& dev) {
  ASSERT_EQ(static_cast<int64_t>(host.size()), dev.size());
  ASSERT_EQ(cudaMemcpy(dev.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
}

inline std::vector<float> Uniform(int64_t n, uint32_t seed, float lo = -2.f, float hi = 2.f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& f : v) f = dist(gen);
  return v;
}

// --- CPU backend ------------------------------------------------------------------------------
inline ir::Tensor F32(std::vector<int64_t> dims, const std::vector<float>& v) {
  return ir::Tensor::FromVector<float>(std::move(dims), v);
}
inline std::vector<float> Floats(const ir::Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.num_elements());
}
// Evaluates one node of `op` on the CPU backend: inputs are values 0..n-1, outputs the next ones.
inline std::vector<ir::Tensor> CpuEval(ir::OpKind op, const std::vector<ir::Tensor>& inputs, int num_outputs,
                                       ir::Attrs attrs = {}) {
  ir::Node node;
  node.op = op;
  node.name = "reference";
  for (size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back(static_cast<int>(i));
  for (int i = 0; i < num_outputs; ++i) node.outputs.push_back(static_cast<int>(inputs.size()) + i);
  node.attrs = std::move(attrs);
  auto r = cpu::CpuEvaluator().Evaluate(node, inputs);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<ir::Tensor>(num_outputs);
}

// --- error measures ---------------------------------------------------------------------------
// ||got - want||_2 / ||want||_2 (absolute when want is all zeros).
inline double NormalisedError(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
// Every |got - want| <= rtol * (|want| + max|want|): relative error against the element, floored
// at the tensor's scale (so values near zero after cancellation are judged against that scale).
inline ::testing::AssertionResult AllClose(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double ratio = err / (rtol * (std::abs(static_cast<double>(want[i])) + scale) + 1e-30);
    if (!(ratio <= worst_ratio)) {  // also catches NaN
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst << ": got " << got[worst] << ", want " << want[worst]
                                       << " (error " << worst_ratio << "x the tolerance " << rtol
                                       << " relative to |want| + " << scale << ")";
}

// bf16 results against a reference already rounded to bf16 (the fp32 kernel on bf16-rounded
// inputs, its result rounded once): every element within `ulps` bf16 units in the last place of
// the reference, or within `floor` times the reference's largest magnitude (results that cancel
// to near zero), and the normalised error at most `max_nerr`. NaN must meet NaN. A failure names
// the first and the worst offending elements, the max absolute and the normalised error.
inline ::testing::AssertionResult Bf16Close(const std::vector<float>& got, const std::vector<float>& want,
                                            double ulps = 1, double floor = 1e-3, double max_nerr = 1e-2) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  double scale = 0, max_abs = 0, worst_ratio = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(static_cast<double>(w)));
  int64_t first = -1, worst = -1, bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) {
        ++bad;
        if (first < 0) first = static_cast<int64_t>(i);
        worst = static_cast<int64_t>(i), worst_ratio = INFINITY;
      }
      continue;
    }
    const double err = g == w ? 0.0 : std::abs(g - w);  // equal infinities
    max_abs = std::max(max_abs, err);
    const double ulp = w == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(w) - 7);
    const double ratio = err / std::max(ulps * ulp, floor * scale + 1e-38);
    if (ratio > 1) {
      ++bad;
      if (first < 0) first = static_cast<int64_t>(i);
    }
    if (ratio > worst_ratio) worst_ratio = ratio, worst = static_cast<int64_t>(i);
  }
  const double nerr = NormalisedError(got, want);
  if (bad == 0 && nerr <= max_nerr) return ::testing::AssertionSuccess();
  ::testing::AssertionResult r = ::testing::AssertionFailure();
  r << bad << " of " << want.size() << " elements beyond " << ulps << " bf16 ulp (or " << floor
    << " x max|want| = " << floor * scale << "); max |got - want| " << max_abs << ", normalised error " << nerr
    << " (limit " << max_nerr << ")";
  if (first >= 0) r << "; first bad element " << first << ": got " << got[first] << ", want " << want[first];
  if (worst >= 0) r << "; worst element " << worst << ": got " << got[worst] << ", want " << want[worst];
  return r;
}

}  // namespace onnxpipe::cuda::testing
