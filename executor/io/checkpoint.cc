// Checkpoint (de)serialisation. Tensors are streamed straight from/to their storage (no whole-file buffer), which
// matters at the headline model's size: 323M parameters plus AdamW moments are ~3.9 GB of fp32. The small CRC over
// header+metadata+index lets the loader validate the index (bounds, sizes) before allocating anything from it; the
// trailer CRC then covers every byte, tensor data included.
#include "executor/io/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "executor/io/atomic_file.h"
#include "executor/io/crc32c.h"
#include "frontend/ir/align.h"
#include "frontend/ir/status.h"

namespace onnxpipe::io {
namespace {

constexpr char kMagic[8] = {'O', 'N', 'N', 'X', 'P', 'C', 'K', 'P'};
constexpr char kEndMagic[4] = {'O', 'P', 'C', 'E'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint64_t kHeaderSize = 64;
constexpr uint64_t kTrailerSize = 8;
constexpr uint64_t kAlign = 64;

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Bounds-checked little-endian reader over an in-memory byte range.
class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}
  bool U8(uint8_t* v) { return Fixed(v, 1); }
  bool U32(uint32_t* v) { return Fixed(v, 4); }
  bool U64(uint64_t* v) { return Fixed(v, 8); }
  bool Bytes(size_t n, std::string_view* out) {
    if (bytes_.size() - pos_ < n) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  template <typename T>
  bool Fixed(T* v, size_t n) {
    if (bytes_.size() - pos_ < n) return false;
    uint64_t r = 0;
    for (size_t i = 0; i < n; ++i) r |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    *v = static_cast<T>(r);
    pos_ += n;
    return true;
  }
  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Corrupt(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat("checkpoint '", path, "' is corrupt: ", what));
}

// Reads exactly n bytes or reports how the file ended.
absl::Status ReadExact(int fd, const std::string& path, void* dst, uint64_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n > (1u << 30) ? (1u << 30) : n);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("cannot read checkpoint '", path, "': ", std::strerror(errno)));
    }
    if (r == 0) return Corrupt(path, "unexpected end of file (was it truncated while being read?)");
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// absl 20220623's StrCat takes absl::string_view, which here is not std::string_view.
std::string DTypeStr(ir::DType t) { return std::string(ir::DTypeName(t)); }

std::string Hex32(uint32_t v) { return absl::StrFormat("0x%08x", v); }

std::string DimsString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) absl::StrAppend(&s, i ? "," : "", dims[i]);
  return s + "]";
}

nlohmann::json MetadataToJson(const CheckpointMetadata& m) {
  nlohmann::json hp = nlohmann::json::object();
  for (const auto& [k, v] : m.hyperparameters) hp[k] = v;
  return {
      {"schema_version", m.schema_version},
      {"step", m.step},
      {"epoch", m.epoch},
      {"data_position", m.data_position},
      {"rng", {{"seed", m.rng_seed}, {"offset", m.rng_offset}}},
      {"optimizer", {{"name", m.optimizer}, {"hyperparameters", hp}}},
      {"model", {{"size", m.model.size}, {"crc32c", m.model.crc32c}}},
      {"extra", m.extra},
  };
}

absl::StatusOr<CheckpointMetadata> MetadataFromJson(const std::string& path, std::string_view text) {
  CheckpointMetadata m;
  try {
    nlohmann::json j = nlohmann::json::parse(text.begin(), text.end());
    m.schema_version = j.at("schema_version").get<int64_t>();
    if (m.schema_version > kCheckpointSchemaVersion) {
      return absl::UnimplementedError(absl::StrCat("checkpoint '", path, "' has metadata schema_version ",
                                                   m.schema_version, "; this build reads up to ",
                                                   kCheckpointSchemaVersion, " (written by a newer onnxpipe?)"));
    }
    m.step = j.at("step").get<int64_t>();
    m.epoch = j.at("epoch").get<int64_t>();
    m.data_position = j.at("data_position").get<int64_t>();
    m.rng_seed = j.at("rng").at("seed").get<uint64_t>();
    m.rng_offset = j.at("rng").at("offset").get<uint64_t>();
    m.optimizer = j.at("optimizer").at("name").get<std::string>();
    for (const auto& [k, v] : j.at("optimizer").at("hyperparameters").items()) m.hyperparameters[k] = v.get<double>();
    m.model.size = j.at("model").at("size").get<uint64_t>();
    m.model.crc32c = j.at("model").at("crc32c").get<uint32_t>();
    m.extra = j.value("extra", nlohmann::json::object());
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(path, absl::StrCat("metadata JSON: ", e.what()));
  }
  return m;
}

}  // namespace

