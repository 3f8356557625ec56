#include "frontend/ir/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>

namespace onnxpipe::ir {
namespace {

std::atomic<int64_t> g_allocations{0};

constexpr std::align_val_t kBufferAlignment{64};
constexpr size_t kMappedBytes = size_t{1} << 20;  // page-aligned, so 64-byte aligned too

// A failed buffer allocation that says how much was asked for: callers that catch std::bad_alloc (the command's
// top level, which turns it into an error instead of an abort) print what().
class BufferAllocationFailed : public std::bad_alloc {
 public:
  explicit BufferAllocationFailed(size_t bytes)
      : what_("allocating a tensor buffer of " + std::to_string(bytes) + " bytes of host memory failed") {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

}  // namespace

std::shared_ptr<uint8_t> Tensor::AllocateBuffer(int64_t bytes) {
  // At least one byte, so that an empty tensor still has a (non-null) data pointer.
  const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  // Large buffers are fresh pages from the kernel: already zero, resident only once written (a rank's zeroed
  // optimizer state of stages it does not run never is), and returned to the system when freed.
  if (n >= kMappedBytes) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw BufferAllocationFailed(n);
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(m), [n](uint8_t* q) { munmap(q, n); });
  }
  uint8_t* p = nullptr;
  try {
    p = static_cast<uint8_t*>(::operator new[](n, kBufferAlignment));
  } catch (const std::bad_alloc&) {
    throw BufferAllocationFailed(n);
  }
  std::memset(p, 0, n);
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { ::operator delete[](q, kBufferAlignment); });
}

int64_t Tensor::num_allocations() { return g_allocations.load(std::memory_order_relaxed); }

Tensor::Tensor(DType dtype, std::vector<int64_t> dims) : dtype_(dtype), dims_(std::move(dims)) {
  data_ = AllocateBuffer(num_bytes());
  g_allocations.fetch_add(1, std::memory_order_relaxed);
}

Tensor Tensor::DimsOnly(DType dtype, std::vector<int64_t> dims) {
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.dims_only_ = true;
  return t;
}

std::string Placement::ToString() const {
  return host() ? "host" : "device " + std::to_string(index);
}

void* Tensor::HostBytes() const {
  if (!placement_.host()) [[unlikely]] {
    std::fprintf(stderr, "onnxpipe: host access to a tensor on %s (%s): a driver bug; device values reach the "
                 "host only through the backend's copies\n", placement_.ToString().c_str(), std::string(DTypeName(dtype_)).c_str());
    std::abort();
  }
  return data_.get();
}

Tensor Tensor::View(DType dtype, std::vector<int64_t> dims, std::shared_ptr<uint8_t> buffer,
                    int64_t offset, Placement placement) {
  Tensor t;
  t.placement_ = placement;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  uint8_t* first = buffer.get() + offset;
  t.data_ = std::shared_ptr<uint8_t>(std::move(buffer), first);
  return t;
}

int64_t Tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

double Tensor::GetAsDouble(int64_t i) const {
  switch (dtype_) {
    case DType::kF32: return data<float>()[i];
    case DType::kF64: return data<double>()[i];
    case DType::kBF16: return BF16ToFloat(data<uint16_t>()[i]);
    case DType::kF16: return F16ToFloat(data<uint16_t>()[i]);
    case DType::kI64: return static_cast<double>(data<int64_t>()[i]);
    case DType::kI32: return data<int32_t>()[i];
    case DType::kBool: return data<bool>()[i] ? 1.0 : 0.0;
    case DType::kU8: return data<uint8_t>()[i];
    case DType::kI8: return data<int8_t>()[i];
  }
  return 0;
}

int64_t Tensor::GetAsInt(int64_t i) const {
  switch (dtype_) {
    case DType::kI64: return data<int64_t>()[i];
    case DType::kI32: return data<int32_t>()[i];
    case DType::kBool: return data<bool>()[i];
    case DType::kU8: return data<uint8_t>()[i];
    case DType::kI8: return data<int8_t>()[i];
    default: return static_cast<int64_t>(GetAsDouble(i));
  }
}

std::vector<int64_t> Tensor::ToInt64Vector() const {
  std::vector<int64_t> out(num_elements());
  for (int64_t i = 0; i < num_elements(); ++i) out[i] = GetAsInt(i);
  return out;
}

Tensor Tensor::Reshaped(std::vector<int64_t> dims) const {
  Tensor t = *this;
  t.dims_ = std::move(dims);
  return t;
}

Tensor Tensor::Clone() const {
  if (!has_data()) return *this;
  Tensor t(dtype_, dims_);
  if (num_bytes() > 0) std::memcpy(t.raw(), raw(), num_bytes());
  return t;
}

namespace {
template <typename T>
void StoreAs(Tensor& t, int64_t i, double v) {
  t.mutable_data<T>()[i] = static_cast<T>(v);
}
}  // namespace

Tensor Tensor::CastTo(DType to) const {
  if (to == dtype_) return Clone();
  Tensor out(to, dims_);
  const bool int_path = IsInteger(dtype_) || dtype_ == DType::kBool;
  for (int64_t i = 0; i < num_elements(); ++i) {
    switch (to) {
      case DType::kF32: StoreAs<float>(out, i, GetAsDouble(i)); break;
      case DType::kF64: StoreAs<double>(out, i, GetAsDouble(i)); break;
      case DType::kBF16: out.mutable_data<uint16_t>()[i] = FloatToBF16(GetAsDouble(i)); break;
      case DType::kF16: out.mutable_data<uint16_t>()[i] = FloatToF16(GetAsDouble(i)); break;
      case DType::kI64:
        out.mutable_data<int64_t>()[i] = int_path ? GetAsInt(i) : static_cast<int64_t>(GetAsDouble(i));
        break;
      case DType::kI32: out.mutable_data<int32_t>()[i] = static_cast<int32_t>(GetAsInt(i)); break;
      case DType::kBool: out.mutable_data<bool>()[i] = GetAsDouble(i) != 0.0; break;
      case DType::kU8: out.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(GetAsInt(i)); break;
      case DType::kI8: out.mutable_data<int8_t>()[i] = static_cast<int8_t>(GetAsInt(i)); break;
    }
  }
  return out;
}

bool Tensor::BitwiseEquals(const Tensor& o) const {
  if (dtype_ != o.dtype_ || dims_ != o.dims_) return false;
  if (num_bytes() == 0) return true;
  return std::memcmp(raw(), o.raw(), num_bytes()) == 0;
}

std::string Tensor::DebugString(int64_t max_elements) const {
  std::ostringstream os;
  os << DTypeName(dtype_) << "[";
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? "," : "") << dims_[i];
  os << "]";
  if (!placement_.host()) return os.str() + " on " + placement_.ToString();
  os << "{";
  for (int64_t i = 0; i < std::min(num_elements(), max_elements); ++i) os << (i ? ", " : "") << GetAsDouble(i);
  if (num_elements() > max_elements) os << ", ...";
  return os.str() + "}";
}

float BF16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return 0x7fc0;  // NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float F16ToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, mant = x & 0x7fffff;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  if (((x >> 23) & 0xff) == 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  if (exp >= 31) return sign | 0x7c00;
  if (exp <= 0) {
    if (exp < -10) return sign;
    mant |= 0x800000;
    uint32_t shift = 14 - exp;
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | half;
  }
  uint32_t half = sign | (exp << 10) | (mant >> 13), rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return half;
}

}  // namespace onnxpipe::ir
