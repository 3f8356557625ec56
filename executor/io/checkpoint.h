// Training checkpoints: every tensor the trainer needs to continue (parameters, optimizer state) plus metadata
// (step, data position, RNG state, optimizer and hyper-parameters, fingerprint of the ONNX file), in one binary file.
//
// File layout, version 1 (all integers little-endian):
//   header (64 bytes)  magic "ONNXPCKP" | u32 format_version | u32 flags (0) | u64 file_size |
//                      u64 metadata_offset | u64 metadata_size | u64 index_offset | u64 index_size | u64 num_tensors
//   metadata           UTF-8 JSON (see CheckpointMetadata; "schema_version" versions its fields)
//   index              per tensor: u32 name_len, name | u8 dtype_len, dtype name ("f32", ...) | u32 rank,
//                      i64 dims[rank] | u64 data_offset (from file start, 64-byte aligned) | u64 data_bytes
//   u32 CRC32C of every byte before it (header + metadata + index): lets the loader trust the index before it
//                      allocates tensors from it
//   tensor data        row-major raw bytes, zero padding between tensors to 64-byte alignment
//   trailer (8 bytes)  u32 CRC32C of every byte before the trailer | magic "OPCE"
// Files are written with AtomicFileWriter, so a crash leaves either the old file or the complete new one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/ir/dtype.h"
#include "frontend/ir/tensor.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::io {

inline constexpr int64_t kCheckpointSchemaVersion = 1;

// Identifies the ONNX file a checkpoint was trained from: its size and the CRC32C of its bytes.
struct ModelFingerprint {
  uint64_t size = 0;
  uint32_t crc32c = 0;
  bool operator==(const ModelFingerprint&) const = default;
  std::string ToString() const;  // "<size> bytes, crc32c 0x1234abcd"
};
// Streams the file (large models are fine).
absl::StatusOr<ModelFingerprint> FingerprintFile(const std::string& path);

struct CheckpointMetadata {
  int64_t schema_version = kCheckpointSchemaVersion;
  int64_t step = 0;  // optimizer steps completed
  int64_t epoch = 0;
  int64_t data_position = 0;  // trainer-defined position in the data order (e.g. samples consumed this epoch)
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;                        // Philox offset (counter) reached
  std::string optimizer;                          // "sgd", "adamw", ...
  std::map<std::string, double> hyperparameters;  // lr, momentum, beta1, ... (doubles round-trip exactly)
  ModelFingerprint model;
  nlohmann::json extra = nlohmann::json::object();  // anything else the trainer wants back (flags, vocab file...)
};

struct NamedTensor {
  std::string name;
  ir::Tensor tensor;
};

struct Checkpoint {
  CheckpointMetadata metadata;
  std::vector<NamedTensor> tensors;  // names unique; order preserved by save/load
  std::string path;                  // set by LoadCheckpoint; used in error messages

  const ir::Tensor* Find(std::string_view name) const;
};

// Writes atomically (temp file + fsync + rename + folder fsync). Tensor names must be unique and non-empty and
// every tensor defined.
absl::Status SaveCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Reads and fully verifies a checkpoint: magic, format version, size (truncation), both CRCs, index bounds and the
// metadata JSON. Errors name the file; corruption is absl::StatusCode::kDataLoss.
// A sharded checkpoint (one written by several processes, CheckpointManager::SaveShard) is a manifest whose
// metadata.extra["shards"] lists shard files beside it: each is loaded and verified the same way, must be of the
// manifest's step, and adds its tensors (a name already loaded, a shared parameter's copy, is skipped), so the
// result is the whole checkpoint whatever the number of shards. A missing shard is an error naming it.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);
inline constexpr char kShardsKey[] = "shards";

// What the trainer expects to find in a checkpoint.
struct TensorSpec {
  std::string name;
  ir::DType dtype = ir::DType::kF32;
  std::vector<int64_t> dims;
};

// OK when the checkpoint holds exactly the expected tensors (same names, dtypes, dims; order free) and, if
// `model` is given, was written for a model file with that fingerprint. Otherwise FailedPrecondition naming the
// checkpoint file and the first differing tensor (in `expected` order; then the first unexpected extra tensor).
absl::Status CheckCompatible(const Checkpoint& checkpoint, const std::vector<TensorSpec>& expected,
                             const std::optional<ModelFingerprint>& model);

}  // namespace onnxpipe::io
