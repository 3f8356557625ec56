#include "tests/pipeline/pipeline_test_util.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "frontend/ir/status.h"
#include "nlohmann/json.hpp"
#include "tools/model.h"

namespace onnxpipe::pipeline::testing {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return NOT_FOUND() << "cannot read " << path;
  return nlohmann::json::parse(f);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelFixture>> ModelFixture::Load(const std::string& name) {
  const std::string src = ONNXPIPE_SOURCE_DIR;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelFixture> f,
                   FromFile(src + "/models/" + name + ".onnx", src + "/models/" + name + ".json",
                            src + "/models/golden/" + name + "/data", 4));
  f->name_ = name;
  return f;
}

absl::StatusOr<std::unique_ptr<ModelFixture>> ModelFixture::FromFile(const std::string& onnx_path,
                                                                     const std::string& sidecar_json,
                                                                     const std::string& data_dir, int64_t batch) {
  auto f = std::make_unique<ModelFixture>();
  f->name_ = onnx_path;
  f->batch_ = batch;
  ASSIGN_OR_RETURN(tools::Model model, tools::ImportModel(onnx_path, /*allow_unsupported=*/false));
  f->imported_ = std::move(*model.imported);
  ASSIGN_OR_RETURN(nlohmann::json sidecar, ReadJson(sidecar_json));
  if (sidecar["freeze_regex"].is_string()) f->freeze_regex_ = sidecar["freeze_regex"];
  ASSIGN_OR_RETURN(f->fields_, train::DataFields(f->imported_, "logits", "labels"));
  std::map<std::string, int64_t> bindings;
  ASSIGN_OR_RETURN(train::Dataset data, train::Dataset::Load(data_dir, f->fields_, batch, &bindings));
  f->data_ = std::make_unique<train::Dataset>(std::move(data));
  f->other_bindings_ = tools::NonBatchBindings(f->imported_, bindings);
  return f;
}

absl::StatusOr<train::TrainOptions> ModelFixture::Options(const RunConfig& c, int64_t batch) const {
  train::TrainOptions o;
  o.batch = batch;
  o.steps = c.steps;
  o.optimizer.kind = c.optimizer;
  if (c.optimizer == autodiff::OptimizerKind::kSGD) {
    o.optimizer.momentum = 0.9;
    o.optimizer.weight_decay = 0.01;
  } else {
    o.optimizer.weight_decay = 0.01;
  }
  o.optimizer.clip_norm = c.clip_norm;
  o.lr = c.lr;
  o.logits = "logits";
  o.labels = "labels";
  o.freeze_regex = freeze_regex_;
  o.dtype = c.dtype;
  o.seed = c.seed;
  o.dropout = c.dropout;
  o.ignore_index = ignore_index_;
  return o;
}

StepFeeds ModelFixture::Feeds(int64_t step, double lr, ir::DType dtype) const {
  StepFeeds f;
  f.step = step;
  f.lr = lr;
  const std::vector<int64_t> rows = data_->BatchRows(step, batch_, /*shuffle=*/false, /*seed=*/0);
  for (const train::FieldSpec& field : fields_) {
    ir::Tensor t = data_->Gather(field.name, rows);
    if (ir::IsFloat(t.dtype()) && t.dtype() != dtype) t = t.CastTo(dtype);
    f.batch[field.name] = t;
  }
  return f;
}

absl::StatusOr<RunResult> ModelFixture::Reference(const RunConfig& c) const {
  tools::Model model;
  model.imported = imported_;
  tools::ModelOptions mo;
  mo.batch = batch_;
  mo.extra_dims = other_bindings_;
  RETURN_IF_ERROR(tools::PrepareModel(model, mo));
  ASSIGN_OR_RETURN(train::TrainOptions o, Options(c, batch_));
  ASSIGN_OR_RETURN(train::Trainer trainer, train::Trainer::Create(*model.graph, o));
  RETURN_IF_ERROR(trainer.SetData(*data_));
  RunResult r;
  for (int32_t k = 0; k < c.steps; ++k) {
    ASSIGN_OR_RETURN(train::StepMetrics m, trainer.Step());
    r.losses.push_back(m.loss);
    r.grad_norms.push_back(m.grad_norm);
  }
  r.params = trainer.Parameters();
  return r;
}

