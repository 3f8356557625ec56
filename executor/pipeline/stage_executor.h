// One stage replica of the pipeline (executor.h): the stage program it runs, its memory layout and arena, its
// stream on the backend and what it keeps from step to step (the step scalars on the backend, the optimizer phase's
// outputs, its recorded graphs). PipelineExecutor makes one per stage it runs and drives them, each on its own thread
// in a step; a stage executor talks to the other stages only through the comm::Comm a step gives it (and, with data
// parallelism, the world comm of ExecutorOptions).
//
// Run interprets the stage's action list for one step (the contract of executor.h: micro-batch values in their
// planned slots, eager sends, gradients accumulated in micro-batch order, the optimizer phase at the optimizer step).
// The work is split by concern: stage_executor.cc (construction, the action loop, forward and backward),
// stage_nodes.cc (running nodes, eagerly or as recorded graphs), stage_comm.cc (sends, receives, all-reduces and the
// data-parallel gradient buckets), stage_post.cc (the optimizer phase and its graph segments).
#pragma once

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "executor/backend/backend.h"
#include "executor/pipeline/executor.h"
#include "executor/pipeline/post_slots.h"
#include "executor/pipeline/stage_arena.h"

namespace onnxpipe::comm {
class Comm;
}

namespace onnxpipe::pipeline {

// What a step gives each of its stage executors, read-only and shared by the stage threads.
struct StageStepInputs {
  int64_t step = 0;  // StepFeeds::step
  double lr = 0;
  std::vector<std::map<ir::ValueId, ir::Tensor>> slices;  // by micro-batch: its rows of every data input
  std::vector<ir::Tensor> scales;                         // by micro-batch: its loss seed (its share of the loss)
  // Micro-batch m is micro-batch first_microbatch + m of the global batch, of `rows` rows: its dropout masks are
  // those rows of the full batch's.
  int32_t first_microbatch = 0;
  int64_t rows = 0;
  int64_t steps_done = 0;  // steps that succeeded before this one (graphs record in the second, replay after)
  std::chrono::steady_clock::time_point t0;  // the step's start, time 0 of the trace
};

// What a stage executor computed and measured in one step.
struct StageStepResult {
  std::vector<double> losses;       // by micro-batch, on the loss stage (NaN on the others)
  double grad_norm = std::nan("");  // on the stage computing the global norm
  StageMeasure measure;
  std::vector<TraceEvent> trace;
};

// A value's concrete dims (to receive it or allocate its buffer): an error naming it when a dim is symbolic.
absl::StatusOr<std::vector<int64_t>> ConcreteDims(const ir::Value& val);

class StageExecutor {
 public:
  // Plans stage `sp`'s memory layout for `in_flight` micro-batches of the `microbatches` in a step and allocates it,
  // with the stage's stream and step buffers. `all_reduced`: the post Sums of shared parameters' gradient
  // contributions run as all-reduces over their holders (partitioner::AllReducedSums), each group in the Sum's
  // operand order. `sp` and `options` must outlive the executor.
  static absl::StatusOr<std::unique_ptr<StageExecutor>> Create(StageProgram& sp, const ExecutorOptions& options,
                                                               int32_t microbatches, int64_t in_flight,
                                                               std::shared_ptr<const backend::Backend> backend,
                                                               std::map<ir::NodeId, std::vector<int>> all_reduced);
  ~StageExecutor();

  // Records the stage's work as graphs (ExecutorOptions::graphs): the buffers a replay reads the step offset from
  // and writes the micro-batch losses to.
  absl::Status EnableGraphs();
  // Before a step: the optimizer phase updates the states in place, so every state gets storage of its own (the
  // training graph's initializers, or tensors another holder or a caller shares, are copied); graphs recorded with
  // constants whose storage moved since are dropped (their kernels read the old storage).
  absl::Status PrepareStep();
  // Runs the stage's action list for one step, talking to the replica's other stages through `comm` (this stage's
  // endpoint). On an error the stage's parameters may be half-updated.
  absl::StatusOr<StageStepResult> Run(const partitioner::ActionList& list, const StageStepInputs& inputs,
                                      comm::Comm& comm);

  const StageLayout& layout() const { return *layout_; }
  backend::Stream* stream() const { return stream_.get(); }

