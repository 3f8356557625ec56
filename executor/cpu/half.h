// The half-precision types (bf16, f16) on the CPU backend. Its kernels compute in f32 (or f64); a
// node that reads half-precision activations is evaluated through f32 copies of them and its float
// outputs are rounded to the half type (cpu_evaluator.cc), as the GPU kernels compute: f32 inside,
// half in memory. Cast converts directly.
#pragma once

#include <cstdint>

#include "frontend/ir/tensor.h"

namespace onnxpipe::cpu {

inline float HalfToFloat(ir::DType half, uint16_t v) {
  return half == ir::DType::kBF16 ? ir::BF16ToFloat(v) : ir::F16ToFloat(v);
}
// Round to nearest even; a finite value beyond the type's range becomes an infinity (as CUDA's
// __float2bfloat16 and PyTorch's .to(torch.bfloat16)).
inline uint16_t FloatToHalf(ir::DType half, float f) {
  return half == ir::DType::kBF16 ? ir::FloatToBF16(f) : ir::FloatToF16(f);
}

// out (f32, same dims) = x (bf16 | f16) widened; in parallel.
void WidenHalf(const ir::Tensor& x, ir::Tensor& out);
// out (bf16 | f16, same dims) = x (f32) rounded; in parallel.
void RoundToHalf(const ir::Tensor& x, ir::Tensor& out);

}  // namespace onnxpipe::cpu
