#include "executor/pipeline/fit_search.h"

#include <utility>
#include <vector>

#include "executor/pipeline/memory_check.h"
#include "executor/pipeline/microbatch.h"
#include "executor/pipeline/pipeline_trainer.h"
#include "frontend/ir/status.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::pipeline {
namespace {

// What the run would allocate with `microbatches` and `recompute`, planned as PipelineTrainer::Create plans it.
absl::StatusOr<int64_t> NeedWith(const FitQuery& q, int32_t microbatches, partitioner::RecomputePolicy recompute) {
  const int64_t b = q.options->batch / microbatches;
  ASSIGN_OR_RETURN(ir::Graph forward, PrepareMicrobatchForward(*q.imported, "B", b, *q.other_bindings, q.options->dtype));
  train::TrainOptions mo = *q.options;
  mo.batch = b;
  ASSIGN_OR_RETURN(autodiff::TrainingGraph tg, autodiff::BuildTrainingGraph(forward, mo));
  const partitioner::Precision precision =
      q.options->dtype == ir::DType::kBF16 ? partitioner::Precision::kBF16 : partitioner::Precision::kFP32;
  ASSIGN_OR_RETURN(partitioner::PartitionPlan plan,
                   PartitionAtFixedStages(tg.graph, q.stages, q.options->batch, microbatches, q.schedule, recompute,
                                          q.device, q.model_name, precision, q.backend));
  ASSIGN_OR_RETURN(partitioner::CompiledPlan compiled, partitioner::CompilePlan(tg.graph, plan));
  ASSIGN_OR_RETURN(PlanMemoryNeed need, PlanAllocationBytes(compiled, *q.backend));
  return need.total;
}

}  // namespace

absl::StatusOr<std::string> SmallestChangeThatFits(const FitQuery& q) {
  using partitioner::RecomputePolicy;
  ASSIGN_OR_RETURN(const int64_t free, AvailableBytes(*q.backend, q.budget));
  std::vector<std::pair<int32_t, RecomputePolicy>> candidates;
  for (RecomputePolicy r : {RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
    if (r != q.recompute) candidates.push_back({q.microbatches, r});
  }
  // Up to 1024x the micro-batches: beyond, a micro-batch is too small to keep a device busy.
  for (int64_t m = int64_t{2} * q.microbatches; m <= q.options->batch && m <= 1024 * q.microbatches; m *= 2) {
    if (q.options->batch % m != 0) continue;
    candidates.push_back({static_cast<int32_t>(m), q.recompute});
    for (RecomputePolicy r : {RecomputePolicy::kSelective, RecomputePolicy::kFull}) {
      if (r != q.recompute) candidates.push_back({static_cast<int32_t>(m), r});
    }
  }
  for (const auto& [m, r] : candidates) {
    absl::StatusOr<int64_t> need = NeedWith(q, m, r);
    if (!need.ok() || *need > free) continue;  // a candidate that cannot be planned is no answer either
    std::string flags;
    if (m != q.microbatches) flags += "--microbatches " + std::to_string(m);
    if (r != q.recompute) {
      flags += (flags.empty() ? "" : " ") + std::string("--recompute ") + partitioner::RecomputePolicyName(r);
    }
    return flags + " (the plan then needs " + HumanBytes(*need) + ")";
  }
  return std::string();
}

absl::Status AddFitAdvice(const absl::Status& oom, const FitQuery& q) {
  absl::StatusOr<std::string> change = SmallestChangeThatFits(q);
  std::string advice;
  if (!change.ok()) {
    advice = "; no smaller plan was searched (" + std::string(change.status().message()) + ")";
  } else if (change->empty()) {
    advice = "; no --microbatches (up to 1024x) or --recompute fits: lower --batch or use more devices";
  } else {
    advice = "; the smallest change that fits: " + *change;
  }
  return absl::Status(oom.code(), std::string(oom.message()) + advice);
}

}  // namespace onnxpipe::pipeline
