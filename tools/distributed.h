// Where a process sits in a multi-process run, from the launcher's environment: `onnxpipe launch` and torchrun set
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `srun` sets SLURM_PROCID, SLURM_STEP_NUM_TASKS (or
// SLURM_NTASKS), SLURM_LOCALID and the step's node list, whose first host is the master (MASTER_ADDR and
// MASTER_PORT still win when set; the port defaults to one derived from the job id).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "executor/comm/comm.h"
#include "frontend/ir/tensor.h"

namespace onnxpipe::tools {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  int local_world_size = 0;  // ranks on this node (LOCAL_WORLD_SIZE; Slurm's tasks per node); 0 when not told
  std::string master_addr;
  int master_port = 0;
  std::string source;  // "torchrun / onnxpipe launch" or "slurm": how errors name the variables
};

// The variables' values (getenv in production; a map in tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup ProcessEnv();

// nullopt when no launcher started this process (or started it as the only rank); an error naming the variable
// when one is missing, not a number, or inconsistent with the others.
absl::StatusOr<std::optional<LaunchEnv>> ReadLaunchEnv(const EnvLookup& env);

// This node's entry of a Slurm tasks-per-node list: "4(x2),3" with node 2 -> 3. An error naming the list when it
// cannot be read or has no entry for the node.
absl::StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node);

// CPU threads for one rank's kernels: all `usable` CPUs when it is alone on its node or its launcher bound it to
// fewer CPUs than the machine has (`usable` < `machine`: srun --cpu-bind, taskset), else an equal share of the node.
int RankThreads(int usable, int machine, int local_ranks);

// The first host of a Slurm node list: "gpu[03-05,9],login1" -> "gpu03", "a1,b2" -> "a1".
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// `t` (host doubles) summed over every rank of the world, in place; errors begin with `what`.
absl::Status SumOverRanks(comm::Comm& world, ir::Tensor& t, const std::string& what);

// Ranks that partition without a plan (--stages K) must cut alike, which they do when they use one device profile
// (partitioner/device.h). Every rank calls it with its own; an error on every rank naming --plan when they differ
// (ranks on different kinds of GPU), before any work, instead of stages that do not match.
absl::Status AgreeOnDeviceProfile(comm::Comm& world, const std::string& profile);

}  // namespace onnxpipe::tools
