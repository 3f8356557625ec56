#include "tools/distributed.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "frontend/ir/status.h"
#include "partitioner/device.h"

namespace onnxpipe::tools {
namespace {

absl::StatusOr<int> IntVar(const EnvLookup& env, const std::string& name, const std::string& source) {
  const std::optional<std::string> v = env(name);
  if (!v) return INVALID_ARGUMENT() << source << ": " << name << " is not set";
  int out = 0;
  if (!absl::SimpleAtoi(*v, &out) || out < 0) {
    return INVALID_ARGUMENT() << source << ": " << name << "='" << *v << "' is not a non-negative integer";
  }
  return out;
}

std::optional<std::string> FirstSet(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (std::optional<std::string> v = env(n); v && !v->empty()) return v;
  }
  return std::nullopt;
}

absl::StatusOr<LaunchEnv> FromTorchrun(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "torchrun / onnxpipe launch";
  ASSIGN_OR_RETURN(e.world_size, IntVar(env, "WORLD_SIZE", e.source));
  ASSIGN_OR_RETURN(e.rank, IntVar(env, "RANK", e.source));
  e.local_rank = 0;
  if (env("LOCAL_RANK")) {
    ASSIGN_OR_RETURN(e.local_rank, IntVar(env, "LOCAL_RANK", e.source));
  }
  if (env("LOCAL_WORLD_SIZE")) {
    ASSIGN_OR_RETURN(e.local_world_size, IntVar(env, "LOCAL_WORLD_SIZE", e.source));
  }
  const std::optional<std::string> addr = env("MASTER_ADDR");
  if (!addr || addr->empty()) return INVALID_ARGUMENT() << e.source << ": MASTER_ADDR is not set";
  e.master_addr = *addr;
  ASSIGN_OR_RETURN(e.master_port, IntVar(env, "MASTER_PORT", e.source));
  return e;
}

absl::StatusOr<LaunchEnv> FromSlurm(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "slurm";
  // A step's own task count: inside an sbatch script SLURM_NTASKS is the allocation's, not this step's.
  const char* tasks = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  ASSIGN_OR_RETURN(e.world_size, IntVar(env, tasks, e.source));
  ASSIGN_OR_RETURN(e.rank, IntVar(env, "SLURM_PROCID", e.source));
  ASSIGN_OR_RETURN(e.local_rank, IntVar(env, "SLURM_LOCALID", e.source));
  if (const std::optional<std::string> per_node =
          FirstSet(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})) {
    ASSIGN_OR_RETURN(const int node, IntVar(env, "SLURM_NODEID", e.source));
    ASSIGN_OR_RETURN(e.local_world_size, SlurmTasksOnNode(*per_node, node));
  }
  if (std::optional<std::string> addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    e.master_addr = *addr;
  } else {
    const std::optional<std::string> nodes = FirstSet(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
    if (!nodes) {
      return INVALID_ARGUMENT() << "slurm: neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set (or set "
                                << "MASTER_ADDR)";
    }
    ASSIGN_OR_RETURN(e.master_addr, FirstSlurmHost(*nodes));
  }
  if (env("MASTER_PORT")) {
    ASSIGN_OR_RETURN(e.master_port, IntVar(env, "MASTER_PORT", e.source));
  } else {
    // One port per job, so that two jobs sharing a node do not meet.
    ASSIGN_OR_RETURN(const int job, IntVar(env, "SLURM_JOB_ID", e.source + " (without MASTER_PORT)"));
    e.master_port = 20000 + job % 20000;
  }
  return e;
}

}  // namespace

