// onnxpipe train: trains a model from its ONNX file through the stage executor (executor/pipeline): one stage on
// the CPU backend by default, or pipelined over stages. This file owns the flags and the order of the run: data,
// trainer, resume, loop (tools/train_loop.h), evaluation, --save.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>

#include "executor/backend/backend_evaluator.h"
#include "executor/comm/gather.h"
#include "executor/comm/tcp_comm.h"
#include "executor/cpu/kernel_util.h"
#include "executor/cpu/thread_pool.h"
#ifdef ONNXPIPE_HAVE_NCCL
#include "executor/cuda/nccl_comm.h"
#endif
#include "executor/io/atomic_file.h"
#include "executor/io/checkpoint_manager.h"
#include "executor/io/crc32c.h"
#include "executor/io/tensorboard.h"
#include "executor/pipeline/pipeline_trainer.h"
#include "executor/train/evaluate.h"
#include "executor/train/metrics.h"
#include "executor/train/train_checkpoint.h"
#include "executor/train/training_graph.h"
#include "frontend/autodiff/trainable.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/writer.h"
#include "partitioner/device.h"
#include "tools/backend_flag.h"
#include "tools/commands.h"
#include "tools/distributed.h"
#include "tools/flags.h"
#include "tools/graph_flags.h"
#include "tools/model.h"
#include "tools/resume.h"
#include "tools/train_data.h"
#include "tools/train_loop.h"

