// The partitioner: a pure function from a training graph, the devices and the options to a
// pipeline plan (Glow partitioner style). Phases, numbered in the code:
//   1. cost model          cost_model.h   FLOPs/bytes roofline per device, or measured times
//   2. cut candidates      analysis.h     positions, ownership, crossing bytes, units
//   3. search              search.cc      exact DP over contiguous unit ranges (below)
//   4. recompute           recompute.h    none | full | selective | auto regions per stage
//   5. programs, memory    stage_program.h  each stage's complete program (what the executor runs)
//                                         and the static memory planner on it
//   6. schedule            schedule.h     the GPipe / 1F1B action lists (what the executor runs),
//                                         simulated: timeline, bubbles, step time
//
// The training graph is the one micro-batch's step: forward, loss, backward and optimizer update
// with the batch dim bound to the micro-batch size B / (D x M) (executor/train's Trainer builds it;
// D = 1 without data parallelism).
//
// Phase 3 minimises the predicted step time
//   T = sum_s p_s + (M - 1) * max_s p_s + sum_cuts (send forward + send backward),
//   p_s = forward + backward + recompute time of stage s per micro-batch,
// which is exactly the GPipe makespan when every stage's backward is the same multiple of its
// forward, and the 1F1B makespan for uniform stages (it is what Alpa and PipeDream optimise), subject to every stage's
// memory <= the device's usable memory. It enumerates the bottleneck t = max_s p_s over the distinct stage costs in
// increasing order, from the smallest feasible one (binary search), solving for each t the DP
//   best[k][j] = min_i best[k-1][i] + p(i, j) + comm(i),  over stages with p(i, j) <= t,
// and stops once (M - 1) t + min_sum can no longer beat the best T: exact for T. The plans found
// on the way (the sum/bottleneck Pareto front) are then simulated (phase 6) and the one with the
// lowest simulated step time wins; each cut then moves to its best position between its
// neighbours while the simulated step improves (for 1F1B with uneven stages the makespan is not
// exactly T). Simulated steps within a millionth are ties, broken by the smaller bottleneck; with
// one micro-batch (no pipelining, T = the sum) the most balanced split within 2% of the fastest
// is taken. Memory in the DP comes from the unit table's lower bounds
// (unit_table.h); every plan the search returns is re-checked with the memory planner (phase 5),
// and stages the planner rejects get their exact numbers and the search runs again, so the final
// plan fits by the planner's numbers and no plan that fits was excluded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "partitioner/analysis.h"
#include "partitioner/cost_model.h"
#include "partitioner/device.h"
#include "partitioner/recompute.h"
#include "partitioner/schedule.h"
#include "partitioner/stage_program.h"
#include "partitioner/unit_table.h"

