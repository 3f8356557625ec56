// Test support for the CUDA kernel tests: a fixture that skips without a GPU, device copies of
// ir::Tensors, and the normalised error used for 16-bit results.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/tensor.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda::testing {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// A device buffer of a tensor's dtype and dims; frees itself.
class DeviceTensor {
 public:
  DeviceTensor(ir::DType dtype, std::vector<int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
    const size_t b = bytes();
    EXPECT_EQ(cudaMalloc(&ptr_, b > 0 ? b : 1), cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0, b > 0 ? b : 1), cudaSuccess);
  }
  explicit DeviceTensor(const ir::Tensor& t) : DeviceTensor(t.dtype(), t.dims()) {
    EXPECT_EQ(cudaMemcpy(ptr_, t.raw(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(ptr_); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return static_cast<size_t>(n * ir::DTypeSize(dtype_));
  }
  // Synchronises and copies the contents back.
  ir::Tensor ToHost() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ir::Tensor t(dtype_, dims_);
    EXPECT_EQ(cudaMemcpy(t.raw(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return t;
  }

 private:
  ir::DType dtype_;
  std::vector<int64_t> dims_;
  void* ptr_ = nullptr;
};

// ||got - want|| / ||want|| over all elements, both read as double.
inline double NormalisedError(const ir::Tensor& got, const ir::Tensor& want) {
  EXPECT_EQ(got.num_elements(), want.num_elements());
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.num_elements() && i < got.num_elements(); ++i) {
    const double d = got.GetAsDouble(i) - want.GetAsDouble(i);
    num += d * d;
    den += want.GetAsDouble(i) * want.GetAsDouble(i);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Largest |got - want| / max(|want|, floor) over all elements.
inline double MaxRelError(const ir::Tensor& got, const ir::Tensor& want, double floor = 1e-30) {
  EXPECT_EQ(got.num_elements(), want.num_elements());
  double worst = 0;
  for (int64_t i = 0; i < want.num_elements() && i < got.num_elements(); ++i) {
    const double w = want.GetAsDouble(i), g = got.GetAsDouble(i);
    if (std::isnan(w) || std::isnan(g)) {
      if (std::isnan(w) != std::isnan(g)) return INFINITY;
      continue;
    }
    if (w == g) continue;
    worst = std::max(worst, std::fabs(g - w) / std::max(std::fabs(w), floor));
  }
  return worst;
}

}  // namespace onnxpipe::cuda::testing
