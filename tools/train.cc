// onnxpipe train: trains a model from its ONNX file on the CPU backend (executor/train).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "executor/pipeline/pipeline_trainer.h"
#include "executor/train/dataset.h"
#include "executor/train/metrics.h"
#include "executor/train/trainer.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/writer.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/model.h"

namespace onnxpipe::tools {
namespace {

struct Flags {
  std::string data, optimizer = "sgd", schedule = "constant", logits, labels = "labels", metrics;
  std::string backend = "cpu", dtype = "fp32", freeze, data_format = "npy", checkpoint;
  int64_t batch = 0, steps = 0, warmup_steps = 0, seed = 0, ignore_index = -100, seq = 0;
  double lr = 0, momentum = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double clip_norm = 0, label_smoothing = 0;
  bool nesterov = false, shuffle = false, dropout = true, check_numerics = false;
  int64_t stages = 0, microbatches = 0;  // pipelined training (executor/pipeline)
  std::string recompute, plan, report;
};

void Declare(FlagSet& fs, Flags& f) {
  fs.String("data", &f.data, "folder with one <input name>.npy per model input and <labels>.npy");
  fs.String("data-format", &f.data_format, "npy (the only format so far)");
  fs.Int("batch", &f.batch, "samples per step (binds the batch dim)");
  fs.Int("steps", &f.steps, "optimizer steps to run");
  fs.Int("seq", &f.seq, "sequence length (binds the sequence dim; default: from the data)");
  fs.String("optimizer", &f.optimizer, "sgd | adamw");
  fs.Double("lr", &f.lr, "base learning rate");
  fs.Double("momentum", &f.momentum, "SGD momentum");
  fs.Bool("nesterov", &f.nesterov, "SGD Nesterov momentum");
  fs.Double("weight-decay", &f.weight_decay, "SGD L2 / AdamW decoupled weight decay, every parameter");
  fs.Double("beta1", &f.beta1, "AdamW beta1");
  fs.Double("beta2", &f.beta2, "AdamW beta2");
  fs.Double("eps", &f.eps, "AdamW epsilon");
  fs.Double("clip-norm", &f.clip_norm, "clip the global gradient norm to this (0: off)");
  fs.String("schedule", &f.schedule,
            "constant | cosine | linear (decay to 0 at --steps); gpipe | 1f1b: the pipeline schedule "
            "(with --stages/--plan; the learning rate is then constant)");
  fs.Int("warmup-steps", &f.warmup_steps, "linear warm-up steps before the schedule");
  fs.String("logits", &f.logits, "the model value the loss reads (default: the only output)");
  fs.String("labels", &f.labels, "labels name: <labels>.npy in --data");
  fs.Double("label-smoothing", &f.label_smoothing, "cross-entropy label smoothing in [0, 1]");
  fs.Int("ignore-index", &f.ignore_index, "label value that contributes no loss");
  fs.String("metrics", &f.metrics, "write one JSON line per step here");
  fs.String("backend", &f.backend, "cpu");
  fs.String("dtype", &f.dtype, "fp32 | fp64");
  fs.String("freeze", &f.freeze, "regex of initializer names not to train (buffers)");
  fs.Int("seed", &f.seed, "seed for dropout and --shuffle");
  fs.Bool("shuffle", &f.shuffle, "visit the rows in a seeded random order per epoch");
  fs.Bool("dropout", &f.dropout, "--no-dropout makes every Dropout the identity");
  fs.Bool("check-numerics", &f.check_numerics, "stop at the first node producing NaN/Inf, naming it");
  fs.String("checkpoint", &f.checkpoint, "write the trained model to this .onnx file at the end");
  fs.Int("stages", &f.stages, "pipeline stages K (threads over the in-process comm); 0: not pipelined");
  fs.Int("microbatches", &f.microbatches, "micro-batches M per step (--batch divisible by M)");
  fs.String("recompute", &f.recompute, "none | full | selective | auto (auto needs the partitioner)");
  fs.String("plan", &f.plan, "run the plan `onnxpipe partition --out DIR` wrote (stages, recompute)");
  fs.String("report", &f.report, "write the measured memory and times and measured.trace.json here");
}

absl::StatusOr<train::TrainOptions> ToOptions(const Flags& f, const ir::Graph& g) {
  train::TrainOptions o;
  o.batch = f.batch;
  o.steps = f.steps;
  ASSIGN_OR_RETURN(o.optimizer.kind, autodiff::ParseOptimizerKind(f.optimizer));
  o.optimizer.momentum = f.momentum;
  o.optimizer.nesterov = f.nesterov;
  o.optimizer.weight_decay = f.weight_decay;
  o.optimizer.beta1 = f.beta1;
  o.optimizer.beta2 = f.beta2;
  o.optimizer.eps = f.eps;
  o.optimizer.clip_norm = f.clip_norm;
  o.lr = f.lr;
  ASSIGN_OR_RETURN(o.schedule, autodiff::ParseLrScheduleKind(f.schedule));
  o.warmup_steps = f.warmup_steps;
  o.logits = f.logits;
  if (o.logits.empty()) {
    if (g.outputs().size() != 1) {
      return INVALID_ARGUMENT() << "the model has " << g.outputs().size()
                                << " outputs: name the one the loss reads with --logits";
    }
    o.logits = g.value(g.outputs()[0]).name;
  }
  o.labels = f.labels;
  o.freeze_regex = f.freeze;
  o.dtype = f.dtype == "fp64" ? ir::DType::kF64 : ir::DType::kF32;
  o.seed = static_cast<uint64_t>(f.seed);
  o.shuffle = f.shuffle;
  o.dropout = f.dropout;
  o.check_numerics = f.check_numerics;
  o.label_smoothing = f.label_smoothing;
  o.ignore_index = f.ignore_index;
  return o;
}

std::string ProgressLine(const train::StepMetrics& m, int64_t steps) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld  loss %.6g  lr %.4g  grad_norm %.4g  %.1f samples/s",
                static_cast<long long>(m.step + 1), static_cast<long long>(steps), m.loss, m.lr,
                m.grad_norm, m.samples_per_s);
  return buf;
}

