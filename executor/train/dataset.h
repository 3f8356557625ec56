// Training data in the npy layout: one `<name>.npy` per forward graph input plus `<labels>.npy`,
// row i of every file = sample i. Batches follow a fixed row order so that a run is reproducible
// and comparable with the PyTorch references (models/README.md):
//   step k, batch B, N rows: global sample s = k*B + j (j = 0..B-1), epoch e = s / N,
//   row = s mod N, or perm_e[s mod N] with --shuffle, perm_e a Fisher-Yates permutation of 0..N-1
//   drawn from a 64-bit Mersenne Twister seeded with (seed, e).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::train {

// What a data file must match: a graph input (or the labels), its dtype and its per-sample dims
// (the input's dims after the batch dim; a symbolic dim matches any size, the same symbol the same
// size across files).
struct FieldSpec {
  std::string name;
  ir::DType dtype = ir::DType::kF32;
  ir::Shape row_shape;
  // The file may hold another dtype listed here (converted on load), e.g. f32 data for an f64
  // graph. Empty: exactly `dtype`.
  std::vector<ir::DType> also_accept;
};

class Dataset {
 public:
  // Loads `<dir>/<field name>.npy` for every field. Errors name the file and the field: a missing
  // file, a dtype or row-shape mismatch with the model input, files with different row counts,
  // fewer rows than `batch`. Symbols bound by the files' dims are added to `bindings`.
  static absl::StatusOr<Dataset> Load(const std::string& dir, const std::vector<FieldSpec>& fields,
                                      int64_t batch, std::map<std::string, int64_t>* bindings);
  // From tensors already in memory (tests); the same checks.
  static absl::StatusOr<Dataset> FromTensors(std::map<std::string, ir::Tensor> tensors,
                                             const std::vector<FieldSpec>& fields, int64_t batch,
                                             std::map<std::string, int64_t>* bindings);

  int64_t rows() const { return rows_; }
  const ir::Tensor& field(const std::string& name) const { return tensors_.at(name); }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  // Checks integer class labels: every element in [0, num_classes) or equal to ignore_index.
  // The error names the file and the row (and column for per-token labels).
  absl::Status CheckLabels(const std::string& name, int64_t num_classes, int64_t ignore_index) const;

  // The rows of step k (see the header comment).
  std::vector<int64_t> BatchRows(int64_t step, int64_t batch, bool shuffle, uint64_t seed) const;
  // Field `name` restricted to `rows` (dims (rows.size(), row dims...)).
  ir::Tensor Gather(const std::string& name, const std::vector<int64_t>& rows) const;

 private:
  std::string dir_;
  std::map<std::string, ir::Tensor> tensors_;
  int64_t rows_ = 0;
};

}  // namespace onnxpipe::train
