// TensorProto decoding. Everything here runs on untrusted bytes, so no allocation happens before
// the data that would fill it has been seen to exist (inline bytes or a side file long enough):
// a tensor declaring 2^40 elements with no data is refused without allocating anything.
#include "frontend/onnx/tensor_proto.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "frontend/ir/status.h"

namespace onnxpipe::onnx_frontend {
namespace {

namespace fs = std::filesystem;
using onnx::TensorProto;

// raw_data is little-endian by the ONNX spec; ir::Tensor is host-endian.
static_assert(std::endian::native == std::endian::little,
              "the ONNX importer assumes a little-endian host");

std::string DimsString(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// Reads exactly `n` bytes at `offset` of `path` into `dst`.
absl::Status ReadFileRange(const std::string& path, int64_t offset, int64_t n, void* dst,
                           const std::string& tensor_name) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return NOT_FOUND() << "external data file '" << path << "' of tensor '" << tensor_name
                       << "' cannot be opened: " << std::strerror(errno);
  }
  char* out = static_cast<char*>(dst);
  int64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<int64_t>(n - done, int64_t{1} << 30));
    ssize_t got = ::pread(fd, out + done, chunk, offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ::close(fd);
      return INVALID_ARGUMENT() << "external data file '" << path << "' of tensor '" << tensor_name
                                << "' ended after " << (offset + done) << " bytes; expected "
                                << n << " bytes at offset " << offset;
    }
    done += got;
  }
  ::close(fd);
  return absl::OkStatus();
}

// Large external tensors at 64-byte aligned offsets are mapped from their file instead of read: copy-on-write
// private pages, resident only once touched, so a process that drops the tensors it does not use (a pipeline rank
// keeps its own stage's) never reads them. Writes (an optimizer updating a parameter in place) stay in the process;
// onnxpipe's own writers replace files by rename, so a mapped file is never rewritten under its readers.
constexpr int64_t kMapBytes = int64_t{1} << 20;

// `n` bytes at `offset` of `path` as a tensor buffer (the mapping lives as long as the buffer), or null when the
// range is not worth or not fit for mapping, or the mapping fails (the caller then reads the range).
std::shared_ptr<uint8_t> MapFileRange(const std::string& path, int64_t offset, int64_t n, int64_t* delta) {
  if (n < kMapBytes || offset % 64 != 0) return std::shared_ptr<uint8_t>();
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t start = offset / page * page;
  *delta = offset - start;
  const size_t len = static_cast<size_t>(*delta + n);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::shared_ptr<uint8_t>();  // ReadFileRange names the problem
  void* m = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(start));
  ::close(fd);
  if (m == MAP_FAILED) return std::shared_ptr<uint8_t>();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(m), [len](uint8_t* q) { ::munmap(q, len); });
}

// Copies a typed repeated field into the tensor, converting each element with `conv`.
template <typename Dst, typename Field, typename Conv>
void CopyTyped(const Field& field, ir::Tensor& t, Conv conv) {
  Dst* out = t.mutable_data<Dst>();
  for (int i = 0; i < field.size(); ++i) out[i] = conv(field.Get(i));
}

}  // namespace

absl::StatusOr<ir::DType> DTypeFromOnnx(int32_t elem_type) {
  switch (elem_type) {
    case TensorProto::FLOAT: return ir::DType::kF32;
    case TensorProto::DOUBLE: return ir::DType::kF64;
    case TensorProto::FLOAT16: return ir::DType::kF16;
    case TensorProto::BFLOAT16: return ir::DType::kBF16;
    case TensorProto::INT64: return ir::DType::kI64;
    case TensorProto::INT32: return ir::DType::kI32;
    case TensorProto::INT8: return ir::DType::kI8;
    case TensorProto::UINT8: return ir::DType::kU8;
    case TensorProto::BOOL: return ir::DType::kBool;
    default:
      return INVALID_ARGUMENT() << "element type " << OnnxTypeName(elem_type)
                                << " is not supported (supported: FLOAT, DOUBLE, FLOAT16, "
                                   "BFLOAT16, INT64, INT32, INT8, UINT8, BOOL)";
  }
}

int32_t OnnxFromDType(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kF32: return TensorProto::FLOAT;
    case ir::DType::kF64: return TensorProto::DOUBLE;
    case ir::DType::kF16: return TensorProto::FLOAT16;
    case ir::DType::kBF16: return TensorProto::BFLOAT16;
    case ir::DType::kI64: return TensorProto::INT64;
    case ir::DType::kI32: return TensorProto::INT32;
    case ir::DType::kI8: return TensorProto::INT8;
    case ir::DType::kU8: return TensorProto::UINT8;
    case ir::DType::kBool: return TensorProto::BOOL;
  }
  return TensorProto::UNDEFINED;
}

