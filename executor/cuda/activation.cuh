// The activation functions and their derivatives on the device (.cu files only), in fp32, one
// definition each for the kernel families that use them: Sigmoid (elementwise.cu), Gelu/GeluGrad
// (gelu.cu) and GatedActivation/GatedActivationGrad (gated_activation.cu).
#pragma once

#include <cuda_runtime.h>

namespace onnxpipe::cuda {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kTanhC = 0.79788456080286536f;  // sqrt(2 / pi)

// Split on the sign so that expf never overflows.
__device__ __forceinline__ float SigmoidValue(float x) {
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

// silu(x) = x sigmoid(x), silu'(x) = s (1 + x (1 - s)).
__device__ __forceinline__ float SiluValue(float x) { return x * SigmoidValue(x); }
__device__ __forceinline__ float SiluDerivative(float x) {
  const float s = SigmoidValue(x);
  return s * (1.f + x * (1.f - s));
}

// x Phi(x) (erf), or 0.5 x (1 + tanh(c (x + 0.044715 x^3))) (tanh_approx).
__device__ __forceinline__ float GeluValue(float x, bool tanh_approx) {
  if (tanh_approx) return 0.5f * x * (1.f + tanhf(kTanhC * (x + 0.044715f * x * x * x)));
  return 0.5f * x * (1.f + erff(x * kInvSqrt2));
}

__device__ __forceinline__ float GeluDerivative(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float inner = kTanhC * (x + 0.044715f * x * x * x);
    const float t = tanhf(inner);
    const float dinner = kTanhC * (1.f + 3.f * 0.044715f * x * x);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * dinner;
  }
  const float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * __expf(-0.5f * x * x);
  return cdf + x * pdf;
}

}  // namespace onnxpipe::cuda