namespace onnxpipe::partitioner {

// The devices of the pipeline: one per stage, all alike.
struct Cluster {
  DeviceProfile device;
};

enum class Objective { kFewestStages, kThroughput };

struct PartitionOptions {
  int64_t num_stages = 0;  // 0: auto (see objective)
  Objective objective = Objective::kFewestStages;
  int64_t max_stages = 64;  // upper end of the auto search
  int64_t batch = 0;        // global batch B
  int64_t microbatches = 1;  // M per replica; the training graph is bound to B / (D * M)
  // D data-parallel replicas of the pipeline (K x D ranks): the plan is made for one replica's batch
  // B / D, and each stage's step ends with the all-reduce of its accumulated gradients over its D
  // replicas (PartitionPlan::data_parallel_allreduce_ms).
  int64_t data_parallel = 1;
  // The executor's all-reduce buckets (ExecutorOptions::dp_bucket_bytes): how much of the all-reduce the last
  // micro-batch's backward hides.
  int64_t dp_bucket_bytes = int64_t{25} << 20;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  Precision precision = Precision::kFP32;
  int64_t memory_bytes = 0;  // overrides the device's memory (--device-memory); reserved still applies
  std::shared_ptr<const OpTimes> op_times;  // measured times (--profile), or null for the roofline
  double cut_slack = 0.05;
  int64_t alignment = 64;
  int max_verify_rounds = 64;
  std::string model;  // for the reports
  std::string optimizer;  // for the reports ("sgd", "adamw")
  // The backend's kernel scratch per node, counted in every stage's memory: the CPU backend's for the
  // CPU device, a cuda profile's (ProfileScratch) for a GPU; null: not counted (a GPU target without
  // one, whose cuBLASLt/cuDNN scratch sizes need the device), which plan.json says.
  WorkspaceFn workspace;
};

struct BoundaryTensor {
  std::string name, dtype;
  std::vector<int64_t> dims;
  int64_t bytes = 0;
  std::string kind;          // activation | gradient | data | step | global
  std::vector<int32_t> peers;  // stages it comes from / goes to (empty for data and step inputs)
};

struct RegionPlan {
  std::vector<std::string> nodes;
  std::string before;  // the backward node it runs before
  double ms = 0;
};

struct StagePlan {
  int32_t index = 0;
  int32_t unit_begin = 0, unit_end = 0;          // units [begin, end)
  int32_t position_begin = 0, position_end = 0;  // forward positions [begin, end)
  std::vector<std::string> forward_nodes, backward_nodes, optimizer_nodes;  // schedule order
  // Gradient tails of shared parameters owned by another stage, run here as well (analysis.h).
  std::vector<std::string> replicated_nodes;
  std::vector<std::string> parameters;
  int64_t parameter_count = 0;
  std::vector<BoundaryTensor> boundary_inputs, boundary_outputs;
  std::string recompute;                   // none | full | selective | auto
  std::vector<std::string> unit_recompute; // per unit: none | selective | unit | full
  std::vector<RegionPlan> recompute_regions;
  std::vector<Action> actions;             // the stage's action list (schedule.h), what the executor runs
  StageMemory memory;
  double forward_ms = 0, backward_ms = 0, recompute_ms = 0, optimizer_ms = 0;
  double send_forward_ms = 0, send_backward_ms = 0;
  // Data parallelism (D > 1): the stage's accumulated gradients (StageProgram::accumulate, what the
  // executor all-reduces in place over the stage's D replicas, one all-reduce per tensor: no memory
  // added), their bytes, the ring all-reduce time (RingAllReduceSeconds per tensor over the device's
  // data_parallel_link()), the buckets (PartitionOptions::dp_bucket_bytes) and the part of the time
  // the last micro-batch's backward does not hide (DataParallelExposedSeconds); 0 for D = 1.
  int64_t data_parallel_bytes = 0, data_parallel_tensors = 0, data_parallel_buckets = 0;
  double data_parallel_allreduce_ms = 0, data_parallel_exposed_ms = 0;
  std::vector<std::string> layers;  // layer keys with forward nodes here, in order
};

struct LayerPlan {
  std::string name;
  std::vector<int32_t> stages;
  double forward_ms = 0, backward_ms = 0;
  int64_t parameter_bytes = 0;
};

struct SearchStats {
  int32_t positions = 0, cut_candidates = 0, units = 0;
  int64_t dp_runs = 0, bottlenecks_tried = 0, pareto_candidates = 0;
  int32_t verify_rounds = 0, stages_planned = 0;
  int32_t refinements = 0;  // single-cut moves the simulation accepted after the exact search
  double best_objective_ms = 0;  // min of T over the plans that fit
  double seconds = 0;
  std::vector<int64_t> stages_tried;  // auto: the stage counts searched
};

struct PartitionPlan {
  int schema_version = 3;        // plan_io.h's kPlanSchemaVersion
  bool kernel_scratch_counted = false;  // stages' memory.kernel_scratch from the backend (PartitionOptions::workspace)
  std::string model, optimizer;
  DeviceProfile device;
  int64_t capacity_bytes = 0;  // usable per device
  // batch: one replica's (what `train --plan` checks: batch x --data-parallel = its --batch);
  // the global batch is batch x data_parallel, in microbatches x microbatch_size per replica.
  int64_t num_stages = 0, batch = 0, microbatches = 0, microbatch_size = 0, data_parallel = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  Precision precision = Precision::kFP32;
  Objective objective = Objective::kFewestStages;
  bool stages_auto = false;
  std::vector<StagePlan> stages;
  std::vector<LayerPlan> layers;
  std::vector<std::string> global_nodes;
  // step_ms = the simulated pipeline (timeline.step_s) + data_parallel_exposed_ms, the largest
  // stage's all-reduce time its backward does not hide, counted after the whole pipeline (not
  // overlapped with the other stages' drain: an upper bound); samples_per_s = the global batch /
  // step_ms. data_parallel_allreduce_ms: the largest stage's whole all-reduce time.
  double step_ms = 0, bubble_fraction = 0, samples_per_s = 0, data_parallel_allreduce_ms = 0;
  double data_parallel_exposed_ms = 0;
  double analytic_step_ms = 0;  // T of the chosen plan (the pipeline alone)
  ScheduleResult timeline;
  CostSummary cost;
  SearchStats search;
  std::vector<std::string> warnings;
};

// Phases 1 and 2 once per training graph (the sweep reuses it across stage and micro-batch
// counts of one micro-batch size). Keeps a pointer to `training_graph`: it must outlive this.
class PartitionContext {
 public:
  static absl::StatusOr<std::unique_ptr<PartitionContext>> Create(
      const ir::Graph& training_graph, const Cluster& cluster, Precision precision,
      std::shared_ptr<const OpTimes> op_times, int64_t microbatch_size, double cut_slack = 0.05,
      int64_t alignment = 64);

