// onnxpipe partition: cut a model's training graph into pipeline stages that fit the devices and
// write the plan with its reports (partitioner/). Offline: no GPU needed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "executor/backend/backend.h"
#include "executor/io/atomic_file.h"
#include "executor/pipeline/stage_file.h"
#include "frontend/ir/status.h"
#include "frontend/onnx/stage_export.h"
#include "partitioner/partitioner.h"
#include "partitioner/plan_io.h"
#include "partitioner/reports.h"
#include "partitioner/sweep.h"
#include "tools/backend_flag.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/partition_model.h"

namespace onnxpipe::tools {
namespace {

// What the command is doing: a line rewritten in place on a terminal, plain lines otherwise (an
// empty `what` clears the terminal line).
void ShowProgress(const std::string& what) {
  static const bool tty = isatty(fileno(stdout));
  if (tty) {
    std::printf("\r%s\x1b[K", what.empty() ? "" : ("onnxpipe partition: " + what + " ...").c_str());
  } else if (!what.empty()) {
    std::printf("onnxpipe partition: %s ...\n", what.c_str());
  }
  std::fflush(stdout);
}

namespace part = onnxpipe::partitioner;

struct Flags {
  GraphFlags graph;  // optimizer, loss and trained initializers, as train's (the stage programs are built with them)
  std::string stages = "1", schedule = "1f1b", recompute = "none", dtype = "fp32";
  std::string device = "h200", device_memory, profile, out, sweep, objective = "fewest";
  bool device_set = false;  // --device given (else the profile's device, when it names one)
  int64_t batch = 0, microbatches = 1, seq = 0, max_stages = 64, data_parallel = 1;
  double cut_slack = 0.05, dp_bucket_mb = 25;
  bool onnx = true;
};

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The kernel scratch counted in the plan's memory (PartitionOptions::workspace; null: not counted):
// a CPU device's (DeviceProfile::backend "cpu") from the CPU backend; a GPU target's from a profile
// measured on the cuda backend (its scratch_bytes: cuBLASLt and cuDNN sizes are only known on the
// device). Sets
// *from_profile when the profile's sizes are the ones counted.
part::WorkspaceFn KernelScratch(const part::DeviceProfile& device, const std::shared_ptr<const part::OpTimes>& profile,
                                const std::string& profile_path, bool* from_profile) {
  *from_profile = false;
  if (device.backend == "cpu") {
    return [be = backend::MakeCpuBackend()](const ir::Graph& g, const ir::Node& n) { return be->WorkspaceBytes(g, n); };
  }
  if (!profile || !profile->has_scratch()) return nullptr;
  if (profile->backend != "cuda") {
    std::fprintf(stderr,
                 "warning: %s: kernel scratch measured on the %s backend is not counted for device %s (a device "
                 "whose backend is cuda counts the scratch of a profile made with --backend cuda)\n",
                 profile_path.c_str(), profile->backend.c_str(), device.name.c_str());
    return nullptr;
  }
  *from_profile = true;
  return part::ProfileScratch(profile);
}

// Notes on the profile's kernel scratch for training graph `g` at the given micro-batch sizes,
// printed once to stderr (and added to the plan's warnings by the caller).
std::vector<std::string> ProfileScratchNotes(const part::OpTimes& profile, const std::string& profile_path,
                                             const ir::Graph& g, const std::vector<int64_t>& microbatches) {
  std::vector<std::string> notes;
  std::string other;
  for (int64_t mb : microbatches)
    if (mb != profile.microbatch) other += (other.empty() ? "" : ", ") + std::to_string(mb);
  if (!other.empty()) {
    notes.push_back("kernel scratch was measured at micro-batch " + std::to_string(profile.microbatch) + " (" +
                    profile_path + "), used as measured for micro-batch " + other);
  }
  if (const int64_t unknown = part::NodesWithoutScratch(g, profile); unknown > 0) {
    notes.push_back(std::to_string(unknown) + " nodes have no scratch_bytes in " + profile_path +
                    ": their kernel scratch counts as 0");
  }
  for (const std::string& n : notes) std::fprintf(stderr, "warning: %s\n", n.c_str());
  return notes;
}

// The device to plan for: --device (auto: this machine's GPU); without it, the built-in device the profile was
// measured on, else h200. A built-in device other than the profile's gets a note: its times are used as measured.
absl::StatusOr<part::DeviceProfile> PlanDevice(const Flags& f, const part::OpTimes* profile,
                                               std::vector<std::string>* notes) {
  std::string name = f.device;
  if (f.device == "auto") {
    ASSIGN_OR_RETURN(name, LocalGpuDevice(0));
  } else if (!f.device_set && profile != nullptr && !profile->device.empty()) {
    name = profile->device;
  }
  absl::StatusOr<part::DeviceProfile> device = part::ResolveDevice(name);
  if (!device.ok()) return Annotate(device.status(), f.device_set ? "--device" : f.profile + "'s device");
  if (profile != nullptr && !profile->device.empty() && device->source == "built-in" &&
      device->name != profile->device) {
    notes->push_back(f.profile + " was measured on " + profile->device + ": its times are used as measured for " +
                     device->name);
  }
  return device;
}

absl::Status Run(const std::string& model_path, const Flags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  // Everything that can be checked without the model first.
  part::PartitionOptions o;
  if (!f.profile.empty()) {
    ASSIGN_OR_RETURN(part::OpTimes times, part::LoadOpTimes(f.profile));
    o.op_times = std::make_shared<part::OpTimes>(std::move(times));
  }
  std::vector<std::string> device_notes;
  ASSIGN_OR_RETURN(part::DeviceProfile device, PlanDevice(f, o.op_times.get(), &device_notes));
  for (const std::string& n : device_notes) std::fprintf(stderr, "warning: %s\n", n.c_str());
  if (!f.device_set && f.device != "auto" && o.op_times && device.name == o.op_times->device) {
    std::printf("device %s: where %s was measured (--device plans for another)\n", device.name.c_str(),
                f.profile.c_str());
  }
  o.model = std::filesystem::path(model_path).filename().string();
  o.optimizer = f.graph.optimizer;
  o.batch = f.batch;
  o.microbatches = f.microbatches;
  o.data_parallel = f.data_parallel;
  o.dp_bucket_bytes = static_cast<int64_t>(f.dp_bucket_mb * (1 << 20));
  o.max_stages = f.max_stages;
  o.cut_slack = f.cut_slack;
  ASSIGN_OR_RETURN(o.schedule, part::ParseSchedule(f.schedule));
  ASSIGN_OR_RETURN(o.recompute, part::ParseRecomputePolicy(f.recompute));
  absl::StatusOr<part::Precision> precision = part::ParsePrecision(f.dtype);
  if (!precision.ok()) return Annotate(precision.status(), "--dtype");
  o.precision = *precision;
  if (f.objective == "throughput") {
    o.objective = part::Objective::kThroughput;
  } else if (f.objective != "fewest") {
    return INVALID_ARGUMENT() << "--objective expects fewest or throughput, got '" << f.objective << "'";
  }
  if (f.stages == "auto") {
    o.num_stages = 0;
  } else {
    char* end = nullptr;
    const long long k = std::strtoll(f.stages.c_str(), &end, 10);
    if (f.stages.empty() || *end != '\0' || k < 1) {
      return INVALID_ARGUMENT() << "--stages expects a positive integer or auto, got '" << f.stages << "'";
    }
    o.num_stages = k;
  }
  if (!f.device_memory.empty()) {
    absl::StatusOr<int64_t> bytes = part::ParseByteSize(f.device_memory);
    if (!bytes.ok()) return Annotate(bytes.status(), "--device-memory");
    o.memory_bytes = *bytes;
  }
  if (!(f.dp_bucket_mb >= 0 && f.dp_bucket_mb <= 1 << 20)) {
    return INVALID_ARGUMENT() << "--dp-bucket-mb must be between 0 and 1048576 MiB, got " << f.dp_bucket_mb;
  }
  std::optional<part::SweepSpec> sweep;
  if (!f.sweep.empty()) {
    ASSIGN_OR_RETURN(sweep, part::ParseSweepSpec(f.sweep));
    if (f.data_parallel < 1) return INVALID_ARGUMENT() << "--data-parallel must be >= 1, got " << f.data_parallel;
    if (f.data_parallel != 1) {
      if (f.sweep.find("data_parallel=") != std::string::npos) {
        return INVALID_ARGUMENT() << "--data-parallel and --sweep's data_parallel= both give the replicas: keep one";
      }
      sweep->data_parallel = {f.data_parallel};
    }
  } else if (f.batch < 1) {
    return INVALID_ARGUMENT() << "--batch B is required (>= 1)";
  }
  if (!sweep) RETURN_IF_ERROR(part::ValidateBatch(o));

  TrainingGraphOptions to;
  to.seq = f.seq;
  to.graph = f.graph;
  to.dtype = o.precision == part::Precision::kBF16 ? ir::DType::kBF16 : ir::DType::kF32;
  ShowProgress("importing " + model_path);
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingGraphs> graphs, TrainingGraphs::Open(model_path, to));
  for (const std::string& w : graphs->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  const double load_s = Since(t0);
  part::Cluster cluster{device};
  bool scratch_from_profile = false;
  o.workspace = KernelScratch(device, o.op_times, f.profile, &scratch_from_profile);
  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) return INVALID_ARGUMENT() << f.out << ": cannot create the output folder: " << ec.message();