 private:
  // Uses of each value by one micro-batch (node operands, pending sends, accumulation, the loss read): a value is
  // freed when its count reaches 0. data_uses leaves out the shape-only operands (memory_planner.h's
  // IsShapeOnlyOperand): once it reaches 0 only the value's dims are kept (ir::Tensor::DimsOnly), as the static
  // memory planner assumes.
  struct Uses {
    std::vector<int32_t> uses, data_uses;
  };
  static Uses CountUses(const StageProgram& sp);

  // What the stage keeps from step to step besides its arena: the step inputs on the backend (written each step)
  // and the optimizer phase's own outputs (PostSlots).
  struct StepBuffers {
    ir::Tensor lr, step;
    std::map<ir::ValueId, ir::Tensor> post;
    std::map<ir::ValueId, ir::Tensor> received;  // the optimizer phase's receives
  };

  // A run of nodes recorded as one graph: each node's outputs as the recording returned them (a replay writes the
  // same slots) and the arena's high-water marks after it.
  struct Segment {
    std::unique_ptr<backend::Graph> graph;
    bool eager = false;  // its recording failed: its nodes run one by one
    std::vector<std::vector<ir::Tensor>> outputs;
    StageArenaStats stats;
    int64_t scratch = 0;  // the optimizer phase's scratch bytes its outputs took (PostSlots)
  };
  struct StageGraphs {
    std::map<std::array<int32_t, 4>, Segment> segments;  // by (phase, micro-batch, backward part, index)
    bool post_eager = false;                             // an optimizer segment's recording failed
    bool warned = false;                                 // about a failed recording
    std::vector<const void*> constants;                  // the constants' addresses the segments hold
    ir::Tensor offset;                                   // the step, on the backend (device_offset)
    std::vector<ir::Tensor> losses;                      // per micro-batch, read after the stage's actions
  };

  // One micro-batch's values in the step, by value id, with the uses left of each.
  struct Table {
    bool live = false;
    bool forwarded = false;
    int64_t footprint = 0;  // bytes held at the end of the forward
    std::vector<ir::Tensor> values;
    std::vector<int32_t> remaining, data_remaining;
  };

  class PostSegments;

  StageExecutor(StageProgram& sp, const ExecutorOptions& options, int32_t microbatches,
                std::shared_ptr<const backend::Backend> backend, std::map<ir::NodeId, std::vector<int>> all_reduced,
                std::unique_ptr<StageLayout> layout, std::unique_ptr<backend::Stream> stream,
                std::unique_ptr<StageArena> arena);

  // stage_executor.cc: the step's bookkeeping, forward and backward.
  void BeginStep(const StageStepInputs& inputs, comm::Comm& comm);
  double Now() const;
  // Ends an action that began at Now() == `start`: traces it and returns its seconds.
  double Traced(double start, int32_t lane, std::string name, const char* category, int32_t m);
  backend::ExecContext Context(int32_t m) const;
  std::string Where(int32_t m, StepPhase ph) const;
  absl::StatusOr<Table*> Get(int32_t m);
  absl::Status Put(Table& t, int32_t m, ir::ValueId v, const ir::Tensor& x);
  const void* Planned(ir::ValueId v, int32_t m) const;
  void Release(Table& t, ir::ValueId v, bool shape_only = false);
  int64_t Footprint(const Table& t, int32_t m) const;
  void SampleInFlight();
  absl::Status Forward(int32_t m);
  absl::Status Backward(int32_t m, int32_t part);