  const GraphAnalysis& analysis() const { return analysis_; }
  const UnitTable& units() const { return units_; }
  const std::vector<double>& node_seconds() const { return node_seconds_; }
  const Cluster& cluster() const { return cluster_; }
  const CostSummary& cost() const { return cost_; }
  int64_t alignment() const { return alignment_; }

 private:
  PartitionContext() = default;
  Cluster cluster_;
  GraphAnalysis analysis_;
  UnitTable units_;
  std::vector<double> node_seconds_;
  CostSummary cost_;
  int64_t alignment_ = 64;
};

// Phases 3-6. Fails with a message naming the smallest per-device memory or the fewest stages
// that would fit when nothing fits; on bad options (K > cut candidates + 1, D x M > B, B % (D x M) != 0).
absl::StatusOr<PartitionPlan> Partition(const PartitionContext& ctx, const PartitionOptions& options);

// Phases 1-6 in one call.
absl::StatusOr<PartitionPlan> Partition(const ir::Graph& training_graph, const Cluster& cluster,
                                        const PartitionOptions& options);

// One stage assignment, given by its unit ranges ([begin, end) per stage, contiguous, covering
// every unit) and, for auto recompute, a per-unit choice: phases 4-6 without the search. The plan
// records whether every stage fits (`fits`). Used by the search's verification and by tests that
// compare the search with brute force.
struct StageAssignment {
  std::vector<std::pair<int32_t, int32_t>> ranges;
  std::vector<UnitRecompute> unit_choice;  // size U; used with RecomputePolicy::kAuto
};
absl::StatusOr<PartitionPlan> PlanAssignment(const PartitionContext& ctx, const PartitionOptions& options,
                                             const StageAssignment& assignment, bool* fits);

// Checks the options against the context (errors naming the flags for D < 1, M x D > B,
// B % (M x D) != 0, K > units, ...).
absl::Status ValidateOptions(const PartitionContext& ctx, const PartitionOptions& options);
// The batch checks alone (needs no model): D >= 1, M >= 1, M x D <= B, B % (M x D) == 0.
absl::Status ValidateBatch(const PartitionOptions& options);

}  // namespace onnxpipe::partitioner
