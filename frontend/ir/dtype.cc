#include "frontend/ir/dtype.h"

namespace onnxpipe::ir {

std::string_view DTypeName(DType t) {
  switch (t) {
#define V(e, name, size) \
  case DType::e:         \
    return name;
    ONNXPIPE_DTYPE_LIST(V)
#undef V
  }
  return "?";
}

int64_t DTypeSize(DType t) {
  switch (t) {
#define V(e, name, size) \
  case DType::e:         \
    return size;
    ONNXPIPE_DTYPE_LIST(V)
#undef V
  }
  return 0;
}

std::optional<DType> ParseDType(std::string_view name) {
#define V(e, n, size) \
  if (name == n) return DType::e;
  ONNXPIPE_DTYPE_LIST(V)
#undef V
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "fp64" || name == "float64") return DType::kF64;
  if (name == "fp16" || name == "float16") return DType::kF16;
  return std::nullopt;
}

}  // namespace onnxpipe::ir
