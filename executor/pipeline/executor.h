// The pipeline executor: runs a training graph as K stages over M micro-batches per step with the
// GPipe or 1F1B schedule, one std::thread per stage, stages talking only through comm::Comm.
//
// It runs a compiled plan (partitioner/plan_io.h's CompilePlan: the stage programs of
// partitioner/stage_program.h and the action lists of partitioner/schedule.h) as written.
// Step(feeds): the batch (B = M x micro-batch rows of every data input, labels included) is cut
// into M micro-batches; each stage thread walks its action list, computing with the backend
// (executor/backend), sending every value another stage reads as soon as it is made and receiving
// at the RECV actions; gradients accumulate over the micro-batches; at the optimizer step the post
// phase runs the stage's post nodes (gradient Sums, the global norm on the coordinator, the
// updates of the parameters it holds). The step's loss is sum_m share_m * loss_m (microbatch.h).
//
// Backend: every buffer (arenas, parameters, optimizer state, constants, the values in transit) is
// the backend's memory, one stream per stage; the driver touches it only through the backend's
// calls: feeds and step scalars go in by FromHost, the loss and the norm come out by ToHost, the
// comm copies what it carries through the backend and receives land in the arena's planned slots.
// Parameters(), State() and StageConstant() return host values: copies of device memory (a failing
// device copy aborts: the state could not be trusted), the stage's own storage on a host backend,
// which the next Step stops sharing before it updates a state (copy on write). Treat them as
// read-only.
//
// Random streams: micro-batch m of step k uses ExecContext{dropout, seed, offset = k,
// row_offset = m * rows, rows} in its forward, backward and recompute: a recomputed Dropout replays
// its mask, and the micro-batches draw the rows of the Trainer's full-batch masks (offset = k).
//
// Failures: an error status, a thrown exception or (check_numerics) a NaN/Inf output in any stage
// aborts the comm group, which wakes every stage blocked in a receive; Step joins all threads and
// returns ONE error naming the stage, micro-batch, phase and node that failed first. The executor
// is unusable after a failed step (its parameters may be half-updated): Step then fails at once.
//
// Graphs (options.graphs): in a stage's forward and backward parts, each run of nodes the backend
// can capture (Backend::Capturable) up to a node whose outputs leave the stage is recorded as one
// graph in the second step and replayed from then on, the host only redoing its bookkeeping with
// the outputs the recording returned (every value stays in its planned slot, so the addresses are
// the same). Feeds, receives and sends stay outside the graphs; the step offset reaches the kernels
// through device memory (ExecContext::device_offset), the micro-batch losses are copied to buffers
// of their own and read after the stage's actions; the optimizer phase is recorded likewise, with
// lr and the step count on the backend. A state whose storage moved (SetState, copy on write) makes
// the stage record again. A recording that fails (a kernel the backend could not capture after
// all) ran nothing: its nodes run eagerly, then and in later steps, with one warning per stage.
//
// Memory: Create plans every stage's layout once (memory.h) and allocates it (stage_arena.h); every
// micro-batch value, gradient and accumulator lives in its planned slot, checked after each node.
// StageMeasure reports the high-water of what the arena handed out in the step, which equals the
// layout's prediction. The optimizer phase updates every stage's parameters and optimizer state in
// place (each stage owns its states' storage); a tied parameter's gradient is all-reduced over its
// holders in place, in the accumulator of each holder's contribution (comm::Comm::AllReduce, in the
// Sum's operand order, so every holder gets the Sum's bits); its other outputs (the global norm) are
// fresh tensors, measured as optimizer scratch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/pipeline/memory.h"
#include "executor/pipeline/microbatch.h"
#include "executor/pipeline/topology.h"
#include "partitioner/plan_io.h"

namespace onnxpipe::comm {
class Comm;
class StagingPool;
}  // namespace onnxpipe::comm

