// Tactic cache for cuBLASLt GEMMs: the algorithm chosen for each GEMM problem, kept in memory and in a JSON file
// that later runs reuse (a TensorRT-style timing cache). Host-only, no CUDA types, so it is usable and testable
// without a GPU. An algorithm is kept as the 64 opaque bytes of cublasLtMatmulAlgo_t, which cuBLASLt documents as
// serialisable for the same library version; GemmContext therefore puts the device name and the cuBLASLt version
// into every key, and re-checks a loaded algorithm with the library before running it.
//
// File format (version 1):
//   {"format": "onnxpipe-gemm-tactics", "version": 1,
//    "tactics": {"<key>": {"algo_id": 66, "algo": "<128 hex digits>", "time_us": 812.5}, ...}}
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace onnxpipe::cuda {

struct GemmTactic {
  int algo_id = -1;                // CUBLASLT_ALGO_CONFIG_ID: for reports and tests
  std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t::data
  double time_us = 0;              // measured time when it was chosen; 0 when not timed
  bool operator==(const GemmTactic&) const = default;
};

class GemmTacticCache {
 public:
  // nullptr when `key` has no tactic.
  const GemmTactic* Find(const std::string& key) const;
  void Insert(const std::string& key, const GemmTactic& tactic) { tactics_[key] = tactic; }
  size_t size() const { return tactics_.size(); }

  std::string ToJson() const;
  // A cache from ToJson()'s text; DataLoss naming what is wrong when `json` is not a valid version-1 cache.
  static absl::StatusOr<GemmTacticCache> FromJson(std::string_view json);

  // Reads `path`: NotFound when the file is absent, DataLoss naming the file and the problem when it is corrupt.
  static absl::StatusOr<GemmTacticCache> Load(const std::string& path);
  // Writes `path` atomically (temp file + rename): readers see the old file or the new one, never a prefix.
  absl::Status Save(const std::string& path) const;
  // Save for caches that share a file (one GemmContext per stream or stage, one process per rank on a node): first
  // takes in the tactics the file has that this cache lacks, so no writer drops another's. Threads and processes are
  // serialised by flock(2) on `path` + ".lock" (created beside the file and left there). A
  // corrupt or absent file is simply replaced.
  absl::Status SaveMerged(const std::string& path);

 private:
  std::map<std::string, GemmTactic> tactics_;
};

}  // namespace onnxpipe::cuda
