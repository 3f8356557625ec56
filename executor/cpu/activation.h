// The activation functions and their derivatives, one definition each, shared by the CPU kernels
// of Sigmoid, Gelu/GeluGrad and GatedActivation/GatedActivationGrad (op.h), in T's arithmetic.
#pragma once

#include <cmath>

namespace onnxpipe::cpu {

// Split on the sign so exp never overflows.
template <typename T>
T Sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

// silu(x) = x * sigmoid(x) (the exporters' Mul(x, Sigmoid(x))); silu'(x) = s (1 + x (1 - s)).
template <typename T>
T Silu(T x) {
  return x * Sigmoid(x);
}
template <typename T>
T SiluDerivative(T x) {
  const T s = Sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

// GELU as torch.nn.functional.gelu: exact, x * Phi(x), or with the tanh approximation
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
template <typename T>
T GeluErf(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
}
template <typename T>
T GeluTanh(T x) {
  const T c = static_cast<T>(0.79788456080286535587989211986876);  // sqrt(2/pi)
  return T(0.5) * x * (T(1) + std::tanh(c * (x + T(0.044715) * x * x * x)));
}
// Phi(x) + x phi(x).
template <typename T>
T GeluErfDerivative(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
  const T pdf = static_cast<T>(0.5 * M_2_SQRTPI * M_SQRT1_2) * std::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}
template <typename T>
T GeluTanhDerivative(T x) {
  const T c = static_cast<T>(0.79788456080286535587989211986876);
  const T t = std::tanh(c * (x + T(0.044715) * x * x * x));
  const T du = c * (T(1) + T(3) * T(0.044715) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

}  // namespace onnxpipe::cpu