namespace onnxpipe::pipeline {

class StageExecutor;

using partitioner::PipelineProgram;
using partitioner::StageProgram;

enum class StepPhase : uint8_t { kForward, kBackward, kPost };
const char* StepPhaseName(StepPhase p);  // "forward" | "backward" | "optimizer"

// After a node has run: where, and its outputs (a hook may write into them, e.g. to inject a NaN;
// they must stay in their planned slots).
struct NodeEvent {
  int32_t stage = 0;
  int32_t microbatch = -1;  // -1 in the post phase
  StepPhase phase = StepPhase::kForward;
  const ir::Node* node = nullptr;
};
// Returning an error (or throwing) fails the node as a kernel error would. For tests.
using NodeHook = std::function<absl::Status(const NodeEvent&, std::vector<ir::Tensor>* outputs)>;

struct ExecutorOptions {
  bool dropout = true;  // ExecContext::training
  uint64_t seed = 0;
  bool check_numerics = false;
  // Replay each stage's micro-batch work as graphs (CUDA graphs; the backend's Stream::BeginCapture):
  // the first step runs eagerly (kernels pick their paths and tactics), the second records, later
  // steps replay. Not with check_numerics or a node_hook (they look at every node's outputs).
  bool graphs = false;
  double recv_timeout_s = 0;  // > 0: a receive waiting longer fails the step (hang detector)
  // The in-process comm with NCCL's semantics (InProcessGroup::UseNcclSemantics): the stages' transfers run as they
  // would over NCCL, a send waiting for its receive (tests).
  bool nccl_semantics = false;
  NodeHook node_hook;
  // Multi-process: this process's comm over the world (comm/tcp_comm.h, ...; it must outlive the
  // executor) and its place in it. The process runs only stage topology.stage() of replica
  // topology.replica() (the other stages are neither allocated nor uploaded), reaching the stages of
  // its replica through the world comm; a step's feeds are the global batch of all D replicas, of
  // which the replica takes its M micro-batches (loss shares and dropout masks are the global
  // batch's, so the run trains what one process with D x M micro-batches would); the accumulated
  // gradients are all-reduced over the D replicas (in replica order) before the optimizer phase, and
  // the step's loss and gradient norm reach every rank. Null: every stage here, each on its own
  // thread over an in-process group (topology must then be K x 1).
  comm::Comm* world = nullptr;
  Topology topology;
  // Data parallelism: the backward all-reduces its complete gradients in buckets of at least this many bytes
  // (PyTorch DDP's bucket_cap_mb, 25 MiB by default); 0 or less: each gradient alone, as soon as it is complete.
  // The rest (the last bucket) goes at the optimizer phase's start.
  int64_t dp_bucket_bytes = int64_t{25} << 20;
};

struct StepFeeds {
  std::map<std::string, ir::Tensor> batch;  // every data input (and the labels), B rows each
  double lr = 0;
  int64_t step = 0;  // 0-based; the optimizer's step input gets step + 1
};

// Chrome-trace-like record of one action (times in microseconds from the step's start).
struct TraceEvent {
  int32_t stage = 0;
  int32_t lane = 0;      // 0 compute, 1 communication waits
  std::string name;      // "F3", "B3", "R3", "O", "recv F3 from 0", ...
  std::string category;  // forward | backward | recompute | optimizer | recv
  int32_t microbatch = -1;
  double start_us = 0, dur_us = 0;
};

struct StageMeasure {
  double forward_s = 0, backward_s = 0, recompute_s = 0, post_s = 0, recv_wait_s = 0;
  int32_t microbatches_forwarded = 0;
  // Memory high-water marks. saved_bytes: the arena bytes one micro-batch holds at the end of its
  // forward; activations_peak: those of the micro-batches in flight together (max_in_flight of
  // them); arena_bytes: what the stage arena handed out (StageArenaStats); transient_bytes: the
  // rest of it.
  int64_t saved_bytes = 0;
  int64_t activations_peak = 0;
  int64_t transient_bytes = 0;
  int64_t arena_bytes = 0;
  int32_t max_in_flight = 0;
  int64_t accumulator_bytes = 0;  // gradients accumulated over the micro-batches
  int64_t workspace_bytes = 0;
  int64_t optimizer_scratch_bytes = 0;  // the optimizer phase's fresh tensors (states update in place)
  int64_t bytes_sent = 0, bytes_received = 0;
  int32_t dp_buckets_in_backward = 0;  // data parallelism: gradient buckets all-reduced before the optimizer phase
  // Graphs (ExecutorOptions::graphs): launched in the step, and the micro-batch nodes they replayed.
  int32_t graph_launches = 0;
  int64_t replayed_nodes = 0;
  int32_t failed_recordings = 0;  // runs of nodes whose recording failed: they run eagerly (a warning says why)
};

struct PipelineStepResult {
  double loss = 0;
  double grad_norm = 0;                           // NaN when the graph has no norm
  std::vector<double> microbatch_losses, shares;  // with a world comm: this replica's, on the loss stage only
  double seconds = 0;
  std::vector<StageMeasure> stages;  // by stage (with a world comm only this rank's is measured)
  std::vector<TraceEvent> trace;
};

// What a process needs of the whole training graph beyond the programs of the stages it runs: ProgramFactsOf derives
// it from the graph; a stage program file (stage_file.h) carries it, so that a rank needs no other stage.
struct ProgramFacts {
  LossShareRule loss_rule;  // AnalyzeLoss over the global batch's micro-batches
  ir::Tensor seed_like;     // dtype and dims of the loss seed
  int64_t microbatch_size = 0;
  std::map<std::string, ir::Tensor> state_shapes;  // every stage's states (DimsOnly), by name
  std::map<std::string, int32_t> parameters;       // every trained parameter, by name: the stage owning it
};
// `loss_microbatches`: the micro-batches the loss is shared over (M x D).
absl::StatusOr<ProgramFacts> ProgramFactsOf(const ir::Graph& training_graph, const PipelineProgram& program,
                                            int32_t loss_microbatches);

class PipelineExecutor {
 public:
  // `training_graph`: one micro-batch's training graph (batch dim bound to the micro-batch size), the
  // graph `plan` was compiled against. Plans every stage's memory layout and allocates it.
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      const ir::Graph& training_graph, partitioner::CompiledPlan plan, const ExecutorOptions& options,
      std::shared_ptr<const backend::Backend> backend = nullptr);
  // The same from the facts of the graph: `plan` then needs the programs of this process's stages only (the others
  // may be empty but for their index: a rank built from its stage program file).
  static absl::StatusOr<std::unique_ptr<PipelineExecutor>> Create(
      ProgramFacts facts, partitioner::CompiledPlan plan, const ExecutorOptions& options,
      std::shared_ptr<const backend::Backend> backend = nullptr);
  ~PipelineExecutor();

