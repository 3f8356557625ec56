#include "executor/train/metrics.h"

#include <cerrno>
#include <cstring>

#include "executor/io/atomic_file.h"
#include "frontend/ir/status.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::train {

std::string MetricsJson(const StepMetrics& m) {
  // nlohmann keeps insertion order only with ordered_json: the documented key order reads best.
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;  // a non-finite value is written as null
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["samples_per_s"] = m.samples_per_s;
  return j.dump();
}

std::string EvalJson(const std::string& split, double accuracy, double loss) {
  nlohmann::ordered_json j;
  j["split"] = split;
  j["accuracy"] = accuracy;
  j["loss"] = loss;
  return j.dump();
}

absl::StatusOr<MetricsWriter> MetricsWriter::OpenForResume(const std::string& path, int64_t step) {
  absl::StatusOr<std::string> old = io::ReadFileToString(path);
  if (old.ok()) {
    std::string kept;
    size_t pos = 0;
    while (pos < old->size()) {
      size_t end = old->find('\n', pos);
      if (end == std::string::npos) end = old->size();
      const std::string line = old->substr(pos, end - pos);
      pos = end + 1;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() < step) {
        kept += line + "\n";
      }
    }
    RETURN_IF_ERROR(io::WriteFileAtomically(path, kept));
  } else if (!absl::IsNotFound(old.status())) {
    return old.status();
  }
  return Open(path, "a");
}

absl::StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path) { return Open(path, "w"); }

absl::StatusOr<MetricsWriter> MetricsWriter::Open(const std::string& path, const char* mode) {
  MetricsWriter w;
  w.path_ = path;
  w.file_.reset(std::fopen(path.c_str(), mode));
  if (!w.file_) {
    return INVALID_ARGUMENT() << "cannot create --metrics " << path << ": " << std::strerror(errno);
  }
  return w;
}

absl::Status MetricsWriter::Write(const StepMetrics& m) { return WriteLine(MetricsJson(m)); }

absl::Status MetricsWriter::WriteLine(const std::string& json) {
  const std::string line = json + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() ||
      std::fflush(file_.get()) != 0) {
    return absl::DataLossError("writing " + path_ + ": " + std::strerror(errno));
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::train