std::string OnnxTypeName(int32_t elem_type) {
  if (onnx::TensorProto_DataType_IsValid(elem_type)) {
    return onnx::TensorProto_DataType_Name(static_cast<TensorProto::DataType>(elem_type));
  }
  return absl::StrCat(elem_type);
}

absl::StatusOr<int64_t> CheckedElementCount(absl::Span<const int64_t> dims,
                                            const std::string& what) {
  int64_t n = 1;
  bool zero = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    if (d < 0) {
      return INVALID_ARGUMENT() << what << " has a negative dimension " << d << " (dim " << i
                                << " of " << DimsString(dims) << ")";
    }
    if (d > kMaxElements) {
      return INVALID_ARGUMENT() << what << " has an absurd dimension " << d << " (dim " << i
                                << " of " << DimsString(dims) << "; limit 2^40)";
    }
    if (d == 0) zero = true;
    if (!zero && n > kMaxElements / std::max<int64_t>(d, 1)) {
      return INVALID_ARGUMENT() << what << " has dims " << DimsString(dims)
                                << " whose element count exceeds 2^40";
    }
    n = zero ? 0 : n * d;
  }
  if (n > kMaxElements) {
    return INVALID_ARGUMENT() << what << " has dims " << DimsString(dims)
                              << " whose element count exceeds 2^40";
  }
  return n;
}

absl::StatusOr<std::string> ResolveExternalPath(const std::string& base_dir,
                                                const std::string& location,
                                                const std::string& tensor_name) {
  const std::string what = absl::StrCat("external data of tensor '", tensor_name, "'");
  if (location.empty()) return INVALID_ARGUMENT() << what << " has an empty location";
  if (location.find('\0') != std::string::npos) {
    return INVALID_ARGUMENT() << what << " has a location containing a NUL byte";
  }
  if (base_dir.empty()) {
    return INVALID_ARGUMENT() << what << " ('" << location
                              << "') needs the model's folder, and this model has none "
                                 "(loaded from memory without a base directory)";
  }
  const fs::path loc(location);
  if (loc.is_absolute() || loc.has_root_directory() || loc.has_root_name()) {
    return INVALID_ARGUMENT() << what << " uses the absolute path '" << location
                              << "'; only paths relative to the model's folder are allowed";
  }
  const fs::path norm = loc.lexically_normal();
  if (norm.empty() || norm == "." || *norm.begin() == "..") {
    return INVALID_ARGUMENT() << what << " location '" << location
                              << "' escapes the model's folder";
  }
  std::error_code ec;
  const fs::path base = fs::canonical(base_dir, ec);
  if (ec) {
    return NOT_FOUND() << what << ": model folder '" << base_dir << "' not found";
  }
  const fs::path full = base / norm;
  if (!fs::exists(full, ec)) {
    return NOT_FOUND() << what << ": file '" << full.string() << "' not found";
  }
  const fs::path real = fs::canonical(full, ec);
  if (ec) {
    return NOT_FOUND() << what << ": file '" << full.string() << "' cannot be resolved";
  }
  auto [bi, ri] = std::mismatch(base.begin(), base.end(), real.begin(), real.end());
  if (bi != base.end()) {
    return INVALID_ARGUMENT() << what << " location '" << location << "' resolves to '"
                              << real.string() << "', outside the model's folder '"
                              << base.string() << "' (symlink?)";
  }
  if (!fs::is_regular_file(real, ec)) {
    return INVALID_ARGUMENT() << what << ": '" << real.string() << "' is not a regular file";
  }
  return real.string();
}

absl::StatusOr<ExternalData> ParseExternalData(const TensorProto& t, const std::string& base_dir) {
  ExternalData ext;
  bool has_location = false;
  for (const auto& entry : t.external_data()) {
    const std::string& key = entry.key();
    if (key == "location") {
      ext.location = entry.value();
      has_location = true;
    } else if (key == "offset" || key == "length") {
      int64_t v = 0;
      if (!absl::SimpleAtoi(entry.value(), &v) || v < 0) {
        return INVALID_ARGUMENT() << "external data of tensor '" << t.name() << "' has " << key
                                  << " '" << entry.value() << "'; expected a non-negative integer";
      }
      (key == "offset" ? ext.offset : ext.length) = v;
    }
  }
  if (!has_location) {
    return INVALID_ARGUMENT() << "tensor '" << t.name()
                              << "' is stored externally but has no 'location' entry";
  }
  ASSIGN_OR_RETURN(ext.path, ResolveExternalPath(base_dir, ext.location, t.name()));
  return ext;
}