std::string ModelFingerprint::ToString() const { return absl::StrCat(size, " bytes, crc32c ", Hex32(crc32c)); }

absl::StatusOr<ModelFingerprint> FingerprintFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open model file '", path, "' to fingerprint it: ", std::strerror(errno)));
  }
  ModelFingerprint fp;
  std::vector<char> buf(1 << 20);
  while (true) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot read model file '", path, "': ", std::strerror(errno)));
    }
    if (r == 0) break;
    fp.crc32c = Crc32cExtend(fp.crc32c, buf.data(), static_cast<size_t>(r));
    fp.size += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return fp;
}

const ir::Tensor* Checkpoint::Find(std::string_view name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

absl::Status SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  // Phase 1: validate and lay out. Index entries are fixed-width apart from names, so the layout is known before
  // any byte is written.
  std::set<std::string_view> names;
  for (const NamedTensor& t : checkpoint.tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "': empty tensor name"));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "': duplicate tensor name '", t.name, "'"));
    }
    if (!t.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "': tensor '", t.name, "' is undefined"));
    }
  }
  std::string metadata = MetadataToJson(checkpoint.metadata).dump();
  uint64_t index_size = 0;
  for (const NamedTensor& t : checkpoint.tensors) {
    index_size += 4 + t.name.size() + 1 + ir::DTypeName(t.tensor.dtype()).size() + 4 + 8 * t.tensor.rank() + 16;
  }
  const uint64_t metadata_offset = kHeaderSize;
  const uint64_t index_offset = metadata_offset + metadata.size();
  const uint64_t prefix_end = index_offset + index_size;  // the prefix CRC follows
  std::vector<uint64_t> offsets;
  uint64_t pos = prefix_end + 4;
  for (const NamedTensor& t : checkpoint.tensors) {
    pos = static_cast<uint64_t>(ir::AlignUp(static_cast<int64_t>(pos), kAlign));
    offsets.push_back(pos);
    pos += static_cast<uint64_t>(t.tensor.num_bytes());
  }
  const uint64_t file_size = pos + kTrailerSize;

  std::string prefix;
  prefix.append(kMagic, sizeof(kMagic));
  PutU32(&prefix, kFormatVersion);
  PutU32(&prefix, 0);
  PutU64(&prefix, file_size);
  PutU64(&prefix, metadata_offset);
  PutU64(&prefix, metadata.size());
  PutU64(&prefix, index_offset);
  PutU64(&prefix, index_size);
  PutU64(&prefix, checkpoint.tensors.size());
  RET_CHECK(prefix.size() == kHeaderSize);
  prefix += metadata;
  for (size_t i = 0; i < checkpoint.tensors.size(); ++i) {
    const NamedTensor& t = checkpoint.tensors[i];
    std::string_view dtype = ir::DTypeName(t.tensor.dtype());
    PutU32(&prefix, static_cast<uint32_t>(t.name.size()));
    prefix += t.name;
    PutU8(&prefix, static_cast<uint8_t>(dtype.size()));
    prefix.append(dtype.data(), dtype.size());
    PutU32(&prefix, static_cast<uint32_t>(t.tensor.rank()));
    for (int64_t d : t.tensor.dims()) PutU64(&prefix, static_cast<uint64_t>(d));
    PutU64(&prefix, offsets[i]);
    PutU64(&prefix, static_cast<uint64_t>(t.tensor.num_bytes()));
  }
  RET_CHECK(prefix.size() == prefix_end);
  PutU32(&prefix, Crc32c(prefix));

  // Phase 2: stream it out, extending the whole-file CRC as bytes go.
  ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> w, AtomicFileWriter::Open(path));
  uint32_t crc = 0;
  auto emit = [&](const void* data, size_t n) {
    crc = Crc32cExtend(crc, data, n);
    return w->Write(data, n);
  };
  RETURN_IF_ERROR(emit(prefix.data(), prefix.size()));
  static const char kZeros[kAlign] = {};
  for (size_t i = 0; i < checkpoint.tensors.size(); ++i) {
    RET_CHECK(offsets[i] >= w->bytes_written() && offsets[i] - w->bytes_written() < kAlign);
    RETURN_IF_ERROR(emit(kZeros, offsets[i] - w->bytes_written()));
    const ir::Tensor& t = checkpoint.tensors[i].tensor;
    if (t.num_bytes() > 0) RETURN_IF_ERROR(emit(t.raw(), static_cast<size_t>(t.num_bytes())));
  }
  std::string trailer;
  PutU32(&trailer, crc);
  trailer.append(kEndMagic, sizeof(kEndMagic));
  RETURN_IF_ERROR(w->Write(trailer));
  RET_CHECK(w->bytes_written() == file_size);
  return w->Commit();
}