  if (sweep) {
    // Group the points by micro-batch size so each training graph is built once.
    using Point = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // batch, micro-batches, stages, replicas
    std::map<int64_t, std::vector<Point>> by_microbatch;
    std::vector<part::SweepRow> rows;
    std::map<Point, size_t> index;
    for (int64_t b : sweep->batches)
      for (int64_t m : sweep->microbatches)
        for (int64_t k : sweep->stages)
          for (int64_t d : sweep->data_parallel) {
            index[{b, m, k, d}] = rows.size();
            if (std::optional<part::SweepRow> invalid = part::InvalidSweepRow(b, m, k, d)) {
              rows.push_back(std::move(*invalid));
            } else {
              rows.emplace_back();
              by_microbatch[b / (m * d)].push_back({b, m, k, d});
            }
          }
    for (const auto& [mb, points] : by_microbatch) {
      ASSIGN_OR_RETURN(const ir::Graph* g, graphs->Get(mb));
      if (scratch_from_profile && mb == by_microbatch.begin()->first) {
        std::vector<int64_t> sizes;
        for (const auto& [size, unused] : by_microbatch) sizes.push_back(size);
        ProfileScratchNotes(*o.op_times, f.profile, *g, sizes);
      }
      ASSIGN_OR_RETURN(std::unique_ptr<part::PartitionContext> ctx,
                       part::PartitionContext::Create(*g, cluster, o.precision, o.op_times, mb, o.cut_slack));
      for (const auto& [b, m, k, d] : points) {
        rows[index[{b, m, k, d}]] = part::SweepPoint(*ctx, o, b, m, k, d);
        const part::SweepRow& r = rows[index[{b, m, k, d}]];
        std::printf("batch %5lld  micro-batches %3lld  stages %2lld  replicas %2lld  %-7s  %10s  %9.1f samples/s  %s\n",
                    static_cast<long long>(b), static_cast<long long>(m), static_cast<long long>(k),
                    static_cast<long long>(d), r.status.c_str(),
                    r.status == "invalid" ? "" : part::FormatMs(r.step_ms).c_str(), r.samples_per_s,
                    r.status == "invalid" ? r.note.c_str() : part::FormatBytes(r.max_stage_memory).c_str());
        std::fflush(stdout);
      }
    }
    const int64_t memory = o.memory_bytes > 0 ? o.memory_bytes : device.memory_bytes;
    const int64_t capacity = memory - device.reserved_bytes;
    const std::string config = std::string(part::ScheduleName(o.schedule)) + ", recompute " +
                               part::RecomputePolicyName(o.recompute) + ", " + part::PrecisionName(o.precision) +
                               ", " + f.graph.optimizer;
    RETURN_IF_ERROR(io::WriteFileAtomically(f.out + "/sweep.csv", part::SweepCsv(rows, capacity)));
    RETURN_IF_ERROR(
        io::WriteFileAtomically(f.out + "/sweep.html", part::SweepHtml(rows, o.model, device, capacity, config)));
    std::printf("wrote %s/sweep.csv and %s/sweep.html (%.2f s)\n", f.out.c_str(), f.out.c_str(), Since(t0));
    return absl::OkStatus();
  }

