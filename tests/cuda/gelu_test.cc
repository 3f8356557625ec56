// GELU on the GPU against a double-precision reference (both forms): fp32 within 2e-5 of the exact
// value and of dy times the finite-difference derivative; bf16 (inputs rounded to bf16) within one
// bf16 unit in the last place of the reference rounded to bf16, as the fp32 kernel rounded once.
#include "executor/cuda/gelu.h"

#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "executor/cuda/cuda_status.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"

namespace onnxpipe::cuda {
namespace {

using testing::Bf16Close;
using testing::DeviceBuffer;
using testing::Download;
using testing::Representable;
using testing::RoundToBf16;
using testing::Upload;

// Reference GELU in double precision, straight from the definitions.
double GeluRef(double x, bool tanh_approx) {
  if (tanh_approx) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
// dy times the central finite difference of GeluRef.
double GeluGradRef(double dy, double x, bool tanh_approx) {
  const double h = 1e-4;
  return dy * (GeluRef(x + h, tanh_approx) - GeluRef(x - h, tanh_approx)) / (2 * h);
}

class GeluCudaTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// x spans [-6, 6) over n elements; dy a slow sine. Values representable in T.
template <typename T>
void RunGelu(int64_t n, bool tanh_approx, std::vector<float>& x, std::vector<float>& dy, std::vector<float>& y,
             std::vector<float>& dx) {
  x.resize(n);
  dy.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = -6.f + 12.f * static_cast<float>(i) / n;
    dy[i] = std::sin(0.001f * i);
  }
  x = Representable<T>(x);
  dy = Representable<T>(dy);
  DeviceBuffer<T> x_dev(n), dy_dev(n), y_dev(n), dx_dev(n);
  Upload(x, x_dev);
  Upload(dy, dy_dev);
  ASSERT_TRUE(GeluForward<T>(x_dev.get(), y_dev.get(), n, tanh_approx, nullptr, nullptr, nullptr).ok());
  ASSERT_TRUE(GeluBackward<T>(dy_dev.get(), x_dev.get(), dx_dev.get(), n, tanh_approx, nullptr, nullptr, nullptr).ok());
  y = Download(y_dev);
  dx = Download(dx_dev);
}

TEST_P(GeluCudaTest, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  const bool tanh_approx = GetParam();
  std::vector<float> x, dy, y, dx;
  RunGelu<float>(1 << 20, tanh_approx, x, dy, y, dx);
  double max_err = 0, max_grad_err = 0;
  for (size_t i = 0; i < x.size(); i += 97) {
    max_err = std::max(max_err, std::abs(y[i] - GeluRef(x[i], tanh_approx)));
    max_grad_err = std::max(max_grad_err, std::abs(dx[i] - GeluGradRef(dy[i], x[i], tanh_approx)));
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_LT(max_grad_err, 2e-5);
}

TEST_P(GeluCudaTest, Bf16IsTheReferenceRoundedOnce) {
  const bool tanh_approx = GetParam();
  std::vector<float> x, dy, y, dx;
  RunGelu<__nv_bfloat16>(1 << 16, tanh_approx, x, dy, y, dx);
  std::vector<float> want_y(x.size()), want_dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    want_y[i] = static_cast<float>(GeluRef(x[i], tanh_approx));
    want_dx[i] = static_cast<float>(GeluGradRef(dy[i], x[i], tanh_approx));
  }
  EXPECT_TRUE(Bf16Close(y, RoundToBf16(want_y))) << "y";
  EXPECT_TRUE(Bf16Close(dx, RoundToBf16(want_dx))) << "dx";
}

TEST_P(GeluCudaTest, RejectsNegativeCount) {
  EXPECT_FALSE(GeluForward<float>(nullptr, nullptr, -1, GetParam(), nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(GeluBackward<__nv_bfloat16>(nullptr, nullptr, nullptr, -1, GetParam(), nullptr, nullptr, nullptr).ok());
}

// GeluBackwardWithSums (GeluGrad's dXSums): dx bitwise the plain backward's (with the same dropout:
// none, the forward's keep bits, or the regenerated stream), sums the double column sums of that dx
// within fp32 accumulation. (rows, cols) cover the fused path and, for bf16 with cols not a multiple
// of 8, the plain backward followed by a reduction.
template <typename T>
void CheckBackwardWithSums(int64_t rows, int64_t cols, bool tanh_approx, int keep_mode) {
  SCOPED_TRACE(::testing::Message() << rows << " x " << cols << (sizeof(T) == 2 ? " bf16" : " f32") << ", keep "
                                    << keep_mode);
  const int64_t n = rows * cols;
  DeviceBuffer<T> x_dev(n), dy_dev(n), y_dev(n), dx_dev(n), dx2_dev(n);
  Upload(Representable<T>(testing::Uniform(n, 3, -4.f, 4.f)), x_dev);
  Upload(Representable<T>(testing::Uniform(n, 4)), dy_dev);
  DropoutParams drop;
  drop.ratio = keep_mode == 0 ? 0.0 : 0.25;
  drop.seed = 17, drop.node_key = 5, drop.offset = 2;
  DeviceBuffer<uint8_t> bits(keep_mode == 1 ? n / 8 : 0);
  ASSERT_TRUE(GeluForward<T>(x_dev.get(), y_dev.get(), n, tanh_approx, &drop, bits.get(), nullptr).ok());
  ASSERT_TRUE(
      GeluBackward<T>(dy_dev.get(), x_dev.get(), dx_dev.get(), n, tanh_approx, &drop, bits.get(), nullptr).ok());
  DeviceBuffer<float> sums(cols), ws((GeluSumsWorkspaceBytes(rows, cols) + 3) / 4);
  ASSERT_TRUE(GeluBackwardWithSums<T>(dy_dev.get(), x_dev.get(), dx2_dev.get(), rows, cols, tanh_approx, &drop,
                                      bits.get(), ir::DType::kF32, sums.get(), ws.get(), nullptr)
                  .ok());
  const std::vector<float> dx = Download(dx_dev), dx2 = Download(dx2_dev), got = Download(sums);
  ASSERT_EQ(dx, dx2);
  for (int64_t c = 0; c < cols; ++c) {
    double want = 0, mag = 0;
    for (int64_t r = 0; r < rows; ++r) want += dx[r * cols + c], mag += std::abs(dx[r * cols + c]);
    ASSERT_NEAR(got[c], want, 1e-6 * mag + 1e-30) << "column " << c;
  }
}

TEST_P(GeluCudaTest, BackwardWithSumsIsTheBackwardAndItsColumnSums) {
  for (const int keep_mode : {0, 1, 2}) {
    CheckBackwardWithSums<float>(1000, 512, GetParam(), keep_mode);
    CheckBackwardWithSums<__nv_bfloat16>(3000, 1024, GetParam(), keep_mode);
    CheckBackwardWithSums<__nv_bfloat16>(37, 24, GetParam(), keep_mode);
    CheckBackwardWithSums<float>(9, 12, GetParam(), keep_mode == 1 ? 0 : keep_mode);          // bits need cols % 8
    CheckBackwardWithSums<__nv_bfloat16>(5, 12, GetParam(), keep_mode == 1 ? 0 : keep_mode);  // not fused
  }
}

INSTANTIATE_TEST_SUITE_P(ErfAndTanh, GeluCudaTest, ::testing::Bool());

}  // namespace
}  // namespace onnxpipe::cuda
