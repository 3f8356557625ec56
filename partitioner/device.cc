// Built-in device profiles and the device JSON format. GPU peaks are the vendors' dense numbers
// (REFERENCES.md section 6), the cpu profile is measured (below); the default efficiencies (0.8) come from the dense
// bf16 GEMM measured on the H200 (~790 of 989 TFLOP/s, DESIGN.md), so a roofline time is what a good kernel reaches.
#include "partitioner/device.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "frontend/ir/status.h"

namespace onnxpipe::partitioner {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

DeviceProfile Make(const char* name, int64_t memory, double fp32, double bf16, double vec, double bw, double link) {
  DeviceProfile d;
  d.name = name;
  d.memory_bytes = memory;
  d.reserved_bytes = kGiB;  // CUDA context + cuBLAS/cuDNN workspaces, order of magnitude
  d.gemm_flops_fp32 = fp32;
  d.gemm_flops_bf16 = bf16;
  d.vector_flops = vec;
  d.memory_bandwidth = bw;
  d.link_bandwidth = link;
  return d;
}

std::vector<DeviceProfile> Builtins() {
  std::vector<DeviceProfile> v;
  // memory: what nvidia-smi reports as total for the SXM parts.
  v.push_back(Make("h200", 143771 * kMiB, 494e12, 989e12, 67e12, 4.8e12, 450e9));
  v.push_back(Make("h100-80gb", 81559 * kMiB, 494e12, 989e12, 67e12, 3.35e12, 450e9));
  v.push_back(Make("a100-80gb", 81920 * kMiB, 156e12, 312e12, 19.5e12, 2.039e12, 300e9));
  v.push_back(Make("a100-40gb", 40960 * kMiB, 156e12, 312e12, 19.5e12, 1.555e12, 300e9));
  // V100 has no bf16: the fp16 tensor-core peak stands in for it.
  v.push_back(Make("v100-32gb", 32768 * kMiB, 15.7e12, 125e12, 15.7e12, 0.9e12, 150e9));
  // The CPU backend as measured, not a datasheet: `onnxpipe profile --device-out` (calibrate.h) on
  // a 2-core x86 VM (shared with other jobs) fitted GEMM 8.7 GFLOP/s, other ops 1.3 GFLOP/s,
  // 1.6 GB/s for memory-bound ops and 4.8 us per op; efficiencies are 1 because these are achieved
  // rates. bench/partition_cpu_calibration.py checks the prediction against pipelined runs of
  // other models; on another machine, profile it and pass the file it writes as --device.
  DeviceProfile cpu = Make("cpu", 64 * kGiB, 8.7e9, 8.7e9, 1.3e9, 1.6e9, 1e10);
  cpu.reserved_bytes = 0;
  cpu.backend = "cpu";
  cpu.op_overhead_s = 4.8e-6;
  cpu.link_latency_s = 1e-6;
  cpu.compute_efficiency = 1.0;
  cpu.memory_efficiency = 1.0;
  v.push_back(cpu);
  return v;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

const char* PrecisionName(Precision p) { return p == Precision::kBF16 ? "bf16" : "fp32"; }

absl::StatusOr<Precision> ParsePrecision(std::string_view s) {
  if (s == "fp32") return Precision::kFP32;
  if (s == "bf16") return Precision::kBF16;
  return INVALID_ARGUMENT() << "unknown dtype '" << s << "'; expected fp32 or bf16";
}

std::string BuiltinDeviceForGpu(std::string_view gpu_name, int64_t total_memory_bytes) {
  const std::string name = Lower(gpu_name);
  auto has = [&](const char* model) { return name.find(model) != std::string::npos; };
  // H100 PCIe and SXM both have 80 GB; the 94 GB NVL is the H100 profile too (its memory is read from the device
  // where it matters: the fit check).
  if (has("h200")) return "h200";
  if (has("h100")) return "h100-80gb";
  if (has("a100")) return total_memory_bytes > int64_t{60} * kGiB ? "a100-80gb" : "a100-40gb";
  if (has("v100")) return "v100-32gb";
  return "";
}

std::vector<std::string> BuiltinDeviceNames() {
  std::vector<std::string> names;
  for (const DeviceProfile& d : Builtins()) names.push_back(d.name);
  return names;
}

absl::StatusOr<DeviceProfile> BuiltinDevice(std::string_view name) {
  const std::string want = Lower(name);
  std::string known;
  for (const DeviceProfile& d : Builtins()) {
    if (d.name == want) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  return NOT_FOUND() << "unknown device '" << name << "'; built-in devices: " << known
                     << " (or give a JSON device file, see `onnxpipe partition --help`)";
}

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  std::string s(text);
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  size_t num_end = i;
  while (num_end < s.size() && (std::isdigit(static_cast<unsigned char>(s[num_end])) || s[num_end] == '.')) ++num_end;
  if (num_end == i) {
    return INVALID_ARGUMENT() << "'" << text << "' is not a memory size; expected e.g. 80GiB, 40GB or a byte count";
  }
  double value = 0;
  try {
    value = std::stod(s.substr(i, num_end - i));
  } catch (...) {
    return INVALID_ARGUMENT() << "'" << text << "' is not a memory size";
  }
  std::string unit;
  for (size_t k = num_end; k < s.size(); ++k)
    if (!std::isspace(static_cast<unsigned char>(s[k]))) unit += s[k];
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},       {"B", 1},         {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},  {"KiB", 1024.0},  {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = value * scale;
      if (!std::isfinite(bytes) || bytes < 1 || bytes > 9e18) {
        return INVALID_ARGUMENT() << "memory size '" << text << "' is out of range";
      }
      return static_cast<int64_t>(std::llround(bytes));
    }
  }
  return INVALID_ARGUMENT() << "memory size '" << text
                            << "' has an unknown unit; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB";
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.*f %s", std::fabs(v) < 10 ? 2 : 1, v, units[u]);
  }
  return buf;
}

