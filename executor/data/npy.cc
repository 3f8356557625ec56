// .npy reading and writing. The header is a Python dict literal; it is parsed by a small strict
// recursive-descent reader (strings, True/False, integers, tuples of integers) rather than by
// pattern matching, so that any deviation is reported precisely instead of misread.
#include "executor/data/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "executor/io/atomic_file.h"
#include "frontend/ir/status.h"

namespace onnxpipe::data {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr int kMaxRank = 64;
constexpr size_t kMaxHeaderLen = size_t{1} << 20;  // numpy itself refuses headers over 10 kB

struct DTypeCode {
  const char* descr;
  ir::DType dtype;
};
// What we write; on reading '<' and '|' are both accepted for one-byte types.
constexpr DTypeCode kCodes[] = {
    {"<f4", ir::DType::kF32}, {"<f8", ir::DType::kF64}, {"<i8", ir::DType::kI64}, {"<i4", ir::DType::kI32},
    {"<f2", ir::DType::kF16}, {"|b1", ir::DType::kBool}, {"|u1", ir::DType::kU8}, {"|i1", ir::DType::kI8},
};

std::string SupportedList() {
  std::string s;
  for (const DTypeCode& c : kCodes) s += std::string(s.empty() ? "" : " ") + "'" + c.descr + "'";
  return s;
}

absl::StatusOr<ir::DType> DTypeFromDescr(const std::string& descr, const std::string& name) {
  for (const DTypeCode& c : kCodes) {
    if (descr == c.descr) return c.dtype;
    if (c.descr[0] == '|' && descr.size() == 3 && descr[0] == '<' && descr.substr(1) == c.descr + 1) return c.dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    return INVALID_ARGUMENT() << name << ": big-endian dtype '" << descr
                              << "' is not supported; expected little-endian, one of " << SupportedList();
  }
  return INVALID_ARGUMENT() << name << ": unsupported dtype '" << descr << "'; expected one of " << SupportedList();
}

// --- header dict --------------------------------------------------------------------------------
using HeaderValue = std::variant<std::string, bool, int64_t, std::vector<int64_t>>;

class DictReader {
 public:
  DictReader(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  absl::StatusOr<std::map<std::string, HeaderValue>> Read() {
    std::map<std::string, HeaderValue> out;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{' opening the header dict");
    for (;;) {
      SkipSpace();
      if (Consume('}')) break;
      ASSIGN_OR_RETURN(std::string key, ReadString());
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after key '" + key + "'");
      SkipSpace();
      ASSIGN_OR_RETURN(HeaderValue v, ReadValue());
      if (!out.emplace(key, std::move(v)).second) return Error("key '" + key + "' appears twice");
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}' after the value of '" + key + "'");
    }
    SkipSpace();
    if (pos_ != s_.size()) return Error("unexpected text after the header dict");
    return out;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return INVALID_ARGUMENT() << name_ << ": malformed .npy header at offset " << pos_ << ": " << what
                              << " (header: " << std::string(s_.substr(0, 200)) << ")";
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool ConsumeWord(std::string_view w) {
    if (s_.substr(pos_, w.size()) == w) {
      pos_ += w.size();
      return true;
    }
    return false;
  }
  absl::StatusOr<std::string> ReadString() {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return Error("expected a quoted string");
    const char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') return Error("escape sequences are not supported in header strings");
      out += s_[pos_++];
    }
    if (!Consume(quote)) return Error("unterminated string");
    return out;
  }
  absl::StatusOr<int64_t> ReadInt() {
    const size_t start = pos_;
    int64_t v = 0;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) return Error("expected a non-negative integer");
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const int digit = s_[pos_] - '0';
      if (v > (INT64_MAX - digit) / 10) return Error("integer too large");
      v = v * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) return Error("expected an integer");
    Consume('L');  // Python 2 longs
    return v;
  }
  absl::StatusOr<HeaderValue> ReadValue() {
    if (pos_ >= s_.size()) return Error("expected a value");
    const char c = s_[pos_];
    if (c == '\'' || c == '"') {
      ASSIGN_OR_RETURN(std::string str, ReadString());
      return HeaderValue(std::move(str));
    }
    if (ConsumeWord("True")) return HeaderValue(true);
    if (ConsumeWord("False")) return HeaderValue(false);
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      std::vector<int64_t> items;
      for (;;) {
        SkipSpace();
        if (Consume(close)) break;
        if (items.size() >= kMaxRank) return Error("shape has more than " + std::to_string(kMaxRank) + " dims");
        ASSIGN_OR_RETURN(int64_t v, ReadInt());
        items.push_back(v);
        SkipSpace();
        if (Consume(',')) continue;
        SkipSpace();
        if (Consume(close)) break;
        return Error("expected ',' or the end of the shape tuple");
      }
      return HeaderValue(std::move(items));
    }
    if (c >= '0' && c <= '9') {
      ASSIGN_OR_RETURN(int64_t v, ReadInt());
      return HeaderValue(v);
    }
    return Error("unexpected character '" + std::string(1, c) + "'");
  }

  std::string_view s_;
  const std::string& name_;
  size_t pos_ = 0;
};

