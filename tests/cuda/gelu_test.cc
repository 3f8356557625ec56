#include "executor/cuda/gelu.h"

#include <cmath>
#include <vector>

#include <cuda_runtime.h>

#include "executor/cuda/cuda_status.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda {
namespace {

// Reference GELU in double precision, straight from the definitions.
double GeluRef(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

class GeluCudaTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GeluCudaTest, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const bool tanh_approx = GetParam();
  const int64_t n = 1 << 20;
  std::vector<float> x(n), dy(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = -6.f + 12.f * static_cast<float>(i) / n;
    dy[i] = std::sin(0.001f * i);
  }
  float *dx_dev, *x_dev, *y_dev, *dy_dev;
  ASSERT_EQ(cudaMalloc(&x_dev, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y_dev, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy_dev, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dx_dev, n * 4), cudaSuccess);
  cudaMemcpy(x_dev, x.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dy_dev, dy.data(), n * 4, cudaMemcpyHostToDevice);
  ASSERT_TRUE(GeluForward(x_dev, y_dev, n, tanh_approx, nullptr).ok());
  ASSERT_TRUE(GeluBackward(dy_dev, x_dev, dx_dev, n, tanh_approx, nullptr).ok());
  std::vector<float> y(n), dx(n);
  cudaMemcpy(y.data(), y_dev, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(dx.data(), dx_dev, n * 4, cudaMemcpyDeviceToHost);
  for (float* p : {x_dev, y_dev, dy_dev, dx_dev}) cudaFree(p);

  double max_err = 0, max_grad_err = 0;
  for (int64_t i = 0; i < n; i += 97) {
    max_err = std::max(max_err, std::abs(y[i] - GeluRef(x[i], tanh_approx)));
    const double h = 1e-4;
    const double fd = (GeluRef(x[i] + h, tanh_approx) - GeluRef(x[i] - h, tanh_approx)) / (2 * h);
    max_grad_err = std::max(max_grad_err, std::abs(dx[i] - dy[i] * fd));
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_LT(max_grad_err, 2e-5);
}

TEST_P(GeluCudaTest, RejectsNegativeCount) {
  EXPECT_FALSE(GeluForward(nullptr, nullptr, -1, GetParam(), nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(ErfAndTanh, GeluCudaTest, ::testing::Bool());

}  // namespace
}  // namespace onnxpipe::cuda