absl::StatusOr<TensorLayout> InspectTensorProto(const TensorProto& t,
                                               const std::string& base_dir) {
  const std::string what = absl::StrCat("tensor '", t.name(), "'");
  auto dtype_or = DTypeFromOnnx(t.data_type());
  if (!dtype_or.ok()) return Annotate(dtype_or.status(), what);
  TensorLayout L;
  L.dtype = *dtype_or;
  if (t.has_segment()) return INVALID_ARGUMENT() << what << " is segmented (not supported)";
  L.dims.assign(t.dims().begin(), t.dims().end());
  ASSIGN_OR_RETURN(L.num_elements, CheckedElementCount(L.dims, what));
  L.num_bytes = L.num_elements * ir::DTypeSize(L.dtype);
  const std::string shape_desc =
      absl::StrCat(DimsString(L.dims), " of ", OnnxTypeName(t.data_type()));

  // Which typed fields carry data; exactly one may, and it must be the dtype's own.
  struct Field {
    const char* name;
    int size;
  };
  const Field fields[] = {{"float_data", t.float_data_size()},   {"int32_data", t.int32_data_size()},
                          {"string_data", t.string_data_size()}, {"int64_data", t.int64_data_size()},
                          {"double_data", t.double_data_size()}, {"uint64_data", t.uint64_data_size()}};
  const char* expected_field = "";
  switch (L.dtype) {
    case ir::DType::kF32: expected_field = "float_data"; break;
    case ir::DType::kF64: expected_field = "double_data"; break;
    case ir::DType::kI64: expected_field = "int64_data"; break;
    default: expected_field = "int32_data"; break;  // i32, i8, u8, bool, f16/bf16 bit patterns
  }
  int typed_count = -1;
  for (const Field& f : fields) {
    if (f.size == 0) continue;
    if (std::strcmp(f.name, expected_field) != 0 || typed_count >= 0) {
      return INVALID_ARGUMENT() << what << " (" << OnnxTypeName(t.data_type()) << ") has data in "
                                << f.name << "; expected " << expected_field << " or raw_data";
    }
    typed_count = f.size;
  }

  if (t.has_data_location() && t.data_location() == TensorProto::EXTERNAL) {
    if (typed_count >= 0 || t.has_raw_data()) {
      return INVALID_ARGUMENT() << what << " is stored externally but also has inline data";
    }
    L.source = TensorLayout::kExternal;
    ASSIGN_OR_RETURN(L.external, ParseExternalData(t, base_dir));
    const ExternalData& ext = L.external;
    if (ext.length >= 0 && ext.length != L.num_bytes) {
      return INVALID_ARGUMENT() << what << " external data in '" << ext.path << "' has length "
                                << ext.length << " bytes; dims " << shape_desc << " need "
                                << L.num_bytes << " bytes";
    }
    struct stat st;
    if (::stat(ext.path.c_str(), &st) != 0) {
      return NOT_FOUND() << what << ": external data file '" << ext.path << "' not found";
    }
    const int64_t size = st.st_size;
    if (ext.offset > size || L.num_bytes > size - ext.offset) {
      return INVALID_ARGUMENT() << what << ": external data file '" << ext.path << "' has " << size
                                << " bytes; the tensor needs " << L.num_bytes
                                << " bytes at offset " << ext.offset << " (past the end)";
    }
    return L;
  }
  if (t.has_raw_data()) {
    if (typed_count >= 0) {
      return INVALID_ARGUMENT() << what << " has both raw_data and " << expected_field;
    }
    if (static_cast<int64_t>(t.raw_data().size()) != L.num_bytes) {
      return INVALID_ARGUMENT() << what << " has " << t.raw_data().size()
                                << " bytes of raw_data; dims " << shape_desc << " need "
                                << L.num_bytes << " bytes";
    }
    L.source = TensorLayout::kRaw;
    return L;
  }
  const int64_t count = std::max(typed_count, 0);
  if (count != L.num_elements) {
    return INVALID_ARGUMENT() << what << " has " << count << " elements in " << expected_field
                              << "; dims " << shape_desc << " need " << L.num_elements;
  }
  L.source = TensorLayout::kTyped;
  return L;
}

