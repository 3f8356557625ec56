// Element types of IR values and tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace onnxpipe::ir {

#define ONNXPIPE_DTYPE_LIST(V) \
  V(kF32, "f32", 4)            \
  V(kF64, "f64", 8)            \
  V(kBF16, "bf16", 2)          \
  V(kF16, "f16", 2)            \
  V(kI64, "i64", 8)            \
  V(kI32, "i32", 4)            \
  V(kBool, "bool", 1)          \
  V(kU8, "u8", 1)              \
  V(kI8, "i8", 1)

enum class DType : uint8_t {
#define V(e, name, size) e,
  ONNXPIPE_DTYPE_LIST(V)
#undef V
};

std::string_view DTypeName(DType t);
int64_t DTypeSize(DType t);
std::optional<DType> ParseDType(std::string_view name);
inline bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}
inline bool IsInteger(DType t) {
  return t == DType::kI64 || t == DType::kI32 || t == DType::kU8 || t == DType::kI8;
}

// Compile-time mapping from C++ element types to DType.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kF32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kF64; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kI64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kI32; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kU8; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::kI8; };

}  // namespace onnxpipe::ir
