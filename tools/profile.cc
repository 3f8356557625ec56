// onnxpipe profile: measure every node of a model's training graph on a backend and write the
// per-op times and kernel scratch sizes `onnxpipe partition --profile` reads (format:
// partitioner/cost_model.h), and, with --device-out, a device profile calibrated from them
// (partitioner/calibrate.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>

#include "executor/backend/backend.h"
#include "executor/io/atomic_file.h"
#include "frontend/ir/status.h"
#include "partitioner/calibrate.h"
#include "partitioner/cost_model.h"
#include "partitioner/memory_planner.h"
#include "partitioner/reports.h"
#include "tools/backend_flag.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/graph_flags.h"
#include "tools/partition_model.h"

namespace onnxpipe::tools {
namespace {

namespace part = onnxpipe::partitioner;

struct Flags {
  GraphFlags graph;  // the training graph's options, as train's
  std::string out, device_out, backend = "cpu";
  std::string dtype = "fp32";
  int64_t batch = 0, seq = 0, repeats = 5, warmup = 1, seed = 0, device = 0;
  bool tf32 = false;
  std::string cuda_attention = "auto";
  std::string gemm_tactics;
};

const char* PhaseName(ir::Phase p) {
  switch (p) {
    case ir::Phase::kForward:
      return "forward";
    case ir::Phase::kBackward:
      return "backward";
    case ir::Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

// The exclusive upper bound of valid values of integer input v: the smallest extent it indexes
// (a Gather's axis, a loss's classes); 1 (only zeros) when nothing bounds it.
int64_t IndexBound(const ir::Graph& g, const std::vector<std::vector<ir::NodeId>>& uses, ir::ValueId v) {
  int64_t bound = -1;
  auto extent = [&](ir::ValueId of, int64_t axis) -> int64_t {
    const ir::Value& d = g.value(of);
    if (!d.shape_known) return -1;
    if (axis < 0) axis += static_cast<int64_t>(d.shape.size());
    if (axis < 0 || axis >= static_cast<int64_t>(d.shape.size()) || !d.shape[axis].is_concrete()) return -1;
    return d.shape[axis].value();
  };
  for (ir::NodeId id : uses[v]) {
    const ir::Node& n = g.node(id);
    int64_t e = -1;
    if (n.op == ir::OpKind::kGather && n.inputs.size() > 1 && n.inputs[1] == v) {
      e = extent(n.inputs[0], n.attrs.Get<int64_t>("axis", 0));
    } else if (n.op == ir::OpKind::kSoftmaxCrossEntropyLoss && n.inputs.size() > 1 && n.inputs[1] == v) {
      e = extent(n.inputs[0], 1);
    }
    if (e > 0) bound = bound < 0 ? e : std::min(bound, e);
  }
  return bound > 0 ? bound : 1;
}

// Inputs for one step: random normal floats, integers uniform over the range they index (token ids,
// labels; zeros where nothing bounds them), the learning rate and step count for the optimizer.
std::vector<ir::Tensor> Feeds(const ir::Graph& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<std::vector<ir::NodeId>> uses = g.ComputeUses();
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId v : g.inputs()) {
    const ir::Value& val = g.value(v);
    ir::Tensor t(val.dtype, ir::ToInts(val.shape));
    if ((val.dtype == ir::DType::kI64 || val.dtype == ir::DType::kI32) && !val.shape.empty()) {
      std::uniform_int_distribution<int64_t> index(0, IndexBound(g, uses, v) - 1);
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        const int64_t x = index(rng);
        if (val.dtype == ir::DType::kI64) {
          t.mutable_data<int64_t>()[i] = x;
        } else {
          t.mutable_data<int32_t>()[i] = static_cast<int32_t>(x);
        }
      }
    }
    if (val.dtype == ir::DType::kF32) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<float>()[i] = normal(rng);
    } else if (val.dtype == ir::DType::kF64) {
      for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<double>()[i] = normal(rng);
      if (t.num_elements() == 1) t.mutable_data<double>()[0] = 1e-3;  // the learning rate
    } else if (val.dtype == ir::DType::kI64 && t.num_elements() == 1 && val.shape.empty()) {
      t.mutable_data<int64_t>()[0] = 1;  // the step count
    }
    feeds.push_back(std::move(t));
  }
  return feeds;
}

// Node outputs live where the memory plan of the profiled order puts them: the arena values in one
// arena allocated up front (values whose lifetimes do not overlap share bytes, as in a training
// step, so a batch that trains fits), the others (gradients, state updates) each in a buffer kept
// across the runs. Outputs are zero-filled on each use unless the kernel writes every element, as
// a plan's slots are; views stay views (as the memory planner aliases them); one workspace serves
// every node: after the warm-up no allocation falls inside a timed node (a device allocation costs
// more than most kernels).
class KeptOutputs : public ir::OutputAllocator {
 public:
  KeptOutputs(const backend::Backend& be, backend::Stream* stream, const part::MemoryPlan& plan,
              std::shared_ptr<uint8_t> arena)
      : be_(be), stream_(stream), plan_(plan), arena_(std::move(arena)) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    ASSIGN_OR_RETURN(ir::Tensor kept, AllocateUninitialized(node, index, dtype, dims));
    if (kept.num_bytes() > 0) RETURN_IF_ERROR(be_.Fill(kept, 0, stream_));
    return kept;
  }
  absl::StatusOr<ir::Tensor> AllocateUninitialized(const ir::Node& node, int index, ir::DType dtype,
                                                   const std::vector<int64_t>& dims) override {
    const ir::ValueId v = node.outputs.at(index);
    int64_t bytes = ir::DTypeSize(dtype);
    for (int64_t d : dims) bytes *= d;
    if (v < static_cast<ir::ValueId>(plan_.values.size()) && plan_.values[v].region == part::MemoryRegion::kArena &&
        bytes == plan_.values[v].bytes) {
      return ir::Tensor::View(dtype, dims, arena_, plan_.values[v].offset, be_.placement());
    }
    ir::Tensor& kept = kept_[v];
    if (!kept.defined() || kept.dtype() != dtype || kept.dims() != dims) {
      ASSIGN_OR_RETURN(kept, be_.Zeros(dtype, dims, stream_));
    }
    return kept;
  }
  bool SharesInputBuffer(const ir::Node& node, int index) const override {
    return index == 0 && part::IsAliasOp(node.op);
  }
  absl::StatusOr<void*> Workspace(const ir::Node&, int64_t bytes) override {
    if (bytes > workspace_bytes_) {
      ASSIGN_OR_RETURN(workspace_, be_.Allocate(bytes));
      workspace_bytes_ = bytes;
    }
    return static_cast<void*>(workspace_.get());
  }
  // Bytes of the outputs held outside the arena.
  int64_t kept_bytes() const {
    int64_t n = 0;
    for (const auto& [v, t] : kept_) n += t.num_bytes();
    return n;
  }