  const int64_t mb = f.batch / (f.microbatches * f.data_parallel);
  const auto t1 = std::chrono::steady_clock::now();
  ShowProgress("building the training graph (micro-batch " + std::to_string(mb) + ")");
  ASSIGN_OR_RETURN(const ir::Graph* g, graphs->Get(mb));
  const double graph_s = Since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  ShowProgress("partitioning");
  ASSIGN_OR_RETURN(std::unique_ptr<part::PartitionContext> ctx,
                   part::PartitionContext::Create(*g, cluster, o.precision, o.op_times, mb, o.cut_slack));
  ASSIGN_OR_RETURN(part::PartitionPlan plan, part::Partition(*ctx, o));
  plan.warnings.insert(plan.warnings.end(), device_notes.begin(), device_notes.end());
  if (scratch_from_profile) {
    for (const std::string& note : ProfileScratchNotes(*o.op_times, f.profile, *g, {mb})) {
      plan.warnings.push_back(note);
    }
  }
  const double partition_s = Since(t2);
  const auto t3 = std::chrono::steady_clock::now();
  ShowProgress("writing " + f.out);
  RETURN_IF_ERROR(part::WritePlanFiles(plan, f.out));
  {
    // Each stage's program, which a rank of `train --plan` runs as written (no training graph of its own).
    ASSIGN_OR_RETURN(const part::CompiledPlan compiled, part::CompilePlan(*g, plan));
    pipeline::StageFileSource src;
    ASSIGN_OR_RETURN(src.training, graphs->GetTraining(mb));
    src.model = &*graphs->model().imported;
    src.spec = graphs->spec();
    src.data_parallel = static_cast<int32_t>(f.data_parallel);
    RETURN_IF_ERROR(pipeline::WriteStageFiles(f.out, compiled, src));
  }
  if (f.onnx) {
    for (const part::StagePlan& s : plan.stages) {
      ASSIGN_OR_RETURN(ir::Graph stage, part::BuildStageForwardGraph(ctx->analysis(), s.unit_begin, s.unit_end));
      onnx_frontend::StageExportOptions eo;
      eo.graph_name = "stage_" + std::to_string(s.index);
      eo.doc = "onnxpipe partition of " + o.model + ": stage " + std::to_string(s.index) + " of " +
               std::to_string(plan.num_stages) + " (forward nodes)";
      RETURN_IF_ERROR(onnx_frontend::ExportStageOnnx(stage, f.out + "/stage_" + std::to_string(s.index) + ".onnx", eo));
    }
  }
  const double write_s = Since(t3);
  ShowProgress("");
  std::printf("%s\n", part::ReportText(plan).c_str());
  std::printf("wrote %s/{plan.json, report.txt, report.html, partition.dot, schedule.trace.json, stage_<k>.program%s}\n",
              f.out.c_str(),
              f.onnx ? ", stage_<k>.onnx" : "");
  std::printf("time: import %.2f s, training graph %.2f s, partition %.3f s, write %.2f s\n", load_s, graph_s,
              partition_s, write_s);
  return absl::OkStatus();
}

}  // namespace