  // stage_nodes.cc: running nodes, eagerly or as graphs.
  absl::StatusOr<std::vector<ir::Tensor>> Operands(const ir::Node& n, const std::vector<ir::Tensor>& values, int32_t m,
                                                   StepPhase ph) const;
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> EvalGroup(const std::vector<const ir::Node*>& nodes,
                                                                 const std::vector<ir::Tensor>& values, int32_t m,
                                                                 StepPhase ph);
  absl::StatusOr<std::vector<ir::Tensor>> Eval(ir::NodeId id, const std::vector<ir::Tensor>& values, int32_t m,
                                               StepPhase ph);
  absl::Status Checked(const ir::Node& n, std::vector<ir::Tensor>* out, int32_t m, StepPhase ph);
  absl::Status ReadLoss(const ir::Tensor& loss, int32_t m, bool replay);
  absl::Status Accumulate(Table& t, ir::ValueId v, int32_t m, bool issue);
  absl::Status RunMicrobatchNode(ir::NodeId id, int32_t m, StepPhase ph, Table& t, Segment* seg = nullptr,
                                 bool replay = false);
  absl::Status RunNodes(const std::vector<ir::NodeId>& ids, int32_t begin, int32_t end, int32_t m, StepPhase ph,
                        int32_t part, Table& t);
  absl::Status Capture(const std::vector<ir::NodeId>& ids, int32_t i, int32_t j, int32_t m, StepPhase ph, Table& t,
                       Segment& seg);
  void WarnRecordingFailed(const absl::Status& st);
  bool Sends(ir::NodeId id, StepPhase ph) const;

  // stage_comm.cc: the stage's transfers.
  absl::Status IssueHeldSends(const partitioner::Action& after);
  // The values of a run of RECV actions (partitioner::ReceiveRunEnd) for micro-batch m: per peer, its values.
  absl::Status Receive(int32_t m, const std::vector<std::pair<int32_t, std::vector<ir::ValueId>>>& from,
                       const char* phase);
  absl::Status Send(Table& t, int32_t m, StepPhase ph, int32_t peer, ir::ValueId v);
  absl::Status FlushSends(Table& t, int32_t m, StepPhase ph);
  absl::Status GradientReady(ir::ValueId v);
  absl::Status ReduceBucket();
  absl::StatusOr<std::vector<ir::Tensor>> AllReduceSum(ir::NodeId id, const std::vector<int>& group,
                                                       const std::vector<ir::Tensor>& pv);
  absl::Status SendPost(int32_t peer, ir::ValueId v, const ir::Tensor& x);
  absl::StatusOr<ir::Tensor> ReceivePost(int32_t peer, ir::ValueId v);

  // stage_post.cc: the optimizer phase.
  std::vector<const ir::Node*> UpdateGroup(size_t i, const std::vector<ir::Tensor>& pv) const;
  absl::Status Post();

  // Fixed at Create.
  StageProgram& sp_;
  const ExecutorOptions& options_;
  const int32_t microbatches_;
  const int32_t replicas_;  // data-parallel replicas (ExecutorOptions::topology)
  const std::shared_ptr<const backend::Backend> backend_;
  const backend::Backend& be_;
  std::unique_ptr<StageLayout> layout_;
  std::unique_ptr<backend::Stream> stream_;  // null on a backend without streams
  std::unique_ptr<StageArena> arena_;
  const Uses uses_;
  const std::map<ir::NodeId, std::vector<int>> all_reduced_;
  std::vector<std::vector<int32_t>> send_f_, send_b_;  // by value: the peers it goes to in the forward, backward
  std::vector<bool> accumulated_;                      // by value: a gradient accumulated over the micro-batches

  // Kept from step to step.
  StepBuffers buffers_;
  PostSlots post_slots_;
  std::unique_ptr<StageGraphs> graphs_;  // with ExecutorOptions::graphs

  // The step's, set by BeginStep.
  const StageStepInputs* inputs_ = nullptr;
  comm::Comm* comm_ = nullptr;
  StageStepResult result_;
  std::vector<Table> tables_;  // by micro-batch
  std::vector<int32_t> accumulated_count_;
  ir::Tensor lr_, step_;                                        // host scalars (on the backend: buffers_)
  std::set<ir::ValueId> host_step_inputs_;                      // step inputs the optimizer's kernels read on the host
  std::vector<std::pair<int32_t, ir::ValueId>> pending_sends_;  // (peer, value) sent after a segment
  std::vector<ir::ValueId> pending_ready_;  // gradients complete inside a segment: GradientReady after it
  std::vector<ir::ValueId> bucket_;         // complete gradients not yet all-reduced, in order
  int64_t bucket_bytes_ = 0;
  std::vector<bool> reduced_;  // by value: all-reduced over the replicas this step
  size_t replayed_ = 0;        // the next recorded outputs of the segment replaying
};

}  // namespace onnxpipe::pipeline