absl::StatusOr<ir::Tensor> TensorFromProto(const TensorProto& t, const std::string& base_dir,
                                           std::string* external_file) {
  ASSIGN_OR_RETURN(TensorLayout L, InspectTensorProto(t, base_dir));
  if (L.source == TensorLayout::kExternal) {  // the file's size was checked against the range
    int64_t delta = 0;
    std::shared_ptr<uint8_t> mapped = MapFileRange(L.external.path, L.external.offset, L.num_bytes, &delta);
    if (mapped != nullptr) {
      if (external_file) *external_file = L.external.path;
      return ir::Tensor::View(L.dtype, L.dims, std::move(mapped), delta);
    }
  }
  // Allocation happens only now, once the data that fills it is known to exist.
  ir::Tensor out(L.dtype, L.dims);
  const int64_t n = L.num_elements;
  switch (L.source) {
    case TensorLayout::kExternal:
      RETURN_IF_ERROR(
          ReadFileRange(L.external.path, L.external.offset, L.num_bytes, out.raw(), t.name()));
      if (external_file) *external_file = L.external.path;
      break;
    case TensorLayout::kRaw:
      if (L.num_bytes > 0) std::memcpy(out.raw(), t.raw_data().data(), L.num_bytes);
      break;
    case TensorLayout::kTyped:
      if (n == 0) break;
      switch (L.dtype) {
        case ir::DType::kF32:
          CopyTyped<float>(t.float_data(), out, [](float v) { return v; });
          break;
        case ir::DType::kF64:
          CopyTyped<double>(t.double_data(), out, [](double v) { return v; });
          break;
        case ir::DType::kI64:
          CopyTyped<int64_t>(t.int64_data(), out, [](int64_t v) { return v; });
          break;
        case ir::DType::kI32:
          CopyTyped<int32_t>(t.int32_data(), out, [](int32_t v) { return v; });
          break;
        case ir::DType::kI8:
          CopyTyped<int8_t>(t.int32_data(), out, [](int32_t v) { return static_cast<int8_t>(v); });
          break;
        case ir::DType::kU8:
          CopyTyped<uint8_t>(t.int32_data(), out,
                             [](int32_t v) { return static_cast<uint8_t>(v); });
          break;
        case ir::DType::kBool:
          CopyTyped<uint8_t>(t.int32_data(), out, [](int32_t v) { return uint8_t{v != 0}; });
          break;
        case ir::DType::kF16:
        case ir::DType::kBF16:  // int32_data holds the 16-bit patterns
          CopyTyped<uint16_t>(t.int32_data(), out,
                              [](int32_t v) { return static_cast<uint16_t>(v); });
          break;
      }
      break;
  }
  if (L.dtype == ir::DType::kBool) {  // any non-zero byte is true; C++ bool must be 0 or 1
    uint8_t* b = static_cast<uint8_t*>(out.raw());
    for (int64_t i = 0; i < n; ++i) b[i] = b[i] != 0;
  }
  return out;
}

absl::StatusOr<DeclaredType> DeclaredTypeFromProto(const onnx::TypeProto& type,
                                                   const std::string& value_name) {
  DeclaredType out;
  if (type.value_case() == onnx::TypeProto::VALUE_NOT_SET) return out;
  if (!type.has_tensor_type()) {
    return INVALID_ARGUMENT() << "value '" << value_name
                              << "' has a non-tensor type (sequence, map, optional or sparse "
                                 "tensor), which is not supported";
  }
  const onnx::TypeProto::Tensor& tt = type.tensor_type();
  if (tt.elem_type() != TensorProto::UNDEFINED) {
    auto dt = DTypeFromOnnx(tt.elem_type());
    if (!dt.ok()) return Annotate(dt.status(), absl::StrCat("value '", value_name, "'"));
    out.dtype = *dt;
    out.has_dtype = true;
  }
  if (!tt.has_shape()) return out;
  out.has_shape = true;
  std::vector<int64_t> concrete;
  for (const auto& d : tt.shape().dim()) {
    if (d.has_dim_value()) {
      concrete.push_back(d.dim_value());
      out.shape.push_back(ir::Dim(d.dim_value()));
    } else if (d.has_dim_param() && !d.dim_param().empty()) {
      out.shape.push_back(ir::Dim::Symbol(d.dim_param()));
    } else {
      out.shape.push_back(ir::Dim::Unknown());
    }
  }
  RETURN_IF_ERROR(
      CheckedElementCount(concrete, absl::StrCat("value '", value_name, "'")).status());
  return out;
}

}  // namespace onnxpipe::onnx_frontend