absl::Status Train(const std::string& model_path, Flags& f) {
  ASSIGN_OR_RETURN(Model model, ImportModel(model_path, /*allow_unsupported=*/false));
  for (const std::string& w : model.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const bool pipelined = f.stages > 0 || !f.plan.empty() || f.microbatches > 1;
  pipeline::PipelineTrainOptions po;
  if (pipelined) {
    if (f.schedule == "gpipe" || f.schedule == "1f1b") {
      po.schedule = f.schedule;
      f.schedule = "constant";
    }
    po.stages = static_cast<int32_t>(f.stages > 0 || !f.plan.empty() ? f.stages : 1);
    po.microbatches = static_cast<int32_t>(f.microbatches);
    po.recompute = f.recompute;
    po.plan_dir = f.plan;
    po.report_dir = f.report;
  }
  ASSIGN_OR_RETURN(train::TrainOptions options, ToOptions(f, *model.imported));

  // The data decides the sizes --batch and --seq leave open (S of a (N, S) token file).
  ASSIGN_OR_RETURN(std::vector<train::FieldSpec> fields,
                   train::DataFields(*model.imported, options.logits, options.labels));
  std::map<std::string, int64_t> bindings;
  const DimRoles roles = ClassifySymbols(*model.imported);
  if (f.seq > 0) {
    for (const std::string& s : roles.seq) bindings[s] = f.seq;
  }
  ASSIGN_OR_RETURN(train::Dataset data, train::Dataset::Load(f.data, fields, f.batch, &bindings));
  ModelOptions mo;
  mo.batch = f.batch;
  mo.seq = f.seq;
  for (const auto& [sym, size] : bindings) {
    if (std::find(roles.batch.begin(), roles.batch.end(), sym) == roles.batch.end())
      mo.extra_dims[sym] = size;
  }
  if (pipelined) {
    return pipeline::RunPipelinedTraining(model_path, *model.imported, mo.extra_dims, options, std::move(data), po,
                                          f.metrics, f.checkpoint);
  }
  RETURN_IF_ERROR(PrepareModel(model, mo));

  ASSIGN_OR_RETURN(train::Trainer trainer, train::Trainer::Create(*model.graph, options));
  if (!trainer.unreachable_parameters().empty()) {
    std::string names;
    for (const std::string& n : trainer.unreachable_parameters()) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "warning: not trained (the loss does not depend on them): %s\n", names.c_str());
  }
  RETURN_IF_ERROR(trainer.SetData(std::move(data)));
  std::optional<train::MetricsWriter> metrics;
  if (!f.metrics.empty()) {
    ASSIGN_OR_RETURN(train::MetricsWriter w, train::MetricsWriter::Open(f.metrics));
    metrics.emplace(std::move(w));
  }
  std::printf("training %s: %lld trainable parameters, %s, %s, batch %lld, %lld steps\n",
              model_path.c_str(), static_cast<long long>(trainer.num_trainable_parameters()),
              f.optimizer.c_str(), f.dtype.c_str(), static_cast<long long>(f.batch),
              static_cast<long long>(f.steps));
  std::fflush(stdout);
  const bool tty = isatty(fileno(stdout));
  for (int64_t k = 0; k < f.steps; ++k) {
    absl::StatusOr<train::StepMetrics> m = trainer.Step();
    if (!m.ok()) {
      if (tty && k > 0) std::printf("\n");
      return m.status();
    }
    if (metrics) RETURN_IF_ERROR(metrics->Write(*m));
    std::printf(tty ? "\r%s\x1b[K" : "%s\n", ProgressLine(*m, f.steps).c_str());
    std::fflush(stdout);
  }
  if (tty) std::printf("\n");

  if (!f.checkpoint.empty()) {
    std::map<std::string, ir::Tensor> params;
    for (auto& [name, t] : trainer.Parameters()) {
      // The file keeps the model's dtypes: an fp64 run is stored rounded to f32.
      const ir::Value& orig = model.imported->value(model.imported->FindValue(name));
      params[name] = t.dtype() == orig.dtype ? t : t.CastTo(orig.dtype);
    }
    RETURN_IF_ERROR(onnx_frontend::WriteOnnxWithInitializers(model_path, params, f.checkpoint,
                                                             /*external_threshold_bytes=*/-1));
    std::printf("checkpoint: %s\n", f.checkpoint.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunTrain(const Args& args) {
  Flags f;
  FlagSet fs("train",
             "MODEL.onnx --data DIR --batch B --steps N --optimizer sgd|adamw --lr X [flags]",
             "Trains the model on the CPU backend: forward, mean cross-entropy between --logits and\n"
             "<labels>.npy, backward, optional global-norm clipping, then an SGD or AdamW update per\n"
             "step. Step k uses data rows (k*B + j) mod N, j = 0..B-1 (a seeded permutation per epoch\n"
             "with --shuffle). --metrics gets {step, loss, lr, grad_norm, samples_per_s} per step,\n"
             "loss being the batch loss before the step's update.");
  Declare(fs, f);
  if (absl::Status st = fs.Parse(args); !st.ok()) return Fail("train", std::string(st.message()), 2);
  if (fs.help_requested()) {
    std::printf("%s", fs.Usage().c_str());
    return 0;
  }
  if (fs.positional().size() != 1) return Fail("train", "expected exactly one MODEL.onnx (see --help)", 2);
  if (f.data.empty()) return Fail("train", "--data DIR is required", 2);
  if (f.data_format != "npy") return Fail("train", "--data-format '" + f.data_format + "' is not supported; expected npy", 2);
  if (f.batch < 1) return Fail("train", "--batch must be >= 1", 2);
  if (f.steps < 1) return Fail("train", "--steps must be >= 1", 2);
  if (!fs.WasSet("lr")) return Fail("train", "--lr is required", 2);
  if (f.backend != "cpu") return Fail("train", "--backend '" + f.backend + "' is not available; expected cpu", 2);
  if (f.dtype != "fp32" && f.dtype != "fp64") return Fail("train", "--dtype expects fp32 or fp64, got '" + f.dtype + "'", 2);
  if (f.optimizer != "sgd" && f.optimizer != "adamw") return Fail("train", "--optimizer expects sgd or adamw, got '" + f.optimizer + "'", 2);
  if (f.seq < 0) return Fail("train", "--seq must be positive", 2);
  if (absl::Status st = Train(fs.positional()[0], f); !st.ok()) return Fail("train", std::string(st.message()));
  return 0;
}

}  // namespace onnxpipe::tools