 private:
  const backend::Backend& be_;
  backend::Stream* stream_;
  const part::MemoryPlan& plan_;
  std::shared_ptr<uint8_t> arena_;
  std::map<ir::ValueId, ir::Tensor> kept_;
  std::shared_ptr<uint8_t> workspace_;
  int64_t workspace_bytes_ = 0;
};

absl::Status Run(const std::string& model_path, const Flags& f) {
  TrainingGraphOptions to;
  to.seq = f.seq;
  to.graph = f.graph;
  to.dtype = f.dtype == "bf16" ? ir::DType::kBF16 : ir::DType::kF32;
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingGraphs> graphs, TrainingGraphs::Open(model_path, to));
  ASSIGN_OR_RETURN(const ir::Graph* gp, graphs->Get(f.batch));
  const ir::Graph& g = *gp;
  const std::vector<ir::NodeId> order = g.LiveNodes();
  std::vector<int32_t> last_use(g.num_values(), -1);
  for (int32_t t = 0; t < static_cast<int32_t>(order.size()); ++t)
    for (ir::ValueId v : g.node(order[t]).inputs)
      if (v != ir::kNoValue) last_use[v] = t;

  ASSIGN_OR_RETURN(const std::shared_ptr<const backend::Backend> be,
                   BackendFromFlags(f.backend, f.device, {.tf32 = f.tf32, .cuda_attention = f.cuda_attention, .gemm_tactics = f.gemm_tactics}));
  const std::unique_ptr<backend::Stream> stream = be->CreateStream();
  backend::ExecContext ctx;
  ctx.training = true;
  ctx.seed = static_cast<uint64_t>(f.seed);
  ctx.stream = stream.get();
  // Feeds and constants on the backend once (constants its kernels read on the host stay there).
  const std::vector<std::vector<ir::NodeId>> uses = g.ComputeUses();
  std::vector<ir::Tensor> constants(g.num_values());
  for (ir::ValueId v = 0; v < g.num_values(); ++v) {
    if (!g.value(v).constant) continue;
    const ir::Tensor& c = *g.value(v).constant;
    if (backend::ReadOnlyOnHost(*be, g, uses, v)) {
      constants[v] = c;
    } else {
      ASSIGN_OR_RETURN(constants[v], be->Upload(c, stream.get()));
    }
  }
  part::MemoryPlanOptions plan_options;
  plan_options.alignment = 256;  // the 16-byte vector loads of the device kernels, and then some
  // A graph with symbolic dims left (no --seq for a sequence model) has no plan: each output then
  // keeps a buffer of its own.
  const absl::StatusOr<part::MemoryPlan> planned = part::PlanMemory(g, order, plan_options);
  const part::MemoryPlan plan = planned.ok() ? *planned : part::MemoryPlan{};
  ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> arena, be->Allocate(std::max<int64_t>(plan.arena_bytes, 1)));
  KeptOutputs kept(*be, stream.get(), plan, arena);
  std::vector<ir::Tensor> feeds = Feeds(g, static_cast<uint64_t>(f.seed));
  for (size_t i = 0; i < feeds.size(); ++i) {
    if (!backend::ReadOnlyOnHost(*be, g, uses, g.inputs()[i])) {
      ASSIGN_OR_RETURN(feeds[i], be->Upload(feeds[i], stream.get()));
    }
  }
  // Each node is bracketed by timed events on the stream and read after the run: its device time
  // without a synchronisation per node (whose round trip would dwarf the small kernels), as the
  // step issues it.
  std::vector<std::vector<double>> samples(g.num_node_slots());
  std::vector<std::pair<std::shared_ptr<backend::Event>, std::shared_ptr<backend::Event>>> marks(order.size());
  const bool tty = isatty(fileno(stdout));
  for (int64_t rep = 0; rep < f.warmup + f.repeats; ++rep) {
    std::printf(tty ? "\rprofile: run %lld/%lld%s\x1b[K" : "profile: run %lld/%lld%s\n",
                static_cast<long long>(rep + 1), static_cast<long long>(f.warmup + f.repeats),
                rep < f.warmup ? " (warm-up)" : "");
    std::fflush(stdout);
    std::vector<ir::Tensor> values(g.num_values());
    for (size_t i = 0; i < g.inputs().size(); ++i) values[g.inputs()[i]] = feeds[i];
    for (int32_t t = 0; t < static_cast<int32_t>(order.size()); ++t) {
      const ir::Node& n = g.node(order[t]);
      std::vector<ir::Tensor> in;
      in.reserve(n.inputs.size());
      for (ir::ValueId v : n.inputs) {
        if (v == ir::kNoValue) {
          in.emplace_back();
        } else if (g.value(v).constant) {
          in.push_back(constants[v]);
        } else {
          in.push_back(values[v]);
        }
      }
      ASSIGN_OR_RETURN(marks[t].first, stream->RecordTimed());
      absl::StatusOr<std::vector<ir::Tensor>> out = be->Run(n, in, ctx, &kept);
      if (!out.ok()) return Annotate(out.status(), "profiling node '" + n.name + "'");
      ASSIGN_OR_RETURN(marks[t].second, stream->RecordTimed());
      for (size_t i = 0; i < n.outputs.size() && i < out->size(); ++i)
        if (n.outputs[i] != ir::kNoValue) values[n.outputs[i]] = std::move((*out)[i]);
      for (ir::ValueId v : n.inputs)  // free what no later node reads
        if (v != ir::kNoValue && last_use[v] == t && !g.IsGraphOutput(v)) values[v] = ir::Tensor();
    }
    for (int32_t t = 0; t < static_cast<int32_t>(order.size()) && rep >= f.warmup; ++t) {
      ASSIGN_OR_RETURN(const double s, stream->SecondsBetween(*marks[t].first, *marks[t].second));
      samples[order[t]].push_back(s);
    }
    RETURN_IF_ERROR(stream->Synchronize());
  }
  int64_t output_bytes = 0;  // every arena value's own bytes: what keeping each output apart would take
  for (const part::ValueMemory& vm : plan.values)
    if (vm.region == part::MemoryRegion::kArena) output_bytes += vm.bytes;
  if (planned.ok()) {
    std::printf(
        "%sprofile: node outputs in a %.1f MiB arena (the memory plan of this order) for %.1f MiB of arena "
        "values, %.1f MiB in buffers of their own (gradients, updated states)\n",
        tty ? "\n" : "", plan.arena_bytes / 1048576.0, output_bytes / 1048576.0, kept.kept_bytes() / 1048576.0);
  } else {
    std::printf("%sprofile: node outputs in buffers of their own, %.1f MiB (no memory plan: %s)\n", tty ? "\n" : "",
                kept.kept_bytes() / 1048576.0, std::string(planned.status().message()).c_str());
  }

  part::OpTimes times;
  times.model = std::filesystem::path(model_path).filename().string();
  times.backend = f.backend;
  times.device = BackendBuiltinDevice(*be);
  times.dtype = f.dtype;
  times.optimizer = f.graph.optimizer;
  times.microbatch = f.batch;
  times.seq = f.seq;
  times.repeats = f.repeats;
  char created[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  times.created = created;
  if (tty) std::printf("\r\x1b[K");
  std::map<std::string, double> per_op;
  double phase_ms[3] = {0, 0, 0};
  std::vector<double> median_s(g.num_node_slots(), 0.0);
  for (ir::NodeId id : order) {
    std::vector<double>& s = samples[id];
    std::sort(s.begin(), s.end());
    const double ms = s.empty() ? 0.0 : s[s.size() / 2] * 1e3;
    median_s[id] = ms * 1e-3;
    const ir::Node& n = g.node(id);
    // The node's kernel scratch on this bound graph, by the backend's own sizing (asked after the
    // runs: the cuda backend's cuDNN graphs, whose workspace sizes need the device, are built by now).
    times.ops.push_back({n.name, std::string(ir::OpName(n.op)), PhaseName(n.phase), ms, be->WorkspaceBytes(g, n)});
    per_op[std::string(ir::OpName(n.op))] += ms;
    phase_ms[static_cast<int>(n.phase)] += ms;
  }
  RETURN_IF_ERROR(io::WriteFileAtomically(f.out, part::OpTimesToJson(times).dump(1) + "\n"));
  std::printf("profiled %s: %zu nodes, micro-batch %lld, median of %lld runs on the %s backend (device %s)\n",
              times.model.c_str(), order.size(), static_cast<long long>(f.batch), static_cast<long long>(f.repeats),
              f.backend.c_str(), times.device.empty() ? "without a built-in profile" : times.device.c_str());
  if (const std::string fallbacks = BackendFallbackSummary(*be); !fallbacks.empty())
    std::printf("%s\n", fallbacks.c_str());
  if (const std::string att = BackendAttentionSummary(*be); !att.empty()) std::printf("%s\n", att.c_str());
  std::printf("forward %s, backward %s, optimizer %s per step\n", part::FormatMs(phase_ms[0]).c_str(),
              part::FormatMs(phase_ms[1]).c_str(), part::FormatMs(phase_ms[2]).c_str());
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [op, ms] : per_op) top.push_back({ms, op});
  std::sort(top.rbegin(), top.rend());
  for (size_t i = 0; i < top.size() && i < 8; ++i)
    std::printf("  %-28s %10s\n", top[i].second.c_str(), part::FormatMs(top[i].first).c_str());
  std::printf("wrote %s\n", f.out.c_str());

  // The roofline that reproduces these times (partitioner/calibrate.h).
  // Calibrated from the built-in profile of what it ran on (its memory, reserve and links are kept).
  const bool host = f.backend != "cuda";
  part::DeviceProfile base = *part::BuiltinDevice(BackendDeviceProfile(*be));
  base.name = host ? "cpu-calibrated" : "gpu-calibrated";
  base.source = "onnxpipe profile " + times.model + " --batch " + std::to_string(f.batch);
  if (const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE); host && pages > 0 && page > 0) {
    base.memory_bytes = static_cast<int64_t>(pages) * page;
  }
  const part::Calibration c = part::CalibrateDevice(g, median_s, base);
  std::printf(
      "calibrated roofline: GEMM %.2f GFLOP/s, other ops %.2f GFLOP/s, memory %.2f GB/s, overhead %.1f us "
      "(%lld GEMM, %lld memory-bound, %lld compute-bound nodes); predicts %s for the measured %s\n",
      c.device.gemm_flops_fp32 / 1e9, c.device.vector_flops / 1e9, c.device.memory_bandwidth / 1e9,
      c.device.op_overhead_s * 1e6, static_cast<long long>(c.gemm_nodes), static_cast<long long>(c.memory_nodes),
      static_cast<long long>(c.vector_nodes), part::FormatMs(c.predicted_s * 1e3).c_str(),
      part::FormatMs(c.measured_s * 1e3).c_str());
  if (!f.device_out.empty()) {
    nlohmann::ordered_json j = part::DeviceToJson(c.device);
    j.erase("source");  // (not a key of the device file format)
    j["backend"] = c.device.backend;
    RETURN_IF_ERROR(io::WriteFileAtomically(f.device_out, j.dump(1) + "\n"));
    std::printf("wrote %s (use it as --device %s)\n", f.device_out.c_str(), f.device_out.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunProfile(const Args& args) {
  Flags f;
  FlagSet fs("profile", "MODEL.onnx --batch B [--seq S] [--optimizer sgd|adamw] [--dtype fp32|bf16] --out times.json",
             "Runs the model's training graph (forward, loss, backward, optimizer update) on the CPU\n"
             "backend (or --backend cuda: each node's time up to its device work's end) with random inputs and\n"
             "writes every node's median time and kernel scratch bytes (format onnxpipe-op-times/1, documented\n"
             "in partitioner/cost_model.h) for `onnxpipe partition --profile times.json` (a cuda profile's\n"
             "scratch is what a GPU plan counts as kernel scratch), with the built-in device it ran on\n"
             "(cpu, or e.g. h100-80gb), which partition plans for unless --device says otherwise.\n"
             "--batch is the micro-batch to measure at.\n"
             "It prints the roofline calibrated from these times (achieved GEMM and vector FLOP/s,\n"
             "memory bandwidth, per-op overhead); --device-out writes it as a device file\n"
             "(partitioner/device.h) for `onnxpipe partition --device FILE.json`.");
  fs.Int("batch", &f.batch, "micro-batch size to measure (binds the batch dim)");
  fs.Int("seq", &f.seq, "sequence length (binds the sequence dim)");
  AddGraphFlags(fs, &f.graph);
  fs.String("dtype", &f.dtype, "fp32 | bf16: the training graph `train --dtype` runs (bf16: mixed precision)");
  fs.Int("repeats", &f.repeats, "measured runs (the median is kept)");
  fs.Int("warmup", &f.warmup, "unmeasured runs first");
  fs.Int("seed", &f.seed, "seed of the random inputs and dropout");
  fs.String("out", &f.out, "output JSON file");
  fs.String("backend", &f.backend, "cpu | cuda | checked: where the nodes run");
  fs.Int("device", &f.device, "the GPU --backend cuda runs on");
  fs.Bool("tf32", &f.tf32, "--backend cuda: fp32 GEMMs on TF32 tensor cores");
  DeclareCudaAttentionFlag(fs, &f.cuda_attention);
  DeclareGemmTacticsFlag(fs, &f.gemm_tactics);
  fs.String("device-out", &f.device_out,
            "also write a device profile (JSON) whose roofline reproduces the measured times");
  if (absl::Status st = fs.Parse(args); !st.ok()) return Fail("profile", std::string(st.message()), 2);
  if (fs.help_requested()) {
    std::printf("%s", fs.Usage().c_str());
    return 0;
  }
  if (fs.positional().size() != 1) return Fail("profile", "expected exactly one MODEL.onnx (see --help)", 2);
  if (f.out.empty()) return Fail("profile", "--out times.json is required", 2);
  if (f.batch < 1) return Fail("profile", "--batch must be >= 1", 2);
  if (f.dtype != "fp32" && f.dtype != "bf16")
    return Fail("profile", "--dtype expects fp32 or bf16, got '" + f.dtype + "'", 2);
  if (f.repeats < 1 || f.warmup < 0) return Fail("profile", "--repeats must be >= 1 and --warmup >= 0", 2);
  if (absl::Status st = Run(fs.positional()[0], f); !st.ok()) return Fail("profile", std::string(st.message()));
  return 0;
}

}  // namespace onnxpipe::tools
