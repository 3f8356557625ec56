#include "executor/pipeline/memory_check.h"

#include <algorithm>

#include <cstdio>

#include "frontend/ir/align.h"
#include "frontend/ir/status.h"
#include "partitioner/schedule.h"

namespace onnxpipe::pipeline {

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

absl::StatusOr<PlanMemoryNeed> PlanAllocationBytes(const partitioner::CompiledPlan& plan, const backend::Backend& be,
                                                   int32_t only_stage) {
  const partitioner::WorkspaceFn workspace = [&be](const ir::Graph& g, const ir::Node& n) {
    return be.WorkspaceBytes(g, n);
  };
  const bool host = be.placement().host();
  PlanMemoryNeed need;
  for (const partitioner::StageProgram& sp : plan.program.stages) {
    if (only_stage >= 0 && sp.stage != only_stage) {
      need.stage_bytes.push_back(0);
      continue;
    }
    const int64_t in_flight =
        partitioner::InFlightMicrobatches(plan.schedule, plan.program.num_stages, sp.stage, plan.microbatches);
    ASSIGN_OR_RETURN(StageLayout layout,
                     partitioner::PlanStageLayout(sp, in_flight, plan.microbatches, /*alignment=*/64, workspace));
    const StageMemoryPrediction p = PredictStageMemory(sp, layout);
    int64_t bytes = p.arena + p.accumulators + p.workspace;
    if (!host) {
      // Every constant a stage reads moves to the device (parameters and optimizer state among them).
      for (ir::ValueId v = 0; v < sp.graph.num_values(); ++v) {
        const std::optional<ir::Tensor>& c = sp.graph.value(v).constant;
        if (c && c->has_data()) bytes += ir::AlignUp(c->num_bytes());
      }
    }
    need.stage_bytes.push_back(bytes);
    need.total += bytes;
  }
  return need;
}

absl::StatusOr<int64_t> AvailableBytes(const backend::Backend& be, int64_t budget) {
  absl::StatusOr<int64_t> free = be.FreeMemoryBytes();
  if (absl::IsUnimplemented(free.status()) && budget > 0) return budget;
  RETURN_IF_ERROR(free.status());
  return budget > 0 ? std::min(*free, budget) : *free;
}

absl::Status CheckFits(const PlanMemoryNeed& need, const backend::Backend& be, int64_t budget) {
  absl::StatusOr<int64_t> available = AvailableBytes(be, budget);
  if (absl::IsUnimplemented(available.status())) return absl::OkStatus();
  RETURN_IF_ERROR(available.status());
  if (need.total <= *available) return absl::OkStatus();
  std::string stages;
  for (size_t s = 0; s < need.stage_bytes.size() && need.stage_bytes.size() > 1; ++s)
    stages += (s ? ", " : " (stage ") + std::to_string(s) + ": " + HumanBytes(need.stage_bytes[s]);
  if (!stages.empty()) stages += ")";
  const std::string limit = *available == budget ? "--memory-budget allows " + HumanBytes(budget)
                            : be.placement().host() ? "the host has " + HumanBytes(*available) + " free"
                                                    : "the " + be.name() + " device has " + HumanBytes(*available) +
                                                          " free";
  return absl::ResourceExhaustedError("out of memory before the run: the plan needs " + HumanBytes(need.total) +
                                      stages + " of " + be.name() + " memory, and " + limit);
}

}  // namespace onnxpipe::pipeline
