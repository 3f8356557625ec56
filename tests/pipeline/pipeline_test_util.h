// Shared by the pipeline training tests: load a shipped model and its golden data once, train it
// unpartitioned (train::Trainer, full batch) or pipelined (PipelineExecutor over the training graph
// of one micro-batch), and compare the runs.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/pipeline/executor.h"
#include "executor/pipeline/pipeline_trainer.h"
#include "executor/train/dataset.h"
#include "executor/train/trainer.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::pipeline::testing {

using partitioner::RecomputePolicy;
using partitioner::RecomputePolicyName;
using partitioner::ScheduleKind;
using partitioner::ScheduleName;

struct RunConfig {
  ir::DType dtype = ir::DType::kF64;
  int32_t stages = 1, microbatches = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  RecomputePolicy recompute = RecomputePolicy::kNone;
  int32_t steps = 3;
  autodiff::OptimizerKind optimizer = autodiff::OptimizerKind::kSGD;
  double lr = 0.05;
  double clip_norm = 1.0;
  bool dropout = false;
  uint64_t seed = 7;
  bool check_numerics = false;
  bool graphs = false;  // ExecutorOptions::graphs
  NodeHook hook;
  double recv_timeout_s = 0;
  bool nccl_semantics = false;                      // ExecutorOptions::nccl_semantics
  std::shared_ptr<const backend::Backend> backend;  // null: the CPU backend
};

struct RunResult {
  std::vector<double> losses, grad_norms;
  std::map<std::string, ir::Tensor> params;
  std::vector<PipelineStepResult> steps;  // pipelined runs only
  std::unique_ptr<PipelineExecutor> executor;  // pipelined runs only
};

// A pipelined configuration of a shipped model, as the backend tests sweep them.
struct PipelineCase {
  std::string model;
  int32_t stages, microbatches;
  ScheduleKind schedule;
  RecomputePolicy recompute;
  autodiff::OptimizerKind optimizer;
  // Its RunConfig: dropout on, lr 1e-3 for AdamW and 0.05 for SGD.
  RunConfig Config() const;
  // A test name: model_K<k>_M<m>_<schedule>_<recompute>.
  std::string Name() const;
};

class ModelFixture {
 public:
  // models/<name>.onnx with models/golden/<name>/data (batch 4).
  static absl::StatusOr<std::unique_ptr<ModelFixture>> Load(const std::string& name);

  int64_t batch() const { return batch_; }
  const ir::Graph& imported() const { return imported_; }

  absl::StatusOr<train::TrainOptions> Options(const RunConfig& c, int64_t batch) const;
  // The unpartitioned reference: train::Trainer on the full batch.
  absl::StatusOr<RunResult> Reference(const RunConfig& c) const;
  // The training graph of one micro-batch (what the pipeline runs).
  absl::StatusOr<ir::Graph> MicrobatchTrainingGraph(const RunConfig& c) const;
  // The partitioner's plan at c.stages (what `train --stages K` runs).
  absl::StatusOr<partitioner::PartitionPlan> Plan(const RunConfig& c, const ir::Graph& graph) const;
  // `graph`: MicrobatchTrainingGraph(c) when already built (it depends on dtype, M and the optimizer).
  absl::StatusOr<RunResult> Pipeline(const RunConfig& c, const ir::Graph* graph = nullptr) const;
  // The feeds of step k (B rows of every input).
  StepFeeds Feeds(int64_t step, double lr, ir::DType dtype) const;

  // A fixture over another forward graph (e.g. a fixed-batch export of the same model).
  static absl::StatusOr<std::unique_ptr<ModelFixture>> FromFile(const std::string& onnx_path,
                                                                const std::string& sidecar_json,
                                                                const std::string& data_dir, int64_t batch);

 private:
  std::string name_;
  ir::Graph imported_;
  std::unique_ptr<train::Dataset> data_;
  std::vector<train::FieldSpec> fields_;
  std::map<std::string, int64_t> other_bindings_;  // S from the data
  std::string freeze_regex_;
  int64_t batch_ = 4;
  int64_t ignore_index_ = -100;
};

// Largest |a - b| / max(|b|, floor) over two tensors of equal dims (as doubles).
double MaxRelDiff(const ir::Tensor& a, const ir::Tensor& b, double floor = 1e-3);
// ||a - b||_2 / ||b||_2 (infinity for other dims).
double NormRelDiff(const ir::Tensor& a, const ir::Tensor& b);
std::string Describe(const RunConfig& c);

}  // namespace onnxpipe::pipeline::testing
