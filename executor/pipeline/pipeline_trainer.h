// Training from a model: what `onnxpipe train` runs, on one stage by default, pipelined with
// --stages K | --plan DIR. It trains what the CPU reference train::Trainer does (same training graph,
// data order, learning-rate schedule, metrics, state names) with the step run by PipelineExecutor over
// M micro-batches, behind the same train::StepTrainer interface (so tools/train_loop.h drives it and
// checkpoints are interchangeable):
//   imported forward graph --PrepareMicrobatchForward(B / M)--> autodiff::BuildTrainingGraph of one
//   micro-batch --plan (plan.json as written, or the partitioner at fixed K for --stages K)-->
//   partitioner::CompilePlan --> PipelineExecutor.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/comm/comm.h"
#include "executor/pipeline/executor.h"
#include "executor/train/dataset.h"
#include "executor/train/metrics.h"
#include "executor/train/step_trainer.h"
#include "executor/train/training_graph.h"
#include "frontend/autodiff/lr_schedule.h"
#include "partitioner/partitioner.h"

namespace onnxpipe::pipeline {

// `--stages K` without a plan: the partitioner at fixed K on a device profile (a built-in name or a
// JSON file, partitioner/device.h), what `onnxpipe partition --stages K` would write (with no memory
// budget but for --recompute auto). `precision` is the training graph's (bf16 for a mixed-precision one);
// `backend`, when given, is the run's: its kernel scratch is counted in the stages' memory.
absl::StatusOr<partitioner::PartitionPlan> PartitionAtFixedStages(
    const ir::Graph& training_graph, int32_t num_stages, int64_t batch, int32_t microbatches,
    partitioner::ScheduleKind schedule, partitioner::RecomputePolicy recompute, const std::string& device,
    const std::string& model_name, partitioner::Precision precision = partitioner::Precision::kFP32,
    std::shared_ptr<const backend::Backend> backend = nullptr);

struct PipelineTrainOptions {
  int32_t stages = 0;        // K; 0: the plan's
  int32_t microbatches = 0;  // M; 0: the plan's, or 1
  std::string schedule;      // gpipe | 1f1b; "": the plan's, or 1f1b
  std::string recompute;     // none | full | selective | auto; "": the plan's, or none
  std::string plan_dir;      // `onnxpipe partition --out DIR`
  std::string report_dir;    // --report DIR
  std::string device =
      "cpu";  // the partitioner's device profile without a plan: the cuts of --stages K, --recompute auto
  double recv_timeout_s = 0;
  int64_t memory_budget = 0;  // bytes the run may allocate on its device (memory_check.h); 0: its free memory
  bool graphs = false;        // ExecutorOptions::graphs (--cuda-graphs)
  std::shared_ptr<const backend::Backend> backend;  // where the stages run; null: the CPU backend
  // Multi-process (`onnxpipe launch`, srun, torchrun): this process's comm over the world of K x D ranks
  // (it must outlive the trainer); the process runs stage world->rank() % K of replica world->rank() / K
  // (topology.h). `data_parallel` is D: every replica trains on its 1/D of the global batch.
  comm::Comm* world = nullptr;
  int32_t data_parallel = 1;
  int64_t dp_bucket_bytes = int64_t{25} << 20;  // ExecutorOptions::dp_bucket_bytes (--dp-bucket-mb)
};

class PipelineTrainer : public train::StepTrainer {
 public:
  // `imported`: the model as imported and shape-inferred (tools/model.h's Model::imported), not yet
  // bound; `other_bindings`: sizes of its non-batch symbols (the sequence length from the data).
  // `options.batch` is the global batch B (D replicas of M micro-batches of B / (D x M)).
  static absl::StatusOr<std::unique_ptr<PipelineTrainer>> Create(const ir::Graph& imported,
                                                                 const std::map<std::string, int64_t>& other_bindings,
                                                                 const train::TrainOptions& options,
                                                                 const PipelineTrainOptions& pipeline,
                                                                 const std::string& model_name);
  // Checks the labels against the classes (as train::Trainer::SetData) and keeps the data.
  absl::Status SetData(train::Dataset data) override;
  absl::StatusOr<train::StepMetrics> Step() override;
  int64_t step() const override { return step_; }

  // With a world comm: this rank's stage's, or on rank 0 after GatherModel (until the next step) the whole model's.
  std::map<std::string, ir::Tensor> Parameters() const override;
  int64_t num_trainable_parameters() const override;
  const std::vector<std::string>& unreachable_parameters() const override { return unreachable_; }
  // The executor's states (every holder of a shared parameter is set on Restore).
  std::map<std::string, ir::Tensor> State() const override;
  // Multi-process: collects the whole model's state on rank 0 (for a checkpoint, --save, --eval). Collective:
  // every rank calls it after the same step. A failure aborts the world. No-op without a world comm.
  absl::Status GatherModel();
  std::map<std::string, ir::Tensor> StateShapes() const override { return executor_->StateShapes(); }
  absl::Status Restore(const std::map<std::string, ir::Tensor>& state, int64_t step) override;
  const PipelineExecutor& executor() const { return *executor_; }
  const std::vector<PipelineStepResult>& results() const { return results_; }
  std::string Describe() const;  // "K stages, M micro-batches of b, 1f1b, recompute selective"

  // Writes --report DIR (report.h) for the steps run so far; no-op without --report.
  absl::Status WriteReport() const;

 private:
  PipelineTrainer() = default;
  train::TrainOptions options_;
  PipelineTrainOptions pipeline_;
  std::string model_name_, recompute_name_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::optional<partitioner::PartitionPlan> plan_;
  std::optional<train::Dataset> data_;
  std::optional<autodiff::LrSchedule> schedule_;
  std::map<std::string, ir::DType> input_dtypes_;
  std::vector<std::string> unreachable_;
  int64_t num_classes_ = 0, num_trainable_ = 0;
  int64_t step_ = 0;
  std::vector<PipelineStepResult> results_;
  // The batch of step `next_step_`, gathered on another thread while the previous step runs.
  using Feed = std::map<std::string, ir::Tensor>;
  absl::StatusOr<Feed> Gather(int64_t step) const;
  std::future<absl::StatusOr<Feed>> next_feed_;
  int64_t next_step_ = -1;
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;  // samples/s counts step to step
  std::optional<std::map<std::string, ir::Tensor>> gathered_;           // GatherModel's, on rank 0
  uint64_t gathers_ = 0;                                                // GatherModel calls (their tags)
};

}  // namespace onnxpipe::pipeline
