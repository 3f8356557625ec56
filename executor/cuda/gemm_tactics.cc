// Tactic cache (de)serialisation. Parsing never throws: every field is type-checked and the first problem found is
// reported, so a truncated or hand-edited file becomes a DataLoss status the caller can warn about and ignore.
#include "executor/cuda/gemm_tactics.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "executor/io/atomic_file.h"
#include "nlohmann/json.hpp"

namespace onnxpipe::cuda {
namespace {

constexpr std::string_view kFormat = "onnxpipe-gemm-tactics";
constexpr int kVersion = 1;

std::string AlgoToHex(const std::array<uint64_t, 8>& words) {
  std::string hex;
  char buf[17];
  for (uint64_t w : words) {
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(w));
    hex += buf;
  }
  return hex;
}

bool HexToAlgo(const std::string& hex, std::array<uint64_t, 8>& words) {
  if (hex.size() != 8 * 16) return false;
  for (size_t i = 0; i < 8; ++i) {
    uint64_t w = 0;
    for (char c : std::string_view(hex).substr(16 * i, 16)) {
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else {
        return false;
      }
      w = (w << 4) | static_cast<uint64_t>(digit);
    }
    words[i] = w;
  }
  return true;
}

absl::Status Corrupt(const std::string& what) {
  return absl::DataLossError("GEMM tactic cache: " + what);
}

}  // namespace

const GemmTactic* GemmTacticCache::Find(const std::string& key) const {
  auto it = tactics_.find(key);
  return it == tactics_.end() ? nullptr : &it->second;
}

std::string GemmTacticCache::ToJson() const {
  nlohmann::json tactics = nlohmann::json::object();
  for (const auto& [key, t] : tactics_) {
    tactics[key] = {{"algo_id", t.algo_id}, {"algo", AlgoToHex(t.algo)}, {"time_us", t.time_us}};
  }
  nlohmann::json doc = {{"format", kFormat}, {"version", kVersion}, {"tactics", std::move(tactics)}};
  return doc.dump(1) + "\n";
}

absl::StatusOr<GemmTacticCache> GemmTacticCache::FromJson(std::string_view json) {
  const nlohmann::json doc = nlohmann::json::parse(json, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Corrupt("not valid JSON");
  if (!doc.is_object()) return Corrupt("top level is not an object");
  auto format = doc.find("format");
  if (format == doc.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    return Corrupt("\"format\" is not \"" + std::string(kFormat) + "\"");
  }
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || version->get<int64_t>() != kVersion) {
    return Corrupt("\"version\" is not " + std::to_string(kVersion));
  }
  auto tactics = doc.find("tactics");
  if (tactics == doc.end() || !tactics->is_object()) return Corrupt("\"tactics\" is missing or not an object");

  GemmTacticCache cache;
  for (const auto& [key, entry] : tactics->items()) {
    const std::string where = "tactic \"" + key + "\": ";
    if (!entry.is_object()) return Corrupt(where + "not an object");
    auto id = entry.find("algo_id");
    auto algo = entry.find("algo");
    auto time = entry.find("time_us");
    if (id == entry.end() || !id->is_number_integer()) return Corrupt(where + "\"algo_id\" is not an integer");
    if (time == entry.end() || !time->is_number()) return Corrupt(where + "\"time_us\" is not a number");
    GemmTactic t;
    t.algo_id = id->get<int>();
    t.time_us = time->get<double>();
    if (algo == entry.end() || !algo->is_string() || !HexToAlgo(algo->get<std::string>(), t.algo)) {
      return Corrupt(where + "\"algo\" is not 128 lower-case hex digits");
    }
    cache.Insert(key, t);
  }
  return cache;
}

absl::StatusOr<GemmTacticCache> GemmTacticCache::Load(const std::string& path) {
  absl::StatusOr<std::string> text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<GemmTacticCache> cache = FromJson(*text);
  if (!cache.ok()) return absl::Status(cache.status().code(), std::string(cache.status().message()) + " in " + path);
  return cache;
}

absl::Status GemmTacticCache::Save(const std::string& path) const {
  return io::WriteFileAtomically(path, ToJson());
}

absl::Status GemmTacticCache::SaveMerged(const std::string& path) {
  // flock(2) serialises threads too: each call opens its own descriptor, and locks through separate descriptors
  // exclude each other even within one process.
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError("GEMM tactic cache: cannot open " + lock_path + ": " + std::strerror(errno));
  int locked;
  while ((locked = ::flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
  }
  absl::Status saved;
  if (locked != 0) {
    saved = absl::UnavailableError("GEMM tactic cache: cannot lock " + lock_path + ": " + std::strerror(errno));
  } else {
    if (absl::StatusOr<GemmTacticCache> on_disk = Load(path); on_disk.ok()) {
      tactics_.merge(on_disk->tactics_);  // keys this cache has keep its own tactic
    }
    saved = Save(path);
  }
  ::close(fd);  // releases the lock
  return saved;
}

}  // namespace onnxpipe::cuda