  absl::StatusOr<PipelineStepResult> Step(const StepFeeds& feeds);

  // Trained parameters by name, from the stages that own them (snapshots: the next step updates the
  // stages' own in place, or a copy of them while the caller holds these).
  std::map<std::string, ir::Tensor> Parameters() const;
  // The value stage `stage` holds for constant `name` (its own parameter or a replica), as a snapshot.
  std::optional<ir::Tensor> StageConstant(int32_t stage, const std::string& name) const;

  // Every state tensor a step updates (parameters and optimizer state), by constant name, from the first stage
  // holding it (a shared parameter's holders keep bitwise-equal copies), as snapshots. With a world comm, of this
  // process's stage only (as Parameters() and StageConstant()); SetState then sets the holders here and ignores
  // a state only other stages hold.
  std::map<std::string, ir::Tensor> State() const;
  // The names, dtypes and dims of every stage's states (also the other processes' stages), without values.
  std::map<std::string, ir::Tensor> StateShapes() const;
  // Sets state `name` on every stage that holds it (each holder of a shared parameter, with its own optimizer
  // state, and any replica), each stage getting its own copy. An error naming the state when no stage updates it
  // or `value`'s dtype or dims differ; nothing is changed then.
  absl::Status SetState(const std::string& name, const ir::Tensor& value);

  const PipelineProgram& program() const { return program_; }
  const ProgramFacts& facts() const { return facts_; }
  const backend::Backend& backend() const { return *backend_; }
  const std::vector<partitioner::ActionList>& action_lists() const { return lists_; }
  const ExecutorOptions& options() const { return options_; }
  partitioner::ScheduleKind schedule() const { return schedule_; }
  int32_t microbatches() const { return microbatches_; }
  // The memory layout stage s runs in (what PredictStageMemory reports for it); local stages only.
  const StageLayout& layout(int32_t stage) const;
  // True for the stages this process runs (all of them without a world comm).
  bool is_local(int32_t stage) const { return stages_[stage] != nullptr; }
  int64_t microbatch_size() const { return facts_.microbatch_size; }
  // The names of the data inputs a step must feed: those the local stages read, and the labels where the loss stage
  // is local (with a world comm a rank feeds its own stage's only).
  const std::vector<std::string>& data_inputs() const { return data_inputs_; }
  // Value `name` of the first local stage that has it (null: none here).
  const ir::Value* LocalValue(const std::string& name) const;

 private:
  PipelineExecutor() = default;
  // With a world comm: the step's loss and norm from the ranks holding them, on every rank.
  absl::Status ShareResult(PipelineStepResult& r, double loss_part, double norm_part);
  std::vector<std::vector<int>> AllReduceGroups(const Topology& topo) const;
  ir::Tensor HostCopy(const ir::Tensor& t) const;

  ExecutorOptions options_;
  partitioner::ScheduleKind schedule_ = partitioner::ScheduleKind::k1F1B;
  int32_t microbatches_ = 1;
  std::shared_ptr<const backend::Backend> backend_;
  PipelineProgram program_;
  ProgramFacts facts_;
  std::vector<partitioner::ActionList> lists_;
  std::vector<std::unique_ptr<StageExecutor>> stages_;  // by stage; null for another process's stage
  std::vector<std::string> data_inputs_;
  bool broken_ = false;
  std::shared_ptr<comm::StagingPool> staging_;  // the sends' staging buffers, kept across steps
  std::unique_ptr<comm::Comm> pipeline_comm_;   // with a world comm: this replica's stages, by stage
  int64_t steps_done_ = 0;                      // steps that succeeded
};

}  // namespace onnxpipe::pipeline