namespace onnxpipe::tools {
namespace {

namespace fs = std::filesystem;

constexpr char kVocabFile[] = "vocab.txt";  // in --checkpoint-dir
#ifdef ONNXPIPE_HAVE_NCCL
constexpr bool kHaveNccl = true;
#else
constexpr bool kHaveNccl = false;
#endif

struct Flags {
  GraphFlags graph;  // optimizer, loss and trained initializers (shared with partition)
  std::string data, lr_schedule = "constant", schedule, metrics;
  std::string backend = "cpu", dtype = "fp32", data_format = "auto", save, mask = "auto";
  std::string save_external = "auto", checkpoint_dir, tensorboard;
  int64_t batch = 0, steps = 0, warmup_steps = 0, seed = 0, seq = 0, vocab_size = 0;
  int64_t checkpoint_every = 0, keep_checkpoints = 3, log_every = 1;
  double lr = 0;
  bool shuffle = false, check_numerics = false, eval = false;
  bool shuffle_given = false;            // --shuffle or --no-shuffle on the command line (else the data format decides)
  int64_t stages = 0, microbatches = 0;  // pipelined training (executor/pipeline)
  int64_t device = 0;
  bool tf32 = false, cuda_graphs = false;
  std::string cuda_attention = "auto";
  std::string gemm_tactics;
  std::string recompute, plan, report;
  std::string memory_budget;  // --memory-budget SIZE ("" : the device's free memory)
  std::string resume;         // "" | latest | auto (tools/resume.h)
  int64_t data_parallel = 1;  // D replicas (multi-process)
  double dp_bucket_mb = 25;   // the backward's all-reduce buckets (data parallelism)
  double rendezvous_timeout = 300, comm_timeout = 0, heartbeat_timeout = 8;
  std::string comm = "auto";  // tcp | nccl | auto
  bool device_given = false;  // --device on the command line (else a rank takes its local rank's GPU)
};

// A multi-process run (tools/distributed.h): this process's place and its comm over the world.
struct World {
  LaunchEnv env;
  std::unique_ptr<comm::Comm> comm;
  bool nccl = false;
  bool leader() const { return env.rank == 0; }
};

void Declare(FlagSet& fs, Flags& f) {
  fs.String("data", &f.data, "training data: a folder, an aclImdb archive or a .tsv file (see --data-format)");
  fs.String("data-format", &f.data_format,
            "auto | npy | aclimdb | tsv. npy: one <input name>.npy per model input and <labels>.npy; aclimdb: "
            "{train,test}/{pos,neg}/*.txt, folder or archive; tsv: train.tsv + test.tsv (label<TAB>text) or one "
            ".tsv. auto: npy when DIR holds .npy files, else tsv/aclimdb from what it holds");
  fs.Int("batch", &f.batch, "samples per step (binds the batch dim)");
  fs.Int("steps", &f.steps, "optimizer steps to run in total (a resumed run continues up to this step)");
  fs.Int("seq", &f.seq,
         "sequence length (binds the sequence dim; default: npy: from the data; text: the model's fixed length)");
  fs.Int("vocab-size", &f.vocab_size, "text: vocabulary size incl. <pad> and <unk> (default: the embedding rows)");
  fs.String("mask", &f.mask,
            "text: values of a padding-mask input: keep (1 = token, 0 = pad) | pad (1 = pad) | auto (pad for a "
            "bool mask, keep otherwise)");
  AddGraphFlags(fs, &f.graph);
  fs.Double("lr", &f.lr, "base learning rate");
  fs.String("lr-schedule", &f.lr_schedule, "constant | cosine | linear (decay to 0 at --steps)");
  fs.Int("warmup-steps", &f.warmup_steps, "linear warm-up steps before the learning-rate schedule");
  fs.String("metrics", &f.metrics, "write one JSON line per step here (and the --eval line)");
  fs.Int("log-every", &f.log_every,
         "without a terminal, print a progress line every N steps (a terminal gets "
         "one line rewritten every step)");
  fs.String("tensorboard", &f.tensorboard,
            "also write loss, lr, grad_norm, samples_per_s (and --eval) as "
            "TensorBoard scalars into this folder");
  fs.Bool("eval", &f.eval,
          "after training, evaluate the test split (dropout off) and report "
          "{\"split\": \"test\", \"accuracy\": A, \"loss\": L}");
  fs.String("save", &f.save, "write the trained model to this .onnx file at the end (the model's dtypes)");
  fs.String("save-external-data", &f.save_external,
            "auto (initializers >= 1 KiB in OUT.onnx.data when they total >= 1 GiB) | always | never");
  fs.String("checkpoint-dir", &f.checkpoint_dir,
            "save training checkpoints (parameters, optimizer state, step, data position) and the vocabulary here; "
            "an unpartitioned and a pipelined run of the same training graph resume each other's");
  fs.Int("checkpoint-every", &f.checkpoint_every,
         "checkpoint every N steps (and always at the end and on SIGINT or SIGTERM)");
  fs.Int("keep-checkpoints", &f.keep_checkpoints, "keep the newest N checkpoints (0: all)");
  fs.OptionalString("resume", &f.resume, "latest", {"auto"},
                    "continue from --checkpoint-dir's latest checkpoint (an error when there is none); --resume "
                    "auto: continue when there is one, else start fresh (a requeued job's same command line)");
  fs.String("backend", &f.backend,
            "cpu | cuda | checked. cuda: GPU --device through the stage executor (ops "
            "without a CUDA kernel yet run on the host and are listed at the end); checked: the CPU kernels over "
            "memory the host must not touch (tests)");
  fs.Int("device", &f.device, "the GPU --backend cuda runs on");
  fs.Bool("tf32", &f.tf32,
          "--backend cuda, fp32: GEMMs on TF32 tensor cores (10-bit mantissa products, fp32 "
          "accumulation), as PyTorch's allow_tf32; default exact fp32");
  DeclareCudaAttentionFlag(fs, &f.cuda_attention);
  DeclareGemmTacticsFlag(fs, &f.gemm_tactics);
  fs.Bool("cuda-graphs", &f.cuda_graphs,
          "--backend cuda: replay each stage's forward, backward and optimizer work as CUDA graphs (the first "
          "step runs eagerly, the second records, later steps replay: fewer launches, no per-kernel host work); "
          "sends, receives and nodes that wait for the device (embedding index checks, the loss's label check, "
          "host fallbacks) run between graphs. Default: on with --backend cuda unless --check-numerics; "
          "--no-cuda-graphs issues every kernel from the host");
  fs.String("dtype", &f.dtype,
            "fp32 | fp64 | bf16. bf16: mixed precision (bf16 activations and compute, fp32 master "
            "weights, gradients, optimizer state and loss; checkpoints hold the fp32 masters)");
  fs.Int("seed", &f.seed, "seed for dropout and --shuffle");
  fs.Bool("shuffle", &f.shuffle,
          "visit the rows in a seeded random order per epoch (default: on for text data, "
          "aclimdb and tsv, which are often grouped by class; off for npy, rows in file order); --no-shuffle: file "
          "order");
  fs.Bool("check-numerics", &f.check_numerics, "stop at the first node producing NaN/Inf, naming it");
  fs.Int("stages", &f.stages,
         "pipeline stages K (threads over the in-process comm), cut by the partitioner at fixed K (what `onnxpipe "
         "partition --stages K` would write); 0: one stage, not pipelined. Every other flag (--eval, --tensorboard, "
         "--checkpoint-dir, --resume, ...) works pipelined too");
  fs.Int("microbatches", &f.microbatches, "micro-batches M per step (--batch divisible by M)");
  fs.String("schedule", &f.schedule, "pipeline schedule: gpipe | 1f1b (with --stages/--plan)");
  fs.String("recompute", &f.recompute, "none | full | selective | auto (the partitioner's rule for each)");
  fs.String("plan", &f.plan,
            "run the plan `onnxpipe partition --out DIR` wrote, as written (stages, node order, "
            "recompute regions, actions); a plan that cannot run is an error naming the problem");
  fs.String("report", &f.report, "write the measured memory and times and measured.trace.json here");
  fs.String("memory-budget", &f.memory_budget,
            "the most memory the run may allocate on its device, e.g. 40GiB (default: its free memory); a plan "
            "needing more is refused before anything is allocated, with the smallest change that fits");
  fs.Int("data-parallel", &f.data_parallel,
         "multi-process: D data-parallel replicas of the pipeline (the world is K stages x D replicas; each "
         "replica trains on 1/D of --batch, gradients summed over the replicas before the update)");
  fs.Double("dp-bucket-mb", &f.dp_bucket_mb,
            "data parallelism: the backward all-reduces complete gradients over the replicas in buckets of this "
            "many MiB while it goes on (PyTorch DDP's bucket_cap_mb); 0: each gradient as soon as it is complete");
  fs.Double("rendezvous-timeout", &f.rendezvous_timeout,
            "multi-process: seconds the ranks wait for each other at the start before failing, naming the "
            "missing ones");
  fs.String("comm", &f.comm,
            "multi-process transport: tcp (host memory; CPU ranks, or GPU ranks staged through the host) | nccl "
            "(one GPU per rank: pipeline transfers and all-reduces) | auto (nccl for --backend cuda --stages 1 where "
            "onnxpipe was built with NCCL, else tcp). --comm nccl without a launcher trains as a world of one");
  fs.Double("heartbeat-timeout", &f.heartbeat_timeout,
            "multi-process: a rank not heard from for this many seconds (stopped, frozen or cut off; a busy rank "
            "still beats every second) ends the run, named; 0: wait for it");
  fs.Double("comm-timeout", &f.comm_timeout,
            "multi-process: fail a receive or all-reduce that waits longer than this many seconds (0: wait; a "
            "rank that dies is noticed at once either way)");
}

absl::StatusOr<train::TrainOptions> ToOptions(const Flags& f, const ir::Graph& g) {
  train::TrainOptions o;
  ASSIGN_OR_RETURN(static_cast<autodiff::TrainingGraphSpec&>(o), SpecOf(f.graph, *ir::ParseDType(f.dtype), g));
  o.batch = f.batch;
  o.steps = f.steps;
  o.lr = f.lr;
  ASSIGN_OR_RETURN(o.schedule, autodiff::ParseLrScheduleKind(f.lr_schedule));
  o.warmup_steps = f.warmup_steps;
  o.seed = static_cast<uint64_t>(f.seed);
  o.check_numerics = f.check_numerics;
  return o;
}

// --save-external-data as WriteOnnxWithInitializers' threshold.
int64_t ExternalThreshold(const std::string& mode, const std::map<std::string, ir::Tensor>& params,
                          const ir::Graph& imported) {
  if (mode == "never") return -1;
  if (mode == "always") return 0;
  int64_t total = 0;
  for (int32_t v = 0; v < imported.num_values(); ++v) {
    if (imported.value(v).is_initializer && imported.value(v).constant)
      total += imported.value(v).constant->num_bytes();
  }
  return total >= (int64_t{1} << 30) ? 1024 : -1;
}

absl::Status SaveModel(const Flags& f, const std::string& model_path, const ir::Graph& imported,
                       const std::map<std::string, ir::Tensor>& trained, const std::optional<text::Vocabulary>& vocab) {
  std::map<std::string, ir::Tensor> params;
  for (const auto& [name, t] : trained) {
    // The file keeps the model's dtypes: an fp64 run is stored rounded to the model's float type.
    const ir::Value& orig = imported.value(imported.FindValue(name));
    params[name] = t.dtype() == orig.dtype ? t : t.CastTo(orig.dtype);
  }
  RETURN_IF_ERROR(onnx_frontend::WriteOnnxWithInitializers(model_path, params, f.save,
                                                           ExternalThreshold(f.save_external, params, imported)));
  std::printf("saved: %s\n", f.save.c_str());
  if (vocab) {
    const std::string vp = VocabPathBeside(f.save);
    RETURN_IF_ERROR(vocab->Save(vp));
    std::printf("vocabulary: %s\n", vp.c_str());
  }
  return absl::OkStatus();
}

// `world`: the ranks of a data-parallel run of one stage, each holding the whole model, evaluate every world-th batch
// and add their counts in rank order; null: this process evaluates every batch. Only the leader reports.
// The forward runs on the training backend: its nodes on the device, the parameters uploaded once.
absl::Status RunEvaluation(const Model& model, const train::StepTrainer& trainer, const TrainData& data,
                           const train::TrainOptions& options, std::shared_ptr<const backend::Backend> be,
                           comm::Comm* world, bool leader, train::MetricsWriter* metrics,
                           io::TensorBoardWriter* tensorboard) {
  train::EvalOptions eo;
  if (!be->placement().host()) {
    eo.evaluator = [be](const ir::Graph& g) -> absl::StatusOr<std::unique_ptr<ir::OpEvaluator>> {
      ASSIGN_OR_RETURN(std::unique_ptr<backend::BackendEvaluator> ev, backend::BackendEvaluator::Resident(be, g));
      return std::unique_ptr<ir::OpEvaluator>(std::move(ev));
    };
  }
  eo.logits = options.logits;
  eo.labels = options.labels;
  eo.batch = options.batch;
  eo.dtype = options.dtype;
  eo.ignore_index = options.ignore_index;
  if (world != nullptr) {
    eo.shard = world->rank();
    eo.shards = world->size();
  }
  ASSIGN_OR_RETURN(train::EvalResult r, train::Evaluate(*model.graph, trainer.Parameters(), *data.test, eo));
  if (world != nullptr) {
    ir::Tensor sums = ir::Tensor::FromVector<double>(
        {3}, {static_cast<double>(r.counted), static_cast<double>(r.correct), r.loss_sum});
    RETURN_IF_ERROR(SumOverRanks(*world, sums, "--eval: adding the ranks' results"));
    r.counted = static_cast<int64_t>(sums.data<double>()[0]);
    r.correct = static_cast<int64_t>(sums.data<double>()[1]);
    r.loss_sum = sums.data<double>()[2];
    r.accuracy = r.counted > 0 ? static_cast<double>(r.correct) / r.counted : 0;
    r.loss = r.counted > 0 ? r.loss_sum / r.counted : 0;
  }
  if (!leader) return absl::OkStatus();
  const std::string line = train::EvalJson("test", r.accuracy, r.loss);
  std::printf("eval: %s  (%lld test samples, %lld predictions scored)\n", line.c_str(),
              static_cast<long long>(r.samples), static_cast<long long>(r.counted));
  if (metrics) RETURN_IF_ERROR(metrics->WriteLine(line));
  if (tensorboard) {
    RETURN_IF_ERROR(tensorboard->AddScalars(trainer.step(), {{"test/accuracy", static_cast<float>(r.accuracy)},
                                                             {"test/loss", static_cast<float>(r.loss)}}));
  }
  return absl::OkStatus();
}

// A one-stage run's memory: the stage's static layout (what `onnxpipe partition --stages 1` predicts) against the
// high-water marks the steps measured. Every kernel writes into its planned slot, so they are equal.
void PrintMemory(const pipeline::PipelineTrainer& trainer) {
  const pipeline::PipelineExecutor& ex = trainer.executor();
  if (ex.program().num_stages != 1 || trainer.results().empty()) return;
  const pipeline::StageMemoryPrediction p = pipeline::PredictStageMemory(ex.program().stages[0], ex.layout(0));
  pipeline::StageMeasure m;
  for (const pipeline::PipelineStepResult& r : trainer.results()) {
    const pipeline::StageMeasure& s = r.stages[0];
    m.arena_bytes = std::max(m.arena_bytes, s.arena_bytes);
    m.workspace_bytes = std::max(m.workspace_bytes, s.workspace_bytes);
    m.accumulator_bytes = std::max(m.accumulator_bytes, s.accumulator_bytes);
    m.optimizer_scratch_bytes = std::max(m.optimizer_scratch_bytes, s.optimizer_scratch_bytes);
  }
  std::printf(
      "memory: arena %lld bytes planned, high-water %lld; workspace %lld planned, high-water %lld; "
      "gradients %lld planned, high-water %lld; parameters %lld, optimizer state %lld; optimizer scratch "
      "%lld\n",
      static_cast<long long>(p.arena), static_cast<long long>(m.arena_bytes), static_cast<long long>(p.workspace),
      static_cast<long long>(m.workspace_bytes), static_cast<long long>(p.accumulators),
      static_cast<long long>(m.accumulator_bytes), static_cast<long long>(p.parameters),
      static_cast<long long>(p.optimizer_state), static_cast<long long>(m.optimizer_scratch_bytes));
}

// --cuda-graphs: how much of the last step the graphs replayed.
void PrintGraphs(const pipeline::PipelineTrainer& trainer) {
  if (trainer.results().empty()) return;
  const pipeline::PipelineExecutor& ex = trainer.executor();
  int64_t nodes = 0, replayed = 0, launches = 0, failed = 0;
  for (const partitioner::StageProgram& sp : ex.program().stages) {
    if (!ex.is_local(sp.stage)) continue;  // another process's: its replays are not measured here
    nodes += static_cast<int64_t>(sp.forward.size() + sp.backward.size()) * ex.microbatches() +
             static_cast<int64_t>(sp.post.size());
  }
  for (const pipeline::PipelineStepResult& r : trainer.results())
    for (const pipeline::StageMeasure& m : r.stages) failed += m.failed_recordings;
  for (const pipeline::StageMeasure& m : trainer.results().back().stages) {
    replayed += m.replayed_nodes;
    launches += m.graph_launches;
  }
  std::printf(
      "cuda graphs: the last step replayed %lld of its %lld node runs in %lld graph launches; %lld "
      "recordings failed (their nodes run eagerly)\n",
      static_cast<long long>(replayed), static_cast<long long>(nodes), static_cast<long long>(launches),
      static_cast<long long>(failed));
}

// Data parallelism: how the last step's gradient all-reduce overlapped the backward (this rank's stage).
void PrintDataParallel(const pipeline::PipelineTrainer& trainer, const Flags& f) {
  const pipeline::PipelineExecutor& ex = trainer.executor();
  if (ex.options().topology.replicas < 2 || trainer.results().empty()) return;
  const int32_t stage = ex.options().topology.stage();
  std::printf(
      "data parallel: %d replicas; stage %d all-reduced %d gradient buckets of >= %g MiB during the last "
      "step's backward, the rest at its optimizer step\n",
      ex.options().topology.replicas, stage, trainer.results().back().stages[stage].dp_buckets_in_backward,
      f.dp_bucket_mb);
}

// From here on the trainer holds the trained parameters: the imported graph keeps their dtypes and dims (what --save
// and the external-data rule read), not their initial values, so that they are not held twice. The evaluation
// graph keeps its own (Evaluate replaces them with the trained ones after converting the graph's dtype).
void ReleaseInitialParameters(ir::Graph& imported) {
  for (ir::ValueId v = 0; v < imported.num_values(); ++v) {
    ir::Value& val = imported.value(v);
    if (!val.is_initializer || !val.constant || val.param_state != ir::ParamState::kTrainable) continue;
    val.constant = ir::Tensor::DimsOnly(val.constant->dtype(), val.constant->dims());
  }
}

// Decides on the imported graph which initializers are trained (the rule plus --freeze/--train-only), before
// any folding or fusion sees them, and prints what it froze, one line per reason.
absl::Status DecideParameters(const Flags& f, const train::TrainOptions& options, ir::Graph& imported) {
  autodiff::TrainableOptions to;
  to.freeze_regex = f.graph.freeze;
  to.train_only_regex = f.graph.train_only;
  if (const ir::ValueId logits = imported.FindValue(options.logits); logits != ir::kNoValue) {
    to.targets.push_back(logits);
  }
  ASSIGN_OR_RETURN(autodiff::TrainableReport report, autodiff::MarkTrainable(&imported, to));
  int64_t floats = 0, frozen = 0;
  for (const autodiff::InitializerDecision& d : report.decisions) {
    if (d.reason == autodiff::FreezeReason::kNonFloat) continue;
    ++floats;
    frozen += d.trainable ? 0 : 1;
  }
  const std::vector<std::string> lines = report.SummaryLines(imported);
  std::printf("parameters: %lld of %lld float initializers trained; not trained:%s\n",
              static_cast<long long>(floats - frozen), static_cast<long long>(floats), lines.empty() ? " none" : "");
  for (const std::string& line : lines) std::printf("  %s\n", line.c_str());
  return absl::OkStatus();
}

// Starts the world's comm: every rank meets the others (or fails naming the missing ones) before any work, so that a
// rank that fails later aborts the others instead of leaving them waiting.
absl::Status JoinWorld(const Flags& f, std::shared_ptr<const backend::Backend> be, World& world) {
  const comm::RendezvousOptions meet = {world.env.master_addr, world.env.master_port, world.env.rank,
                                        world.env.world_size, f.rendezvous_timeout};
  // auto: NCCL where it can carry the run (one stage per replica: data parallelism; K = world / D without --stages).
  const int64_t stages = f.stages > 0 ? f.stages : world.env.world_size / f.data_parallel;
  world.nccl =
      f.comm == "nccl" || (f.comm == "auto" && f.backend == "cuda" && stages == 1 && f.plan.empty() && kHaveNccl);
  if (world.nccl) {
#ifdef ONNXPIPE_HAVE_NCCL
    cuda::NcclCommOptions o;
    o.rendezvous = meet;
    o.timeout_s = f.comm_timeout;
    o.silence_s = f.heartbeat_timeout;
    o.backend = std::dynamic_pointer_cast<const cuda::CudaBackend>(be);
    o.device = static_cast<int>(f.device);
    if (o.backend == nullptr) return INVALID_ARGUMENT() << "--comm nccl needs --backend cuda";
    ASSIGN_OR_RETURN(world.comm, cuda::NcclComm::Create(o));
    return absl::OkStatus();
#else
    return INVALID_ARGUMENT() << "--comm nccl: this onnxpipe was built without NCCL (use --comm tcp)";
#endif
  }
  comm::TcpCommOptions o;
  o.rendezvous = meet;
  o.timeout_s = f.comm_timeout;
  o.silence_s = f.heartbeat_timeout;
  o.backend = std::move(be);
  ASSIGN_OR_RETURN(world.comm, comm::TcpComm::Create(o));
  return absl::OkStatus();
}

absl::StatusOr<int> Train(const std::string& model_path, Flags& f, std::optional<World>& world) {
  const bool leader = !world || world->leader();
  if (world && f.backend == "cuda" && !f.device_given) f.device = world->env.local_rank;  // a GPU per local rank
  ASSIGN_OR_RETURN(std::shared_ptr<const backend::Backend> be,
                   BackendFromFlags(f.backend, f.device, {.tf32 = f.tf32, .cuda_attention = f.cuda_attention, .gemm_tactics = f.gemm_tactics}));
  if (world) RETURN_IF_ERROR(JoinWorld(f, be, *world));
  ASSIGN_OR_RETURN(Model model, ImportModel(model_path, /*allow_unsupported=*/false));
  for (const std::string& w : model.warnings) {
    if (leader) std::fprintf(stderr, "warning: %s\n", w.c_str());
  }
  ASSIGN_OR_RETURN(train::TrainOptions options, ToOptions(f, *model.imported));
  RETURN_IF_ERROR(DecideParameters(f, options, *model.imported));
  if (const fs::path parent = fs::path(f.save).parent_path(); !f.save.empty() && !parent.empty()) {
    std::error_code ec;
    if (!fs::create_directories(parent, ec) && ec) {
      return INVALID_ARGUMENT() << "--save " << f.save << ": cannot create " << parent.string() << ": " << ec.message();
    }
  }

  std::optional<io::CheckpointManager> checkpoints;
  std::optional<io::Checkpoint> resume_from;
  DataRequest request;
  if (!f.checkpoint_dir.empty()) {
    checkpoints.emplace(f.checkpoint_dir, static_cast<int>(f.keep_checkpoints));
    ASSIGN_OR_RETURN(const ResumeMode mode, ParseResumeMode(f.resume));
    ASSIGN_OR_RETURN(resume_from, FindResumeCheckpoint(*checkpoints, mode));
    if (resume_from) {
      const std::string vocab = resume_from->metadata.extra.value("vocab", std::string());
      if (!vocab.empty()) request.vocab_file = (fs::path(f.checkpoint_dir) / vocab).string();
    }
  }
  request.path = f.data;
  request.format = f.data_format;
  request.batch = f.batch;
  request.seq = f.seq;
  request.vocab_size = f.vocab_size;
  request.mask = f.mask;
  request.with_test = f.eval;
  request.logits = options.logits;
  request.labels = options.labels;
  ASSIGN_OR_RETURN(TrainData data, LoadTrainData(*model.imported, request));
  std::printf("data: %s\n", data.summary.c_str());
  // Text sets are often grouped by class (aclImdb folders, most TSV files): trained in file order, a batch sees
  // one class for half an epoch. npy rows keep file order (step k = rows [kB, (k+1)B)) unless asked.
  options.shuffle = f.shuffle_given ? f.shuffle : data.format != "npy";

  ModelOptions mo;
  mo.batch = f.batch;
  mo.compute = options.dtype;  // --eval's forward graph, folded as the training graph's
  mo.extra_dims = NonBatchBindings(*model.imported, data.bindings);
  // Every run goes through the stage executor: one stage unless pipelining is asked for.
  const bool pipelined = f.stages > 0 || !f.plan.empty() || f.microbatches > 1 || f.backend != "cpu" || world;
  pipeline::PipelineTrainOptions po;
  po.schedule = f.schedule;
  po.stages = static_cast<int32_t>(f.stages > 0 || !f.plan.empty() ? f.stages : 1);
  po.data_parallel = static_cast<int32_t>(f.data_parallel);
  po.dp_bucket_bytes = static_cast<int64_t>(f.dp_bucket_mb * (1 << 20));
  if (world) {
    po.world = world->comm.get();
    // Without --stages or --plan the world is the pipeline: K = world / D.
    if (f.stages == 0 && f.plan.empty()) po.stages = static_cast<int32_t>(world->env.world_size / f.data_parallel);
  }
  po.microbatches = static_cast<int32_t>(f.microbatches);
  po.recompute = f.recompute;
  po.plan_dir = f.plan;
  po.report_dir = f.report;
  po.backend = be;
  po.device = BackendDeviceProfile(*be);  // --stages K cuts as `partition --device` of this device would
  if (world && f.plan.empty() && po.stages > 1) RETURN_IF_ERROR(AgreeOnDeviceProfile(*world->comm, po.device));
  po.graphs = f.cuda_graphs;
  if (!f.memory_budget.empty()) {
    absl::StatusOr<int64_t> budget = partitioner::ParseByteSize(f.memory_budget);
    if (!budget.ok() || *budget <= 0) {
      return INVALID_ARGUMENT() << "--memory-budget " << f.memory_budget << ": expected a size such as 40GiB or "
                                << "512MiB" << (budget.ok() ? "" : " (" + std::string(budget.status().message()) + ")");
    }
    po.memory_budget = *budget;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<pipeline::PipelineTrainer> trainer,
                   pipeline::PipelineTrainer::Create(*model.imported, mo.extra_dims, options, po, model_path));
  // --eval runs the whole forward graph (batch B) with the trained parameters.
  if (f.eval) RETURN_IF_ERROR(PrepareModel(model, mo));
  if (!trainer->unreachable_parameters().empty() && leader) {
    std::string names;
    for (const std::string& n : trainer->unreachable_parameters()) names += (names.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "warning: not trained (the loss does not depend on them): %s\n", names.c_str());
  }
  ReleaseInitialParameters(*model.imported);
  // The training graph's copies and (on a rank) the other stages' tensors are gone: give their pages back, which
  // the allocator keeps after freeing tensors below its mmap threshold (a 12-layer d768 rank: 1.8 -> 0.7 GB).
  malloc_trim(0);
  const int64_t rows = data.train.rows();
  RETURN_IF_ERROR(trainer->SetData(std::move(data.train)));

  train::RunIdentity run;
  run.model_path = model_path;
  run.options = options;
  run.data_rows = rows;
  if (checkpoints) {
    ASSIGN_OR_RETURN(run.model, io::FingerprintFile(model_path));
    if (data.vocab) {
      run.vocab_file = kVocabFile;
      const std::string vp = (fs::path(f.checkpoint_dir) / kVocabFile).string();
      if (!resume_from && leader) {
        std::error_code ec;
        fs::create_directories(f.checkpoint_dir, ec);
        RETURN_IF_ERROR(data.vocab->Save(vp));
      }
      if (!resume_from && world) RETURN_IF_ERROR(comm::Barrier(*world->comm, "waiting for rank 0's vocabulary"));
      ASSIGN_OR_RETURN(std::string bytes, io::ReadFileToString(vp));
      run.vocab_crc32c = io::Crc32c(bytes);
    }
  }
  if (resume_from) {
    ASSIGN_OR_RETURN(std::vector<std::string> warnings, train::RestoreCheckpoint(*resume_from, run, *trainer));
    for (const std::string& w : warnings) {
      if (leader) std::fprintf(stderr, "warning: %s\n", w.c_str());
    }
    std::printf("resumed from %s at step %lld\n", resume_from->path.c_str(), static_cast<long long>(trainer->step()));
  }

  std::optional<train::MetricsWriter> metrics;
  if (!f.metrics.empty() && leader) {
    ASSIGN_OR_RETURN(train::MetricsWriter w, resume_from
                                                 ? train::MetricsWriter::OpenForResume(f.metrics, trainer->step())
                                                 : train::MetricsWriter::Open(f.metrics));
    metrics.emplace(std::move(w));
  }
  std::unique_ptr<io::TensorBoardWriter> tensorboard;
  if (!f.tensorboard.empty() && leader) {
    ASSIGN_OR_RETURN(tensorboard, io::TensorBoardWriter::Create(f.tensorboard));
  }
  const std::string order =
      options.shuffle ? "rows shuffled per epoch (seed " + std::to_string(f.seed) + ")" : "rows in file order";
  std::printf("training %s: %lld trainable parameters, %s, %s, batch %lld, %lld steps, %s%s\n", model_path.c_str(),
              static_cast<long long>(trainer->num_trainable_parameters()), f.graph.optimizer.c_str(), f.dtype.c_str(),
              static_cast<long long>(f.batch), static_cast<long long>(f.steps), order.c_str(),
              pipelined ? (", pipelined: " + trainer->Describe()).c_str() : "");
  std::fflush(stdout);
  TrainLoop loop;
  loop.steps = f.steps;
  loop.metrics = metrics ? &*metrics : nullptr;
  loop.tensorboard = tensorboard.get();
  loop.checkpoints = checkpoints ? &*checkpoints : nullptr;
  loop.checkpoint_every = f.checkpoint_every;
  loop.log_every = f.log_every;
  loop.run = &run;
  if (world) {
    loop.writer = leader;
    const pipeline::Topology& topo = trainer->executor().options().topology;
    loop.sharding = TrainLoop::Sharding{topo.replica() == 0 ? topo.stage() : -1, topo.stages, [&world] {
                                          return comm::Barrier(*world->comm, "writing the checkpoint's shards");
                                        }};
    loop.agree = [&world](int signal) -> absl::StatusOr<int> {
      // [SIGINT seen, SIGTERM seen] summed over the ranks: a SIGTERM anywhere ends the run with success.
      ir::Tensor seen =
          ir::Tensor::FromVector<double>({2}, {signal == SIGINT ? 1.0 : 0.0, signal == SIGTERM ? 1.0 : 0.0});
      RETURN_IF_ERROR(SumOverRanks(*world->comm, seen, "agreeing on a stop signal"));
      return seen.data<double>()[1] > 0 ? SIGTERM : seen.data<double>()[0] > 0 ? SIGINT : 0;
    };
  }
  ASSIGN_OR_RETURN(LoopEnd end, RunTrainLoop(*trainer, loop));
  if (end != LoopEnd::kCompleted) {
    std::printf(checkpoints ? "stopped; continue with the same command and --resume (or --resume auto)\n"
                            : "stopped; nothing saved (no --checkpoint-dir)\n");
    // SIGTERM is a scheduler's preemption or requeue, not a failure: the requeued command continues.
    return end == LoopEnd::kTerminated ? 0 : 130;
  }
  PrintMemory(*trainer);
  PrintDataParallel(*trainer, f);
  if (f.cuda_graphs) PrintGraphs(*trainer);
  if (const std::string fb = BackendFallbackSummary(*be); !fb.empty()) std::printf("%s\n", fb.c_str());
  if (const std::string att = BackendAttentionSummary(*be); !att.empty()) std::printf("%s\n", att.c_str());
  if (const std::string mem = BackendMemorySummary(*be); !mem.empty()) std::printf("%s\n", mem.c_str());
  if (!f.report.empty()) {
    RETURN_IF_ERROR(trainer->WriteReport());
    std::printf("report: %s (measured.json, measured.trace.json, predicted.trace.json, report.txt, report.html)\n",
                f.report.c_str());
  }
  // --eval and --save need the whole model: rank 0 collects it (every rank takes part). Data-parallel replicas of one
  // stage each hold it: they share the evaluation.
  const bool shared_eval = world && f.eval && trainer->executor().program().num_stages == 1;
  if (world && ((f.eval && !shared_eval) || !f.save.empty())) RETURN_IF_ERROR(trainer->GatherModel());
  if (f.eval && (shared_eval || leader)) {
    RETURN_IF_ERROR(RunEvaluation(model, *trainer, data, options, be, shared_eval ? world->comm.get() : nullptr, leader,
                                  loop.metrics, tensorboard.get()));
  }
  if (!leader) return 0;
  if (!f.save.empty()) RETURN_IF_ERROR(SaveModel(f, model_path, *model.imported, trainer->Parameters(), data.vocab));
  return 0;
}

// Flag combinations refused before any work, with the flag named.
std::optional<std::string> UsageError(const FlagSet& fs, const Flags& f) {
  if (f.data.empty()) return "--data is required";
  if (f.batch < 1) return "--batch must be >= 1";
  if (f.steps < 1) return "--steps must be >= 1";
  if (!fs.WasSet("lr")) return "--lr is required";
  if (f.backend != "cpu" && f.backend != "cuda" && f.backend != "checked") {
    return "--backend expects cpu, cuda or checked, got '" + f.backend + "'";
  }
  if (f.device < 0) return "--device must be >= 0, got " + std::to_string(f.device);
  if (f.cuda_graphs && f.backend != "cuda") return "--cuda-graphs needs --backend cuda";
  if (f.cuda_graphs && f.check_numerics) {
    return "--cuda-graphs cannot be combined with --check-numerics (a replayed graph returns no per-node outputs)";
  }
  if (f.dtype != "fp32" && f.dtype != "fp64" && f.dtype != "bf16") {
    return "--dtype expects fp32, fp64 or bf16, got '" + f.dtype + "'";
  }
  if (f.graph.optimizer != "sgd" && f.graph.optimizer != "adamw") {
    return "--optimizer expects sgd or adamw, got '" + f.graph.optimizer + "'";
  }
  if (f.seq < 0) return "--seq must be positive";
  if (f.vocab_size < 0 || (f.vocab_size > 0 && f.vocab_size < 2)) return "--vocab-size must be >= 2";
  if (f.save_external != "auto" && f.save_external != "always" && f.save_external != "never") {
    return "--save-external-data expects auto, always or never, got '" + f.save_external + "'";
  }
  if (f.checkpoint_every < 0) return "--checkpoint-every must be >= 0";
  if (f.log_every < 1) return "--log-every must be >= 1";
  if (f.checkpoint_every > 0 && f.checkpoint_dir.empty()) return "--checkpoint-every needs --checkpoint-dir";
  if (!f.resume.empty() && f.checkpoint_dir.empty()) {
    return "--resume needs --checkpoint-dir DIR (it resumes from DIR/latest)";
  }
  if (!ParseResumeMode(f.resume).ok()) return std::string(ParseResumeMode(f.resume).status().message());
  const bool pipelined = f.stages > 0 || !f.plan.empty() || f.microbatches > 1;
  if (!f.schedule.empty() && !pipelined) {
    return "--schedule is the pipeline schedule (gpipe | 1f1b) and needs --stages or --plan; the learning-rate "
           "schedule is --lr-schedule";
  }
  if (f.data_parallel < 1) return "--data-parallel must be >= 1";
  if (f.comm != "auto" && f.comm != "tcp" && f.comm != "nccl") {
    return "--comm expects auto, tcp or nccl, got '" + f.comm + "'";
  }
  if (f.comm == "nccl" && f.backend != "cuda") return "--comm nccl needs --backend cuda";
  if (f.rendezvous_timeout <= 0) return "--rendezvous-timeout must be > 0 seconds";
  if (f.comm_timeout < 0) return "--comm-timeout must be >= 0 seconds";
  if (f.heartbeat_timeout < 0) return "--heartbeat-timeout must be >= 0 seconds";
  if (!(f.dp_bucket_mb >= 0 && f.dp_bucket_mb <= 1 << 20)) return "--dp-bucket-mb must be between 0 and 1048576 MiB";
  if (!f.schedule.empty() && f.schedule != "gpipe" && f.schedule != "1f1b") {
    return "--schedule expects gpipe or 1f1b, got '" + f.schedule + "' (the learning-rate schedule is --lr-schedule)";
  }
  return std::nullopt;
}

}  // namespace

int RunTrain(const Args& args) {
  Flags f;
  FlagSet fs("train", "MODEL.onnx --data DIR --batch B --steps N --optimizer sgd|adamw --lr X [flags]",
             "Trains the model on the CPU backend (or --backend cuda): forward, mean cross-entropy between\n"
             "--logits and the labels, backward, optional global-norm clipping, then an SGD or AdamW update per\n"
             "step. Step k uses data rows (k*B + j) mod N, j = 0..B-1: in file order (npy data's default,\n"
             "--no-shuffle) or through a seeded permutation per epoch (--shuffle, text data's default).\n"
             "Text data (aclimdb, tsv) is tokenized with a vocabulary built from the train split, saved in\n"
             "--checkpoint-dir and beside --save, and fed to the model's token-id input (and padding mask).\n"
             "--metrics gets {step, loss, lr, grad_norm, samples_per_s} per step, loss being the batch loss\n"
             "before the step's update. SIGINT finishes the step, saves a checkpoint (with --checkpoint-dir)\n"
             "and exits with code 130; SIGTERM (a scheduler's preemption) does the same and exits with 0.\n"
             "--stages K / --plan DIR trains the same graph pipelined, with the same\n"
             "outputs, checkpoints and --resume.");
  Declare(fs, f);
  if (absl::Status st = fs.Parse(args); !st.ok()) return Fail("train", std::string(st.message()), 2);
  if (fs.help_requested()) {
    std::printf("%s", fs.Usage().c_str());
    return 0;
  }
  if (fs.positional().size() != 1) return Fail("train", "expected exactly one MODEL.onnx (see --help)", 2);
  if (std::optional<std::string> e = UsageError(fs, f)) return Fail("train", *e, 2);
  f.shuffle_given = fs.WasSet("shuffle");
  f.device_given = fs.WasSet("device");
  // Launched as one rank of several (onnxpipe launch, srun, torchrun)?
  absl::StatusOr<std::optional<LaunchEnv>> env = ReadLaunchEnv(ProcessEnv());
  if (!env.ok()) return Fail("train", std::string(env.status().message()), 2);
  std::optional<World> world;
  std::string who;  // how a rank's errors begin
  if (*env) {
    const LaunchEnv& e = **env;
    if (e.world_size % f.data_parallel != 0) {
      return Fail("train",
                  "the world has " + std::to_string(e.world_size) + " ranks, not a multiple of --data-parallel " +
                      std::to_string(f.data_parallel),
                  2);
    }
    world.emplace();
    world->env = e;
    who = "rank " + std::to_string(e.rank) + " of " + std::to_string(e.world_size) + ": ";
    // Ranks on one node share its CPUs (each would otherwise run a thread per CPU), unless told otherwise.
    const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = RankThreads(cpu::ThreadPool::UsableCpus(), machine, e.local_world_size);
    if (!std::getenv("ONNXPIPE_NUM_THREADS")) cpu::ThreadPool::SetGlobalNumThreads(threads);
    if (!std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS")) cpu::SetBlasThreads(threads);
    // One copy of the run's output: the other ranks speak only to report errors.
    if (e.rank != 0 && !std::freopen("/dev/null", "w", stdout)) return Fail("train", who + "cannot silence stdout");
  } else if (f.comm == "nccl") {  // a world of one on NCCL (what one GPU allows)
    world.emplace();
    world->env = {0, 1, 0, 1, "127.0.0.1", 29500, "single process"};
  } else if (f.data_parallel > 1) {
    return Fail("train",
                "--data-parallel " + std::to_string(f.data_parallel) +
                    " needs one process per rank: start it with onnxpipe launch, srun or torchrun",
                2);
  }
  // Graphs by default where they can run (measured faster on the H200: bench/results/cuda_train_20261205_*).
  if (!fs.WasSet("cuda-graphs")) f.cuda_graphs = f.backend == "cuda" && !f.check_numerics;
  absl::StatusOr<int> code = Train(fs.positional()[0], f, world);
  if (!code.ok()) {
    // The others stop too, with this rank's reason (unless this rank stopped because another one did).
    if (world && world->comm && !comm::IsAbortedByPeer(code.status())) world->comm->Abort(code.status());
    return Fail("train", who + std::string(code.status().message()));
  }
  return *code;
}

}  // namespace onnxpipe::tools