int RunPartition(const Args& args) {
  Flags f;
  FlagSet fs("partition",
             "MODEL.onnx --stages K|auto --batch B --microbatches M [flags] --out DIR",
             "Cuts the model's training graph (forward, loss, backward, optimizer) into K pipeline\n"
             "stages so that every stage fits its device and the predicted step time is smallest,\n"
             "chooses what each stage recomputes, simulates the schedule, and writes DIR/plan.json\n"
             "(what `onnxpipe train --plan DIR` loads), report.txt, report.html, partition.dot,\n"
             "schedule.trace.json, stage_<k>.program (each stage's program: what a rank of train --plan\n"
             "runs) and stage_<k>.onnx. --sweep writes DIR/sweep.csv and sweep.html.\n"
             "Devices: h200, h100-80gb, a100-80gb, a100-40gb, v100-32gb, cpu, or a JSON file\n"
             "(partitioner/device.h documents the format). --profile takes `onnxpipe profile` output.");
  fs.String("stages", &f.stages, "number of pipeline stages, or auto (the fewest that fit; see --objective)");
  fs.Int("batch", &f.batch, "global batch B (samples per optimizer step)");
  fs.Int("microbatches", &f.microbatches, "micro-batches M per step and replica (B must be divisible by D x M)");
  fs.Int("data-parallel", &f.data_parallel,
         "D data-parallel replicas of the pipeline (K x D ranks, as train --data-parallel): the plan is made for "
         "the per-replica batch B / D and each stage's step adds the all-reduce of its gradients over D replicas");
  fs.Double("dp-bucket-mb", &f.dp_bucket_mb,
            "data parallelism: the all-reduce bucket (as train --dp-bucket-mb): full buckets run during the last "
            "micro-batch's backward, and only what runs past it counts in the step");
  fs.Int("seq", &f.seq, "sequence length (binds the sequence dim)");
  fs.String("schedule", &f.schedule, "gpipe | 1f1b");
  fs.String("recompute", &f.recompute, "none | full | selective | auto");
  AddGraphFlags(fs, &f.graph);
  fs.String("dtype", &f.dtype, "fp32 | bf16: the training graph `train --dtype` runs (bf16: bf16 activations and "
            "GEMMs, fp32 master weights, gradients and optimizer state), and the device's GEMM peak for it");
  fs.String("device", &f.device,
            "built-in device name, a device JSON file, or auto (this machine's GPU 0, by its built-in profile). "
            "Default: the device --profile was measured on, else h200");
  fs.String("device-memory", &f.device_memory, "override the device memory, e.g. 40GiB");
  fs.String("profile", &f.profile,
            "measured per-op times (onnxpipe profile --out times.json); a --backend cuda profile's kernel scratch "
            "is counted in a GPU device's stage memory");
  fs.String("objective", &f.objective, "with --stages auto: fewest (stages that fit) | throughput");
  fs.Int("max-stages", &f.max_stages, "upper end of --stages auto");
  fs.String("sweep", &f.sweep,
            "\"batch=32,64 microbatches=1,2,4 stages=2,4 [data_parallel=1,2]\": predict a table instead");
  fs.Double("cut-slack", &f.cut_slack, "a cut is a candidate when its crossing bytes are within this fraction of the smallest");
  fs.Bool("onnx", &f.onnx, "write stage_<k>.onnx (--no-onnx skips them)");
  fs.String("out", &f.out, "output folder");
  if (absl::Status st = fs.Parse(args); !st.ok()) return Fail("partition", std::string(st.message()), 2);
  if (fs.help_requested()) {
    std::printf("%s", fs.Usage().c_str());
    return 0;
  }
  f.device_set = fs.WasSet("device");
  if (fs.positional().size() != 1) return Fail("partition", "expected exactly one MODEL.onnx (see --help)", 2);
  if (f.out.empty()) return Fail("partition", "--out DIR is required", 2);
  if (absl::Status st = Run(fs.positional()[0], f); !st.ok()) return Fail("partition", std::string(st.message()));
  return 0;
}

}  // namespace onnxpipe::tools
