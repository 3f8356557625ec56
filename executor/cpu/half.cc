#include "executor/cpu/half.h"

#include "executor/cpu/thread_pool.h"

namespace onnxpipe::cpu {
namespace {
constexpr int64_t kGrain = 1 << 15;
}  // namespace

void WidenHalf(const ir::Tensor& x, ir::Tensor& out) {
  const ir::DType half = x.dtype();
  const uint16_t* s = x.data<uint16_t>();
  float* d = out.mutable_data<float>();
  ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = HalfToFloat(half, s[i]);
  });
}

void RoundToHalf(const ir::Tensor& x, ir::Tensor& out) {
  const ir::DType half = out.dtype();
  const float* s = x.data<float>();
  uint16_t* d = out.mutable_data<uint16_t>();
  ParallelFor(x.num_elements(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = FloatToHalf(half, s[i]);
  });
}

}  // namespace onnxpipe::cpu