absl::StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node) {
  auto bad = [&]() -> absl::Status {
    return INVALID_ARGUMENT() << "slurm: cannot read the tasks per node '" << tasks_per_node << "'";
  };
  int first = 0;  // the first node of the entry being read
  for (absl::string_view entry : absl::StrSplit(tasks_per_node, ',')) {
    int tasks = 0, repeat = 1;
    const size_t paren = entry.find("(x");
    if (!absl::SimpleAtoi(entry.substr(0, paren), &tasks) || tasks < 1) return bad();
    if (paren != absl::string_view::npos) {
      if (entry.back() != ')' || !absl::SimpleAtoi(entry.substr(paren + 2, entry.size() - paren - 3), &repeat) ||
          repeat < 1) {
        return bad();
      }
    }
    if (node < first + repeat) return tasks;
    first += repeat;
  }
  return INVALID_ARGUMENT() << "slurm: the tasks per node '" << tasks_per_node << "' list " << first
                            << " nodes, none for SLURM_NODEID " << node;
}

int RankThreads(int usable, int machine, int local_ranks) {
  if (local_ranks <= 1 || usable < machine) return std::max(1, usable);
  return std::max(1, usable / local_ranks);
}

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
}

absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  // The first entry: up to a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  const size_t open = entry.find('[');
  if (open == std::string::npos) {
    if (entry.empty()) return INVALID_ARGUMENT() << "slurm: the node list '" << nodelist << "' is empty";
    return entry;
  }
  const size_t close = entry.find(']', open);
  if (close == std::string::npos || close == open + 1) {
    return INVALID_ARGUMENT() << "slurm: cannot read the node list '" << nodelist << "'";
  }
  // The first number of the range list keeps its zero padding: "[03-05]" -> "03".
  const std::string ranges = entry.substr(open + 1, close - open - 1);
  const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
  if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
    return INVALID_ARGUMENT() << "slurm: cannot read the node list '" << nodelist << "'";
  }
  return entry.substr(0, open) + first + entry.substr(close + 1);
}

absl::StatusOr<std::optional<LaunchEnv>> ReadLaunchEnv(const EnvLookup& env) {
  std::optional<LaunchEnv> e;
  if (env("WORLD_SIZE") || env("RANK")) {
    ASSIGN_OR_RETURN(e, FromTorchrun(env));
  } else if (env("SLURM_PROCID") && (env("SLURM_STEP_ID") || env("SLURM_STEPID"))) {  // a task of an srun step
    ASSIGN_OR_RETURN(e, FromSlurm(env));
  } else {
    return std::nullopt;
  }
  if (e->world_size < 1) return INVALID_ARGUMENT() << e->source << ": the world size is " << e->world_size;
  if (e->rank >= e->world_size) {
    return INVALID_ARGUMENT() << e->source << ": rank " << e->rank << " is not below the world size " << e->world_size;
  }
  if (e->master_port < 1 || e->master_port > 65535) {
    return INVALID_ARGUMENT() << e->source << ": the master port " << e->master_port << " is not a TCP port";
  }
  if (e->world_size == 1) return std::nullopt;
  return e;
}

absl::Status SumOverRanks(comm::Comm& world, ir::Tensor& t, const std::string& what) {
  std::vector<int> everyone(world.size());
  for (int r = 0; r < world.size(); ++r) everyone[r] = r;
  return Annotate(world.AllReduce(t, everyone, nullptr), what);
}

absl::Status AgreeOnDeviceProfile(comm::Comm& world, const std::string& profile) {
  const std::vector<std::string> names = partitioner::BuiltinDeviceNames();
  const double i = static_cast<double>(std::find(names.begin(), names.end(), profile) - names.begin());
  ir::Tensor sums = ir::Tensor::FromVector<double>({2}, {i, i * i});
  RETURN_IF_ERROR(SumOverRanks(world, sums, "comparing the ranks' devices"));
  // All equal exactly when n * sum(i^2) = sum(i)^2 (small integers: exact in doubles).
  if (world.size() * sums.data<double>()[1] != sums.data<double>()[0] * sums.data<double>()[0]) {
    return INVALID_ARGUMENT() << "the ranks run on different kinds of device (this one: " << profile
                              << "), so --stages would cut the model differently on each: partition it once "
                                 "(onnxpipe partition --stages K --out DIR) and give every rank --plan DIR";
  }
  return absl::OkStatus();
}

}  // namespace onnxpipe::tools
