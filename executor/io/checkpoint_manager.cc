#include "executor/io/checkpoint_manager.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "executor/io/atomic_file.h"
#include "frontend/ir/status.h"

namespace onnxpipe::io {
namespace {

namespace fs = std::filesystem;
constexpr char kLatest[] = "latest";

// Parses "step_<n>.ckpt" (n a non-negative decimal without sign); nullopt for anything else.
std::optional<int64_t> ParseStepFileName(std::string_view name) {
  constexpr std::string_view kPrefix = "step_", kSuffix = ".ckpt";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  int64_t step = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0 || digits[0] == '+') return std::nullopt;
  return step;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {}

std::string CheckpointManager::FileName(int64_t step) { return absl::StrCat("step_", step, ".ckpt"); }

std::string CheckpointManager::ShardFileName(int64_t step, int i, int shards) {
  return absl::StrCat("step_", step, ".shard-", i, "-of-", shards, ".ckpt");
}

absl::StatusOr<std::vector<int64_t>> CheckpointManager::ListSteps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("--checkpoint-dir '", dir_, "': cannot list: ", ec.message()));
  }
  for (const fs::directory_entry& e : it) {
    if (auto step = ParseStepFileName(e.path().filename().string())) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

// A temp file whose writer still runs may be in the middle of a write; only files of dead processes are garbage.
void CheckpointManager::RemoveStaleTempFiles() const {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    size_t pos = name.rfind(".tmp.");
    if (pos == std::string::npos) continue;
    std::string_view pid_text = std::string_view(name).substr(pos + 5);
    long pid = 0;
    auto [end, perr] = std::from_chars(pid_text.data(), pid_text.data() + pid_text.size(), pid);
    if (perr != std::errc() || end != pid_text.data() + pid_text.size() || pid <= 0) continue;
    if (pid == static_cast<long>(getpid())) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
}

absl::Status CheckpointManager::MakeFolder() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("--checkpoint-dir '", dir_, "': ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointManager::Save(const Checkpoint& checkpoint) {
  RETURN_IF_ERROR(MakeFolder());
  RemoveStaleTempFiles();
  const int64_t step = checkpoint.metadata.step;
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("checkpoint step ", step, " is negative"));
  const std::string name = FileName(step);
  const std::string path = (fs::path(dir_) / name).string();
  RETURN_IF_ERROR(SaveCheckpoint(path, checkpoint));
  RETURN_IF_ERROR(WriteFileAtomically((fs::path(dir_) / kLatest).string(), name + "\n"));
  RETURN_IF_ERROR(Prune(step));
  return path;
}

absl::StatusOr<std::string> CheckpointManager::SaveShard(const Checkpoint& shard, int i, int shards) {
  if (shards < 1 || i < 0 || i >= shards) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint shard ", i, " of ", shards));
  }
  if (shard.metadata.step < 0) return absl::InvalidArgumentError("checkpoint step is negative");
  RETURN_IF_ERROR(MakeFolder());
  const std::string path = (fs::path(dir_) / ShardFileName(shard.metadata.step, i, shards)).string();
  RETURN_IF_ERROR(SaveCheckpoint(path, shard));
  return path;
}

absl::StatusOr<std::string> CheckpointManager::SaveManifest(Checkpoint manifest, int shards) {
  nlohmann::json names = nlohmann::json::array();
  for (int i = 0; i < shards; ++i) names.push_back(ShardFileName(manifest.metadata.step, i, shards));
  manifest.tensors.clear();
  manifest.metadata.extra[kShardsKey] = std::move(names);
  return Save(manifest);
}

absl::Status CheckpointManager::Prune(int64_t step) const {
  if (keep_last_ <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListSteps());
  steps.erase(std::remove(steps.begin(), steps.end(), step), steps.end());
  // Keep the newest keep_last-1 others plus the one just written.
  const int64_t excess = static_cast<int64_t>(steps.size()) - (keep_last_ - 1);
  std::error_code ec;
  for (int64_t i = 0; i < excess; ++i) {
    const std::string shard_prefix = absl::StrCat("step_", steps[i], ".shard-");
    std::vector<fs::path> doomed = {fs::path(dir_) / FileName(steps[i])};
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
      if (e.path().filename().string().rfind(shard_prefix, 0) == 0) doomed.push_back(e.path());
    }
    for (const fs::path& p : doomed) {
      fs::remove(p, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot delete old checkpoint '", p.string(), "': ", ec.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CheckpointManager::LatestPath() const {
  const std::string pointer = (fs::path(dir_) / kLatest).string();
  absl::StatusOr<std::string> text = ReadFileToString(pointer);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::optional<std::string>();
    return text.status();
  }
  std::string name = *text;
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (!ParseStepFileName(name)) {
    return absl::DataLossError(absl::StrCat("checkpoint pointer '", pointer,
                                            "' is corrupt: expected one line "
                                            "\"step_<n>.ckpt\", found \"",
                                            name.substr(0, 64), "\""));
  }
  std::string path = (fs::path(dir_) / name).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint pointer '", pointer, "' names '", name, "', which does not exist"));
  }
  return std::optional<std::string>(path);
}

absl::StatusOr<Checkpoint> CheckpointManager::LoadLatest() const {
  ASSIGN_OR_RETURN(std::optional<std::string> path, LatestPath());
  if (!path) {
    return absl::NotFoundError(absl::StrCat("--resume: no checkpoint in '", dir_, "' (no 'latest' file)"));
  }
  return LoadCheckpoint(*path);
}

}  // namespace onnxpipe::io
