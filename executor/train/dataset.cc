// npy training data: loading with checks against the model's inputs, label checks, and the
// per-step row order.
#include "executor/train/dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "executor/data/npy.h"
#include "frontend/ir/status.h"

namespace onnxpipe::train {
namespace {

std::string DimsText(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

// The expected file dims as text: (N, row dims...).
std::string ExpectedText(const FieldSpec& f) {
  std::string s = "(N";
  for (const ir::Dim& d : f.row_shape) s += ", " + d.ToString();
  return s + ")";
}

absl::Status CheckField(const std::string& file, const FieldSpec& f, const ir::Tensor& t,
                        std::map<std::string, int64_t>* bindings) {
  const bool dtype_ok =
      t.dtype() == f.dtype ||
      std::find(f.also_accept.begin(), f.also_accept.end(), t.dtype()) != f.also_accept.end();
  if (!dtype_ok) {
    return INVALID_ARGUMENT() << file << ": '" << f.name << "' expects dtype "
                              << ir::DTypeName(f.dtype) << " but the file holds "
                              << ir::DTypeName(t.dtype());
  }
  if (t.rank() != static_cast<int64_t>(f.row_shape.size()) + 1) {
    return INVALID_ARGUMENT() << file << ": '" << f.name << "' expects dims " << ExpectedText(f)
                              << " (one row per sample) but the file holds " << DimsText(t.dims());
  }
  for (size_t i = 0; i < f.row_shape.size(); ++i) {
    const ir::Dim& d = f.row_shape[i];
    const int64_t got = t.dims()[i + 1];
    if (d.is_concrete()) {
      if (d.value() != got) {
        return INVALID_ARGUMENT() << file << ": '" << f.name << "' expects dims " << ExpectedText(f)
                                  << " but the file holds " << DimsText(t.dims());
      }
      continue;
    }
    // Only a plain symbol ("S") can be bound by the data; products are checked after binding.
    if (d.symbols().size() != 1 || d.factor() != 1 || d.is_unknown()) continue;
    auto [it, inserted] = bindings->emplace(d.symbols()[0], got);
    if (!inserted && it->second != got) {
      return INVALID_ARGUMENT() << file << ": '" << f.name << "' dim " << i + 1 << " ('"
                                << d.symbols()[0] << "') is " << got << " but it is bound to "
                                << it->second << " (by another file or --seq)";
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> Dataset::Load(const std::string& dir, const std::vector<FieldSpec>& fields,
                                      int64_t batch, std::map<std::string, int64_t>* bindings) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) return NOT_FOUND() << "--data " << dir << " is not a directory";
  std::map<std::string, ir::Tensor> tensors;
  for (const FieldSpec& f : fields) {
    const fs::path p = fs::path(dir) / (f.name + ".npy");
    if (!fs::exists(p)) {
      return NOT_FOUND() << p.string() << " is missing: the data folder needs one <name>.npy per "
                         << "model input and one for the labels ('" << f.name << "')";
    }
    absl::StatusOr<ir::Tensor> t = data::ReadNpy(p.string());
    if (!t.ok()) return Annotate(t.status(), "reading " + p.string());
    tensors[f.name] = std::move(*t);
  }
  ASSIGN_OR_RETURN(Dataset d, FromTensors(std::move(tensors), fields, batch, bindings));
  d.dir_ = dir;
  return d;
}

absl::StatusOr<Dataset> Dataset::FromTensors(std::map<std::string, ir::Tensor> tensors,
                                             const std::vector<FieldSpec>& fields, int64_t batch,
                                             std::map<std::string, int64_t>* bindings) {
  Dataset d;
  std::string first_name;
  for (const FieldSpec& f : fields) {
    auto it = tensors.find(f.name);
    if (it == tensors.end()) return NOT_FOUND() << "no data for '" << f.name << "'";
    const std::string file = f.name + ".npy";
    RETURN_IF_ERROR(CheckField(file, f, it->second, bindings));
    if (it->second.dtype() != f.dtype) it->second = it->second.CastTo(f.dtype);
    const int64_t rows = it->second.dims()[0];
    if (first_name.empty()) {
      first_name = f.name;
      d.rows_ = rows;
    } else if (rows != d.rows_) {
      return INVALID_ARGUMENT() << file << " has " << rows << " rows but " << first_name
                                << ".npy has " << d.rows_ << "; every file needs one row per sample";
    }
    d.tensors_[f.name] = it->second;
  }
  if (d.rows_ < batch) {
    return INVALID_ARGUMENT() << "the data has " << d.rows_ << " rows (samples), fewer than --batch "
                              << batch;
  }
  return d;
}

absl::Status Dataset::CheckLabels(const std::string& name, int64_t num_classes,
                                  int64_t ignore_index) const {
  const ir::Tensor& t = tensors_.at(name);
  if (!ir::IsInteger(t.dtype())) {
    return INVALID_ARGUMENT() << name << ".npy: class labels must be integers, the file holds "
                              << ir::DTypeName(t.dtype());
  }
  const int64_t per_row = t.dims()[0] == 0 ? 0 : t.num_elements() / t.dims()[0];
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const int64_t y = t.GetAsInt(i);
    if ((y >= 0 && y < num_classes) || y == ignore_index) continue;
    auto err = INVALID_ARGUMENT();
    err << name << ".npy row " << i / per_row;
    if (per_row > 1) err << " column " << i % per_row;
    err << ": label " << y << " is out of range [0, " << num_classes << ")";
    if (ignore_index < 0) err << " and is not the ignore index " << ignore_index;
    return err;
  }
  return absl::OkStatus();
}

std::vector<int64_t> Dataset::BatchRows(int64_t step, int64_t batch, bool shuffle,
                                        uint64_t seed) const {
  std::vector<int64_t> rows(batch);
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  for (int64_t j = 0; j < batch; ++j) {
    const int64_t s = step * batch + j;
    const int64_t epoch = s / rows_, pos = s % rows_;
    if (!shuffle) {
      rows[j] = pos;
      continue;
    }
    if (epoch != perm_epoch) {
      // Fisher-Yates written out (std::shuffle's sequence is implementation-defined), with the
      // engine seeded from (seed, epoch) so that any step's rows can be computed on their own.
      std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(epoch), static_cast<uint32_t>(epoch >> 32)};
      std::mt19937_64 rng(seq);
      perm.resize(rows_);
      for (int64_t i = 0; i < rows_; ++i) perm[i] = i;
      for (int64_t i = rows_ - 1; i > 0; --i) {
        const int64_t k = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
        std::swap(perm[i], perm[k]);
      }
      perm_epoch = epoch;
    }
    rows[j] = perm[pos];
  }
  return rows;
}

ir::Tensor Dataset::Gather(const std::string& name, const std::vector<int64_t>& rows) const {
  const ir::Tensor& t = tensors_.at(name);
  std::vector<int64_t> dims = t.dims();
  dims[0] = static_cast<int64_t>(rows.size());
  ir::Tensor out(t.dtype(), dims);
  const int64_t row_bytes = rows_ == 0 ? 0 : t.num_bytes() / rows_;
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (size_t j = 0; j < rows.size(); ++j) {
    std::memcpy(dst + j * row_bytes, src + rows[j] * row_bytes, row_bytes);
  }
  return out;
}

}  // namespace onnxpipe::train
