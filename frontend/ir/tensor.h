// A dense, row-major, host tensor with shared (copy-on-write by convention) storage. Used for
// initializers, folded constants, attribute tensors and the CPU backend's values.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "frontend/ir/dtype.h"

namespace onnxpipe::ir {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled tensor.
  Tensor(DType dtype, std::vector<int64_t> dims);

  template <typename T>
  static Tensor FromVector(std::vector<int64_t> dims, const std::vector<T>& values) {
    Tensor t(DTypeOf<T>::value, std::move(dims));
    if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < values.size() && i < static_cast<size_t>(t.num_elements()); ++i)
        t.mutable_data<bool>()[i] = values[i];
    } else {
      std::memcpy(t.raw(), values.data(), std::min<size_t>(values.size(), t.num_elements()) * sizeof(T));
    }
    return t;
  }
  template <typename T>
  static Tensor Scalar(T v) {
    return FromVector<T>({}, std::vector<T>{v});
  }

  // A tensor with a dtype and dims but no elements, for operands a kernel reads only for their
  // dims (the shape-only `like` inputs of op.h's gradient ops): defined() is true, has_data() false,
  // raw() null. It lets an executor free a buffer whose remaining readers need only its shape.
  // Reading its elements is a bug.
  static Tensor DimsOnly(DType dtype, std::vector<int64_t> dims);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t num_elements() const;
  int64_t num_bytes() const { return num_elements() * DTypeSize(dtype_); }
  bool defined() const { return storage_ != nullptr; }
  // False for DimsOnly tensors (and undefined ones).
  bool has_data() const { return storage_ != nullptr && (!storage_->empty() || num_bytes() == 0); }

  const void* raw() const { return storage_ ? storage_->data() : nullptr; }
  void* raw() { return storage_ ? storage_->data() : nullptr; }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw());
  }
  template <typename T>
  T* mutable_data() {
    return static_cast<T*>(raw());
  }

  // Element i converted to double / int64 (any dtype); for small constant tensors (shapes, axes).
  double GetAsDouble(int64_t i) const;
  int64_t GetAsInt(int64_t i) const;
  std::vector<int64_t> ToInt64Vector() const;

  // Same storage, new dims (element count must match).
  Tensor Reshaped(std::vector<int64_t> dims) const;
  // Deep copy.
  Tensor Clone() const;
  // Element-wise conversion to another dtype.
  Tensor CastTo(DType to) const;
  // True when dtype, dims and bytes are identical.
  bool BitwiseEquals(const Tensor& o) const;
  bool operator==(const Tensor& o) const { return BitwiseEquals(o); }
  std::string DebugString(int64_t max_elements = 8) const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<int64_t> dims_;
  std::shared_ptr<std::vector<uint8_t>> storage_;
};

// bf16/f16 conversions (round to nearest even).
float BF16ToFloat(uint16_t v);
uint16_t FloatToBF16(float f);
float F16ToFloat(uint16_t v);
uint16_t FloatToF16(float f);

}  // namespace onnxpipe::ir
