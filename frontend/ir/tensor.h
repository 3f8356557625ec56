// A dense, row-major tensor with shared (copy-on-write by convention) storage. Used for
// initializers, folded constants, attribute tensors and every backend's values.
//
// Placement: a tensor knows where its bytes live (ggml-backend's "a tensor carries its buffer").
// Host tensors are what the constructors make; a backend's buffers (executor/backend) are
// device-placed views. The host accessors (raw, data, GetAsDouble, Clone, ...) abort with a message
// on a device tensor: the driver moves device values to the host only through its backend's
// explicit copies. address() names a tensor's first byte on any placement (identity checks) and
// device_raw() hands it to the backend that owns it.
//
// Ownership: a tensor either owns its bytes (the constructors, Clone, CastTo: one allocation,
// counted by num_allocations()) or is a view into a buffer that someone else allocated (View: an
// executor's arena slot). Both hold a shared reference to the whole allocation, so a view keeps its
// buffer alive and can never dangle; whoever allocated the buffer decides when it may be reused
// (the stage executor gives a state storage of its own before updating it while another holds it).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "frontend/ir/dtype.h"

namespace onnxpipe::ir {

// Where a tensor's bytes live: host memory, or device `index` of a backend (its memory must not be
// read or written by host code).
struct Placement {
  enum class Kind : uint8_t { kHost, kDevice };
  Kind kind = Kind::kHost;
  int32_t index = 0;
  static Placement Host() { return {}; }
  static Placement Device(int32_t index) { return {Kind::kDevice, index}; }
  bool host() const { return kind == Kind::kHost; }
  bool operator==(const Placement& o) const { return kind == o.kind && index == o.index; }
  std::string ToString() const;
};

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

  // A view of `dims` elements of `dtype` starting `offset` bytes into `buffer` (not copied, not
  // zeroed, not counted). The caller guarantees offset + num_bytes() fits in the buffer.
  static Tensor View(DType dtype, std::vector<int64_t> dims, std::shared_ptr<uint8_t> buffer,
                     int64_t offset, Placement placement = Placement::Host());
  // A zero-filled buffer of `bytes` bytes aligned to 64, for executors' arenas and state buffers
  // (not counted by num_allocations()).
  static std::shared_ptr<uint8_t> AllocateBuffer(int64_t bytes);
  // Owning allocations made by the constructors, Clone and CastTo in this process so far: an
  // executor that must not allocate (the arena executor) checks that it does not move.
  static int64_t num_allocations();

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t rank() const { return static_cast<int64_t>(dims_.size()); }
  int64_t num_elements() const;
  int64_t num_bytes() const { return num_elements() * DTypeSize(dtype_); }
  bool defined() const { return data_ != nullptr || dims_only_; }
  // False for DimsOnly tensors (and undefined ones).
  bool has_data() const { return data_ != nullptr; }

  // True when no other tensor (no copy, view or reshape) shares this one's storage: writing it in
  // place then changes this tensor only.
  bool SoleOwner() const { return data_ != nullptr && data_.use_count() == 1; }

  Placement placement() const { return placement_; }
  bool on_host() const { return placement_.host(); }
  // The same storage and dims, placed as `p`: a backend presenting its own memory to host kernels
  // (a CPU-memory "device") or naming host memory as its own.
  Tensor WithPlacement(Placement p) const {
    Tensor t = *this;
    t.placement_ = p;
    return t;
  }

  // The first byte on any placement, for identity checks only (never dereference it on the host).
  const void* address() const { return data_.get(); }
  // The first byte for the backend that owns the tensor's memory (device kernels, copies).
  void* device_raw() const { return data_.get(); }
  // Host bytes; aborts naming the placement when the tensor is not on the host.
  const void* raw() const { return HostBytes(); }
  void* raw() { return HostBytes(); }
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

  // Same storage (a view of it), new dims (element count must match).
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
  void* HostBytes() const;

  DType dtype_ = DType::kF32;
  Placement placement_;
  std::vector<int64_t> dims_;
  // The first byte; shares ownership of the whole allocation (aliasing shared_ptr for views).
  std::shared_ptr<uint8_t> data_;
  bool dims_only_ = false;
};

// bf16/f16 conversions (round to nearest even).
float BF16ToFloat(uint16_t v);
uint16_t FloatToBF16(float f);
float F16ToFloat(uint16_t v);
uint16_t FloatToF16(float f);

}  // namespace onnxpipe::ir