absl::StatusOr<DeviceProfile> DeviceFromJson(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) return INVALID_ARGUMENT() << what << ": a device profile must be a JSON object";
  static const std::set<std::string> kKeys = {"name",
                                              "memory",
                                              "reserved",
                                              "peak_tflops",
                                              "vector_tflops",
                                              "memory_bandwidth_gbps",
                                              "link_bandwidth_gbps",
                                              "link_latency_us",
                                              "data_parallel_bandwidth_gbps",
                                              "op_overhead_us",
                                              "compute_efficiency",
                                              "memory_efficiency",
                                              "backend"};
  for (const auto& [key, unused] : j.items()) {
    if (!kKeys.count(key)) return INVALID_ARGUMENT() << what << ": unknown key '" << key << "'";
  }
  for (const char* key : {"name", "memory", "peak_tflops", "memory_bandwidth_gbps", "link_bandwidth_gbps"}) {
    if (!j.contains(key)) return INVALID_ARGUMENT() << what << ": missing required key '" << key << "'";
  }
  auto size_of = [&](const char* key) -> absl::StatusOr<int64_t> {
    const nlohmann::json& v = j.at(key);
    if (v.is_number_integer() || v.is_number_unsigned()) {
      if (v.get<int64_t>() < 0) return INVALID_ARGUMENT() << what << ": '" << key << "' is negative";
      return v.get<int64_t>();
    }
    if (v.is_string()) {
      absl::StatusOr<int64_t> bytes = ParseByteSize(v.get<std::string>());
      if (!bytes.ok()) return Annotate(bytes.status(), what + ": '" + key + "'");
      return bytes;
    }
    return INVALID_ARGUMENT() << what << ": '" << key << "' must be a byte count or a string like \"80GiB\"";
  };
  auto positive = [&](const nlohmann::json& v, const std::string& key) -> absl::StatusOr<double> {
    if (!v.is_number()) return INVALID_ARGUMENT() << what << ": '" << key << "' must be a number";
    const double x = v.get<double>();
    if (!(x > 0) || !std::isfinite(x)) {
      return INVALID_ARGUMENT() << what << ": '" << key << "' must be positive, got " << x;
    }
    return x;
  };
  DeviceProfile d;
  d.source = what;
  if (!j.at("name").is_string() || j.at("name").get<std::string>().empty()) {
    return INVALID_ARGUMENT() << what << ": 'name' must be a non-empty string";
  }
  d.name = j.at("name").get<std::string>();
  if (j.contains("backend")) {
    const nlohmann::json& b = j.at("backend");
    if (!b.is_string() || (b.get<std::string>() != "cpu" && b.get<std::string>() != "cuda")) {
      return INVALID_ARGUMENT() << what << ": 'backend' must be \"cpu\" or \"cuda\", got " << b.dump();
    }
    d.backend = b.get<std::string>();
  }
  ASSIGN_OR_RETURN(d.memory_bytes, size_of("memory"));
  d.reserved_bytes = 0;
  if (j.contains("reserved")) {
    ASSIGN_OR_RETURN(d.reserved_bytes, size_of("reserved"));
  }
  if (d.reserved_bytes >= d.memory_bytes) {
    return INVALID_ARGUMENT() << what << ": 'reserved' (" << d.reserved_bytes
                              << " bytes) leaves no memory of 'memory' (" << d.memory_bytes << ")";
  }
  const nlohmann::json& peaks = j.at("peak_tflops");
  if (!peaks.is_object() || peaks.empty()) {
    return INVALID_ARGUMENT() << what << ": 'peak_tflops' must be an object like {\"fp32\": 494, \"bf16\": 989}";
  }
  for (const auto& [key, v] : peaks.items()) {
    ASSIGN_OR_RETURN(double tf, positive(v, "peak_tflops." + key));
    if (key == "fp32") {
      d.gemm_flops_fp32 = tf * 1e12;
    } else if (key == "bf16") {
      d.gemm_flops_bf16 = tf * 1e12;
    } else {
      return INVALID_ARGUMENT() << what << ": 'peak_tflops' has unknown precision '" << key
                                << "'; expected fp32 and/or bf16";
    }
  }
  if (d.gemm_flops_fp32 == 0) d.gemm_flops_fp32 = d.gemm_flops_bf16 / 2;
  d.vector_flops = d.gemm_flops_fp32 / 8;
  if (j.contains("vector_tflops")) {
    ASSIGN_OR_RETURN(double v, positive(j.at("vector_tflops"), "vector_tflops"));
    d.vector_flops = v * 1e12;
  }
  ASSIGN_OR_RETURN(double bw, positive(j.at("memory_bandwidth_gbps"), "memory_bandwidth_gbps"));
  d.memory_bandwidth = bw * 1e9;
  ASSIGN_OR_RETURN(double link, positive(j.at("link_bandwidth_gbps"), "link_bandwidth_gbps"));
  d.link_bandwidth = link * 1e9;
  if (j.contains("data_parallel_bandwidth_gbps")) {
    ASSIGN_OR_RETURN(double dp, positive(j.at("data_parallel_bandwidth_gbps"), "data_parallel_bandwidth_gbps"));
    d.data_parallel_bandwidth = dp * 1e9;
  }
  for (const auto& [key, target, scale] :
       {std::tuple<const char*, double*, double>{"link_latency_us", &d.link_latency_s, 1e-6},
        {"op_overhead_us", &d.op_overhead_s, 1e-6}}) {
    if (!j.contains(key)) continue;
    const nlohmann::json& v = j.at(key);
    if (!v.is_number() || v.get<double>() < 0 || !std::isfinite(v.get<double>())) {
      return INVALID_ARGUMENT() << what << ": '" << key << "' must be a number >= 0";
    }
    *target = v.get<double>() * scale;
  }
  for (const auto& [key, target] : {std::pair<const char*, double*>{"compute_efficiency", &d.compute_efficiency},
                                    {"memory_efficiency", &d.memory_efficiency}}) {
    if (!j.contains(key)) continue;
    ASSIGN_OR_RETURN(double e, positive(j.at(key), key));
    if (e > 1) return INVALID_ARGUMENT() << what << ": '" << key << "' must be in (0, 1], got " << e;
    *target = e;
  }
  return d;
}