struct Header {
  ir::DType dtype;
  std::vector<int64_t> dims;
  int64_t num_elements = 0;
  int64_t data_bytes = 0;
  size_t data_offset = 0;
};

// Parses magic, version and header length from the first bytes of a file. Returns the total
// preamble length (magic + version + length field) and the header length.
absl::StatusOr<std::pair<size_t, size_t>> ParsePreamble(std::string_view b, const std::string& name) {
  if (b.size() < kMagicLen || std::memcmp(b.data(), kMagic, kMagicLen) != 0) {
    return INVALID_ARGUMENT() << name << ": not a .npy file (expected the magic bytes \\x93NUMPY at the start)";
  }
  if (b.size() < kMagicLen + 2) return INVALID_ARGUMENT() << name << ": truncated .npy preamble (no version)";
  const uint8_t major = static_cast<uint8_t>(b[6]), minor = static_cast<uint8_t>(b[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return INVALID_ARGUMENT() << name << ": unsupported .npy format version " << int(major) << "." << int(minor)
                              << "; expected 1.0, 2.0 or 3.0";
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (b.size() < 8 + len_bytes) return INVALID_ARGUMENT() << name << ": truncated .npy preamble (no header length)";
  size_t len = 0;
  for (size_t i = 0; i < len_bytes; ++i) len |= static_cast<size_t>(static_cast<uint8_t>(b[8 + i])) << (8 * i);
  if (len > kMaxHeaderLen) {
    return INVALID_ARGUMENT() << name << ": .npy header length " << len << " exceeds " << kMaxHeaderLen << " bytes";
  }
  return std::pair<size_t, size_t>{8 + len_bytes, len};
}

absl::StatusOr<Header> ParseHeader(std::string_view text, size_t data_offset, const std::string& name) {
  for (char ch : text) {
    if (static_cast<unsigned char>(ch) >= 0x80 || (ch < 0x20 && ch != '\n' && ch != '\t' && ch != '\r')) {
      return INVALID_ARGUMENT() << name << ": .npy header contains a non-ASCII or control byte";
    }
  }
  DictReader reader(text, name);
  ASSIGN_OR_RETURN(auto dict, reader.Read());
  for (const auto& [k, v] : dict) {
    if (k != "descr" && k != "fortran_order" && k != "shape") {
      return INVALID_ARGUMENT() << name << ": unexpected key '" << k
                                << "' in the .npy header; expected exactly descr, fortran_order, shape";
    }
  }
  auto descr = dict.find("descr");
  auto fortran = dict.find("fortran_order");
  auto shape = dict.find("shape");
  if (descr == dict.end() || fortran == dict.end() || shape == dict.end()) {
    return INVALID_ARGUMENT() << name << ": the .npy header lacks one of the keys descr, fortran_order, shape";
  }
  const auto* descr_s = std::get_if<std::string>(&descr->second);
  const auto* fortran_b = std::get_if<bool>(&fortran->second);
  const auto* shape_v = std::get_if<std::vector<int64_t>>(&shape->second);
  if (!descr_s) return INVALID_ARGUMENT() << name << ": .npy descr must be a dtype string such as '<f4' (structured dtypes are not supported)";
  if (!fortran_b) return INVALID_ARGUMENT() << name << ": .npy fortran_order must be True or False";
  if (!shape_v) return INVALID_ARGUMENT() << name << ": .npy shape must be a tuple of integers";
  if (*fortran_b) {
    return INVALID_ARGUMENT() << name << ": fortran_order is True; only C-order arrays are supported "
                              << "(save np.ascontiguousarray(a))";
  }
  Header h;
  ASSIGN_OR_RETURN(h.dtype, DTypeFromDescr(*descr_s, name));
  h.dims = *shape_v;
  const int64_t esize = ir::DTypeSize(h.dtype);
  int64_t n = 1;
  bool zero = false;
  for (int64_t d : h.dims) zero |= d == 0;
  for (int64_t d : h.dims) {
    if (zero) break;
    if (n > (INT64_MAX / esize) / d) {
      return INVALID_ARGUMENT() << name << ": .npy shape overflows: its element count exceeds 2^63 bytes";
    }
    n *= d;
  }
  h.num_elements = zero ? 0 : n;
  h.data_bytes = h.num_elements * esize;
  h.data_offset = data_offset;
  return h;
}

std::string ShapeString(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

absl::Status CheckDataSize(const Header& h, uint64_t available, const std::string& name) {
  if (available != static_cast<uint64_t>(h.data_bytes)) {
    return INVALID_ARGUMENT() << name << ": .npy data has " << available << " bytes, expected " << h.data_bytes
                              << " for shape " << ShapeString(h.dims) << " of dtype "
                              << ir::DTypeName(h.dtype) << (available < static_cast<uint64_t>(h.data_bytes)
                                                                ? " (file truncated?)"
                                                                : " (trailing bytes)");
  }
  return absl::OkStatus();
}

absl::Status CheckBools(const ir::Tensor& t, const std::string& name) {
  if (t.dtype() != ir::DType::kBool) return absl::OkStatus();
  const auto* p = static_cast<const uint8_t*>(t.raw());
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (p[i] > 1) {
      return INVALID_ARGUMENT() << name << ": bool element " << i << " has byte value " << int(p[i])
                                << "; expected 0 or 1";
    }
  }
  return absl::OkStatus();
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

absl::StatusOr<ir::Tensor> ParseNpy(std::string_view bytes, const std::string& name) {
  ASSIGN_OR_RETURN(auto pre, ParsePreamble(bytes, name));
  const auto [pre_len, header_len] = pre;
  if (bytes.size() - pre_len < header_len) {
    return INVALID_ARGUMENT() << name << ": truncated .npy header: " << bytes.size() - pre_len
                              << " bytes after the preamble, expected " << header_len;
  }
  ASSIGN_OR_RETURN(Header h, ParseHeader(bytes.substr(pre_len, header_len), pre_len + header_len, name));
  RETURN_IF_ERROR(CheckDataSize(h, bytes.size() - h.data_offset, name));
  ir::Tensor t(h.dtype, h.dims);
  if (h.data_bytes > 0) std::memcpy(t.raw(), bytes.data() + h.data_offset, h.data_bytes);
  RETURN_IF_ERROR(CheckBools(t, name));
  return t;
}

absl::StatusOr<ir::Tensor> ReadNpy(const std::string& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    if (err == ENOENT) return NOT_FOUND() << path << ": no such .npy file";
    return INVALID_ARGUMENT() << path << ": cannot open: " << std::strerror(err);
  }
  if (std::fseek(f.get(), 0, SEEK_END) != 0) return INVALID_ARGUMENT() << path << ": cannot seek (not a regular file?)";
  const long size_l = std::ftell(f.get());
  if (size_l < 0) return INVALID_ARGUMENT() << path << ": cannot determine the file size";
  const uint64_t size = static_cast<uint64_t>(size_l);
  std::rewind(f.get());
  // Preamble and header first; the data goes straight into the tensor once its size is checked.
  std::string head(std::min<uint64_t>(size, 12), '\0');
  if (std::fread(head.data(), 1, head.size(), f.get()) != head.size()) return INVALID_ARGUMENT() << path << ": read error";
  ASSIGN_OR_RETURN(auto pre, ParsePreamble(head, path));
  const auto [pre_len, header_len] = pre;
  if (size - pre_len < header_len) {
    return INVALID_ARGUMENT() << path << ": truncated .npy header: " << size - pre_len
                              << " bytes after the preamble, expected " << header_len;
  }
  std::string header(header_len, '\0');
  if (std::fseek(f.get(), static_cast<long>(pre_len), SEEK_SET) != 0 ||
      std::fread(header.data(), 1, header_len, f.get()) != header_len) {
    return INVALID_ARGUMENT() << path << ": read error in the .npy header";
  }
  ASSIGN_OR_RETURN(Header h, ParseHeader(header, pre_len + header_len, path));
  RETURN_IF_ERROR(CheckDataSize(h, size - h.data_offset, path));
  ir::Tensor t(h.dtype, h.dims);
  if (h.data_bytes > 0 && std::fread(t.raw(), 1, h.data_bytes, f.get()) != static_cast<size_t>(h.data_bytes)) {
    return INVALID_ARGUMENT() << path << ": read error in the .npy data";
  }
  RETURN_IF_ERROR(CheckBools(t, path));
  return t;
}

absl::StatusOr<std::string> SerializeNpy(const ir::Tensor& t) {
  const char* descr = nullptr;
  for (const DTypeCode& c : kCodes) {
    if (c.dtype == t.dtype()) descr = c.descr;
  }
  if (descr == nullptr) {
    return INVALID_ARGUMENT() << "cannot write a " << ir::DTypeName(t.dtype())
                              << " tensor as .npy; supported dtypes: f32 f64 i64 i32 f16 bool u8 i8";
  }
  if (!t.defined()) return INVALID_ARGUMENT() << "cannot write an undefined tensor as .npy";
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " +
                     ShapeString(t.dims()) + ", }";
  // numpy pads with spaces and ends with '\n' so that the data starts on a 64-byte boundary.
  size_t len_bytes = 2, major = 1;
  if (10 + dict.size() + 1 > 65535) {
    len_bytes = 4;
    major = 2;
  }
  const size_t pre = 8 + len_bytes;
  const size_t total = (pre + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  out += dict;
  out.append(static_cast<const char*>(t.raw()), static_cast<size_t>(t.num_bytes()));
  return out;
}

absl::Status WriteNpy(const std::string& path, const ir::Tensor& t) {
  absl::StatusOr<std::string> bytes = SerializeNpy(t);
  if (!bytes.ok()) return Annotate(bytes.status(), path);
  absl::Status st = io::WriteFileAtomically(path, *bytes);
  if (!st.ok()) return Annotate(st, "writing " + path);
  return absl::OkStatus();
}

}  // namespace onnxpipe::data