namespace {

struct IndexEntry {
  std::string name;
  ir::DType dtype;
  std::vector<int64_t> dims;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

absl::StatusOr<std::vector<IndexEntry>> ParseIndex(const std::string& path, std::string_view index,
                                                   uint64_t num_tensors, uint64_t data_begin, uint64_t data_end) {
  std::vector<IndexEntry> entries;
  ByteReader r(index);
  uint64_t prev_end = data_begin;
  for (uint64_t i = 0; i < num_tensors; ++i) {
    IndexEntry e;
    uint32_t name_len, rank;
    uint8_t dtype_len;
    std::string_view name, dtype;
    auto bad = [&](const std::string& what) {
      return Corrupt(path, absl::StrCat("index entry ", i, e.name.empty() ? "" : " ('" + e.name + "')", ": ", what));
    };
    if (!r.U32(&name_len) || !r.Bytes(name_len, &name)) return bad("name runs past the index");
    e.name = std::string(name);
    if (!r.U8(&dtype_len) || !r.Bytes(dtype_len, &dtype)) return bad("dtype runs past the index");
    std::optional<ir::DType> dt = ir::ParseDType(std::string_view(dtype.data(), dtype.size()));
    if (!dt) return bad(absl::StrCat("unknown dtype '", std::string(dtype), "'"));
    e.dtype = *dt;
    if (!r.U32(&rank) || rank > 64) return bad("bad rank");
    uint64_t elements = 1;
    for (uint32_t k = 0; k < rank; ++k) {
      uint64_t d;
      if (!r.U64(&d)) return bad("dims run past the index");
      if (d > data_end || (d != 0 && elements > data_end / d)) return bad("dims larger than the file");
      elements *= d;
      e.dims.push_back(static_cast<int64_t>(d));
    }
    if (!r.U64(&e.offset) || !r.U64(&e.bytes)) return bad("offset runs past the index");
    if (e.bytes != elements * static_cast<uint64_t>(ir::DTypeSize(e.dtype))) {
      return bad(absl::StrCat(e.bytes, " data bytes for ", DimsString(e.dims), " ", DTypeStr(e.dtype)));
    }
    if (e.offset < prev_end || e.offset % kAlign != 0 || e.offset - prev_end >= kAlign || e.bytes > data_end ||
        e.offset > data_end - e.bytes) {
      return bad(absl::StrCat("data range [", e.offset, ", +", e.bytes, ") outside [", prev_end, ", ", data_end,
                              ") or misaligned"));
    }
    prev_end = e.offset + e.bytes;
    entries.push_back(std::move(e));
  }
  if (!r.done()) return Corrupt(path, "index has trailing bytes");
  if (prev_end != data_end)
    return Corrupt(path, absl::StrCat("tensor data ends at ", prev_end, ", expected ", data_end));
  return entries;
}

}  // namespace

namespace {
absl::StatusOr<Checkpoint> LoadOneFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat("cannot open checkpoint '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", path, "' is not a regular file"));
  }
  const uint64_t actual_size = static_cast<uint64_t>(st.st_size);

  // Header.
  std::string header(kHeaderSize, '\0');
  uint64_t head_len = std::min<uint64_t>(actual_size, kHeaderSize);
  RETURN_IF_ERROR(ReadExact(fd, path, header.data(), head_len));
  if (head_len < sizeof(kMagic) || std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not an onnxpipe checkpoint (bad magic; expected \"",
                                            std::string(kMagic, sizeof(kMagic)), "\")"));
  }
  if (head_len < kHeaderSize) {
    return Corrupt(path,
                   absl::StrCat("truncated: ", actual_size, " bytes, shorter than the ", kHeaderSize, "-byte header"));
  }
  ByteReader hr(std::string_view(header).substr(sizeof(kMagic)));
  uint32_t version, flags;
  uint64_t file_size, metadata_offset, metadata_size, index_offset, index_size, num_tensors;
  hr.U32(&version);
  hr.U32(&flags);
  hr.U64(&file_size);
  hr.U64(&metadata_offset);
  hr.U64(&metadata_size);
  hr.U64(&index_offset);
  hr.U64(&index_size);
  hr.U64(&num_tensors);
  if (version != kFormatVersion) {
    return absl::UnimplementedError(absl::StrCat("checkpoint '", path, "' has format version ", version,
                                                 "; this build reads version ", kFormatVersion));
  }
  if (file_size != actual_size) {
    return Corrupt(path, absl::StrCat(file_size > actual_size ? "truncated: " : "trailing bytes: ",
                                      "the header records ", file_size, " bytes but the file has ", actual_size));
  }
  if (flags != 0 || metadata_offset != kHeaderSize || metadata_size > file_size ||
      index_offset != metadata_offset + metadata_size || index_size > file_size ||
      index_offset + index_size + 4 + kTrailerSize > file_size || num_tensors > index_size) {
    return Corrupt(path, "header fields are inconsistent");
  }

  // Metadata + index, then the CRC that vouches for them.
  const uint64_t prefix_end = index_offset + index_size;
  std::string prefix = header;
  prefix.resize(prefix_end + 4);
  RETURN_IF_ERROR(ReadExact(fd, path, prefix.data() + kHeaderSize, prefix_end + 4 - kHeaderSize));
  uint32_t stored_prefix_crc;
  ByteReader(std::string_view(prefix).substr(prefix_end)).U32(&stored_prefix_crc);
  uint32_t prefix_crc = Crc32c(prefix.data(), prefix_end);
  if (prefix_crc != stored_prefix_crc) {
    return Corrupt(path, absl::StrCat("CRC32C mismatch over header, metadata and index (stored ",
                                      Hex32(stored_prefix_crc), ", computed ", Hex32(prefix_crc), ")"));
  }
  const uint64_t data_end = file_size - kTrailerSize;
  ASSIGN_OR_RETURN(std::vector<IndexEntry> entries,
                   ParseIndex(path, std::string_view(prefix).substr(index_offset, index_size), num_tensors,
                              prefix_end + 4, data_end));
  ASSIGN_OR_RETURN(CheckpointMetadata metadata,
                   MetadataFromJson(path, std::string_view(prefix).substr(metadata_offset, metadata_size)));

  // Tensor data, read into the tensors themselves while the whole-file CRC runs over it.
  Checkpoint ckpt;
  ckpt.path = path;
  ckpt.metadata = std::move(metadata);
  uint32_t crc = Crc32c(prefix);
  uint64_t pos = prefix.size();
  char pad[kAlign];
  for (IndexEntry& e : entries) {
    RETURN_IF_ERROR(ReadExact(fd, path, pad, e.offset - pos));
    crc = Crc32cExtend(crc, pad, e.offset - pos);
    ir::Tensor t(e.dtype, e.dims);
    if (e.bytes > 0) {
      RETURN_IF_ERROR(ReadExact(fd, path, t.raw(), e.bytes));
      crc = Crc32cExtend(crc, t.raw(), e.bytes);
    }
    pos = e.offset + e.bytes;
    ckpt.tensors.push_back({std::move(e.name), std::move(t)});
  }
  char trailer[kTrailerSize];
  RETURN_IF_ERROR(ReadExact(fd, path, trailer, kTrailerSize));
  uint32_t stored_crc;
  ByteReader(std::string_view(trailer, 4)).U32(&stored_crc);
  if (stored_crc != crc) {
    return Corrupt(path, absl::StrCat("CRC32C mismatch (stored ", Hex32(stored_crc), ", computed ", Hex32(crc),
                                      "): the file was damaged after it was written"));
  }
  if (std::memcmp(trailer + 4, kEndMagic, sizeof(kEndMagic)) != 0) return Corrupt(path, "bad end marker");
  return ckpt;
}

}  // namespace

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(Checkpoint ckpt, LoadOneFile(path));
  const nlohmann::json& extra = ckpt.metadata.extra;
  if (!extra.is_object() || !extra.contains(kShardsKey)) return ckpt;
  const nlohmann::json& shards = extra.at(kShardsKey);
  if (!shards.is_array()) return Corrupt(path, "metadata 'shards' is not a list of file names");
  std::set<std::string> names;
  for (const NamedTensor& t : ckpt.tensors) names.insert(t.name);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const nlohmann::json& name : shards) {
    if (!name.is_string() || name.get<std::string>().empty() || name.get<std::string>().find('/') != std::string::npos) {
      return Corrupt(path, "metadata 'shards' holds " + name.dump() + ", not a file name");
    }
    const std::string shard_path = (dir / name.get<std::string>()).string();
    absl::StatusOr<Checkpoint> shard = LoadOneFile(shard_path);
    if (!shard.ok()) return Annotate(shard.status(), "shard of checkpoint '" + path + "'");
    if (shard->metadata.step != ckpt.metadata.step) {
      return Corrupt(shard_path, absl::StrCat("a shard of step ", shard->metadata.step, " in the checkpoint of step ",
                                              ckpt.metadata.step, " ('", path, "')"));
    }
    for (NamedTensor& t : shard->tensors) {
      if (names.insert(t.name).second) ckpt.tensors.push_back(std::move(t));
    }
  }
  return ckpt;
}