absl::StatusOr<ir::Graph> ModelFixture::MicrobatchTrainingGraph(const RunConfig& c) const {
  if (batch_ % c.microbatches != 0) {
    return INVALID_ARGUMENT() << "batch " << batch_ << " is not divisible by " << c.microbatches;
  }
  const int64_t b = batch_ / c.microbatches;
  ASSIGN_OR_RETURN(train::TrainOptions o, Options(c, b));
  ASSIGN_OR_RETURN(ir::Graph forward, PrepareMicrobatchForward(imported_, "B", b, other_bindings_, o.dtype));
  ASSIGN_OR_RETURN(autodiff::TrainingGraph tg, autodiff::BuildTrainingGraph(forward, o));
  return std::move(tg.graph);
}

absl::StatusOr<partitioner::PartitionPlan> ModelFixture::Plan(const RunConfig& c, const ir::Graph& g) const {
  return PartitionAtFixedStages(g, c.stages, batch_, c.microbatches, c.schedule, c.recompute, "cpu", name_);
}

absl::StatusOr<RunResult> ModelFixture::Pipeline(const RunConfig& c, const ir::Graph* graph) const {
  ir::Graph built;
  if (graph == nullptr) {
    ASSIGN_OR_RETURN(built, MicrobatchTrainingGraph(c));
    graph = &built;
  }
  const ir::Graph& g = *graph;
  ASSIGN_OR_RETURN(const partitioner::PartitionPlan plan, Plan(c, g));
  ASSIGN_OR_RETURN(partitioner::CompiledPlan compiled, partitioner::CompilePlan(g, plan));
  ExecutorOptions eo;
  eo.dropout = c.dropout;
  eo.seed = c.seed;
  eo.check_numerics = c.check_numerics;
  eo.graphs = c.graphs;
  eo.node_hook = c.hook;
  eo.recv_timeout_s = c.recv_timeout_s;
  eo.nccl_semantics = c.nccl_semantics;
  RunResult r;
  ASSIGN_OR_RETURN(r.executor, PipelineExecutor::Create(g, std::move(compiled), eo, c.backend));
  for (int32_t k = 0; k < c.steps; ++k) {
    ASSIGN_OR_RETURN(PipelineStepResult s, r.executor->Step(Feeds(k, c.lr, c.dtype)));
    r.losses.push_back(s.loss);
    r.grad_norms.push_back(s.grad_norm);
    r.steps.push_back(std::move(s));
  }
  r.params = r.executor->Parameters();
  return r;
}

double MaxRelDiff(const ir::Tensor& a, const ir::Tensor& b, double floor) {
  if (a.dims() != b.dims()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double x = a.GetAsDouble(i), y = b.GetAsDouble(i);
    worst = std::max(worst, std::abs(x - y) / std::max(std::abs(y), floor));
  }
  return worst;
}

double NormRelDiff(const ir::Tensor& a, const ir::Tensor& b) {
  if (a.dims() != b.dims()) return INFINITY;
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.num_elements(); ++i) {
    const double x = a.GetAsDouble(i), y = b.GetAsDouble(i);
    d += (x - y) * (x - y);
    n += y * y;
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

RunConfig PipelineCase::Config() const {
  RunConfig c;
  c.stages = stages;
  c.microbatches = microbatches;
  c.schedule = schedule;
  c.recompute = recompute;
  c.optimizer = optimizer;
  c.dropout = true;
  c.lr = optimizer == autodiff::OptimizerKind::kAdamW ? 1e-3 : 0.05;
  return c;
}

std::string PipelineCase::Name() const {
  return model + "_K" + std::to_string(stages) + "_M" + std::to_string(microbatches) + "_" + ScheduleName(schedule) +
         "_" + RecomputePolicyName(recompute);
}

std::string Describe(const RunConfig& c) {
  std::ostringstream os;
  os << ir::DTypeName(c.dtype) << " K=" << c.stages << " M=" << c.microbatches << " " << ScheduleName(c.schedule)
     << " recompute=" << RecomputePolicyName(c.recompute);
  return os.str();
}

}  // namespace onnxpipe::pipeline::testing