absl::StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, const std::string& missing,
                                            const std::string& invalid) {
  std::ifstream f(path);
  if (!f) return NOT_FOUND() << path << ": " << missing;
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return INVALID_ARGUMENT() << path << ": " << invalid << ": " << e.what();
  }
}

absl::StatusOr<DeviceProfile> LoadDeviceFile(const std::string& path) {
  ASSIGN_OR_RETURN(const nlohmann::json j, ReadJsonFile(path, "device file not found"));
  return DeviceFromJson(j, path);
}

absl::StatusOr<DeviceProfile> ResolveDevice(const std::string& name_or_path) {
  const bool looks_like_file = name_or_path.find('/') != std::string::npos ||
                               (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  if (looks_like_file) return LoadDeviceFile(name_or_path);
  return BuiltinDevice(name_or_path);
}

nlohmann::ordered_json DeviceToJson(const DeviceProfile& d) {
  nlohmann::ordered_json j;
  j["name"] = d.name;
  j["source"] = d.source;
  j["memory"] = d.memory_bytes;
  j["reserved"] = d.reserved_bytes;
  j["peak_tflops"] = {{"fp32", d.gemm_flops_fp32 / 1e12}, {"bf16", d.gemm_flops_bf16 / 1e12}};
  j["vector_tflops"] = d.vector_flops / 1e12;
  j["memory_bandwidth_gbps"] = d.memory_bandwidth / 1e9;
  j["link_bandwidth_gbps"] = d.link_bandwidth / 1e9;
  j["link_latency_us"] = d.link_latency_s * 1e6;
  j["data_parallel_bandwidth_gbps"] = d.data_parallel_link() / 1e9;
  j["op_overhead_us"] = d.op_overhead_s * 1e6;
  j["compute_efficiency"] = d.compute_efficiency;
  j["memory_efficiency"] = d.memory_efficiency;
  return j;
}

}  // namespace onnxpipe::partitioner