absl::Status CheckCompatible(const Checkpoint& checkpoint, const std::vector<TensorSpec>& expected,
                             const std::optional<ModelFingerprint>& model) {
  const std::string where = absl::StrCat("checkpoint '", checkpoint.path.empty() ? "<memory>" : checkpoint.path, "'");
  std::set<std::string_view> wanted;
  for (const TensorSpec& spec : expected) {
    wanted.insert(spec.name);
    const ir::Tensor* t = checkpoint.Find(spec.name);
    if (t == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(where, " does not match the model: it has no tensor '",
                                                        spec.name, "' (expected ", DTypeStr(spec.dtype),
                                                        DimsString(spec.dims), ")"));
    }
    if (t->dtype() != spec.dtype || t->dims() != spec.dims) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, " does not match the model: tensor '", spec.name, "' is ", DTypeStr(t->dtype()),
                       DimsString(t->dims()), ", the model expects ", DTypeStr(spec.dtype), DimsString(spec.dims)));
    }
  }
  for (const NamedTensor& t : checkpoint.tensors) {
    if (!wanted.count(t.name)) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, " does not match the model: it has tensor '", t.name, "' that the model does not"));
    }
  }
  if (model && !(*model == checkpoint.metadata.model)) {
    return absl::FailedPreconditionError(absl::StrCat(where, " was written for a different model file (",
                                                      checkpoint.metadata.model.ToString(), "; this one is ",
                                                      model->ToString(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::io
