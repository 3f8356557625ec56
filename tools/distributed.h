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

namespace onnxpipe::tools {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0;
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

// The first host of a Slurm node list: "gpu[03-05,9],login1" -> "gpu03", "a1,b2" -> "a1".
absl::StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

}  // namespace onnxpipe::tools
