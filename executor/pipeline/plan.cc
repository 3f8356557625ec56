#include "executor/pipeline/plan.h"

#include "frontend/ir/status.h"
#include "partitioner/device.h"

namespace onnxpipe::pipeline {

partitioner::RecomputePolicy ToPlanRecompute(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::kNone: return partitioner::RecomputePolicy::kNone;
    case RecomputePolicy::kFull: return partitioner::RecomputePolicy::kFull;
    case RecomputePolicy::kSelective: return partitioner::RecomputePolicy::kSelective;
    case RecomputePolicy::kAuto: return partitioner::RecomputePolicy::kAuto;
  }
  return partitioner::RecomputePolicy::kNone;
}
RecomputePolicy FromPlanRecompute(partitioner::RecomputePolicy p) {
  switch (p) {
    case partitioner::RecomputePolicy::kNone: return RecomputePolicy::kNone;
    case partitioner::RecomputePolicy::kFull: return RecomputePolicy::kFull;
    case partitioner::RecomputePolicy::kSelective: return RecomputePolicy::kSelective;
    case partitioner::RecomputePolicy::kAuto: return RecomputePolicy::kAuto;
  }
  return RecomputePolicy::kNone;
}

absl::StatusOr<StageAssignment> AssignFromPlan(const ir::Graph& g, const partitioner::PartitionPlan& plan) {
  const int32_t K = static_cast<int32_t>(plan.stages.size());
  if (K < 1) return INVALID_ARGUMENT() << "the plan has no stages";
  std::map<std::string, int32_t> stage_of;
  std::vector<std::string> recompute;
  for (const partitioner::StagePlan& sp : plan.stages) {
    for (const std::string& n : sp.forward_nodes) {
      if (!stage_of.emplace(n, sp.index).second) {
        return INVALID_ARGUMENT() << "the plan puts forward node '" << n << "' on two stages";
      }
    }
    for (const partitioner::RegionPlan& r : sp.recompute_regions) recompute.insert(recompute.end(), r.nodes.begin(), r.nodes.end());
  }
  ASSIGN_OR_RETURN(StageAssignment a, AssignByName(g, K, stage_of));
  RETURN_IF_ERROR(MarkRecomputeByName(g, recompute, &a));
  return a;
}

absl::StatusOr<partitioner::PartitionPlan> PartitionInProcess(const ir::Graph& g, int32_t num_stages, int64_t batch,
                                                              int32_t microbatches, partitioner::ScheduleKind schedule,
                                                              RecomputePolicy recompute, const std::string& device,
                                                              const std::string& model_name) {
  partitioner::Cluster cluster;
  ASSIGN_OR_RETURN(cluster.device, partitioner::ResolveDevice(device));
  partitioner::PartitionOptions o;
  o.num_stages = num_stages;
  o.batch = batch;
  o.microbatches = microbatches;
  o.schedule = schedule;
  o.recompute = ToPlanRecompute(recompute);
  o.model = model_name;
  return partitioner::Partition(g, cluster, o);
}

}  // namespace onnxpipe::pipeline
