// The stage executor's construction and its step: the action loop, the micro-batch tables (every value in its
// planned slot, freed after its last use) and the forward and backward actions. Why sends are eager (right after the
// producing node) and the SEND actions are no-ops here: a value leaves the stage as soon as it exists, which is what
// the memory plan assumes (its slot is reused right after) and what lets the receiver start early; the comm's
// stream-ordered Send lets the slot be overwritten by later work (the in-process transport stages a copy). A RECV
// action receives its values as one comm group straight into their planned slots. With NCCL the SEND action is where
// the stage would wait for its outstanding isends of the micro-batch.
#include "executor/pipeline/stage_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <utility>

#include "executor/comm/comm.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/align.h"
#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"
#include "partitioner/transfer_order.h"

namespace onnxpipe::pipeline {
namespace {

using partitioner::ActionKind;

bool IsCompute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kRecompute;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ConcreteDims(const ir::Value& val) {
  std::vector<int64_t> dims;
  for (const ir::Dim& d : val.shape) {
    if (!val.shape_known || !d.is_concrete()) {
      return FAILED_PRECONDITION() << "'" << val.name << "' has no concrete shape (" << ir::ShapeToString(val.shape)
                                   << ") to receive it into";
    }
    dims.push_back(d.value());
  }
  return dims;
}

StageExecutor::Uses StageExecutor::CountUses(const StageProgram& sp) {
  Uses u;
  u.uses.assign(sp.graph.num_values(), 0);
  u.data_uses.assign(sp.graph.num_values(), 0);
  for (const std::vector<ir::NodeId>* list : {&sp.forward, &sp.backward}) {
    for (ir::NodeId id : *list) {
      const ir::Node& n = sp.graph.node(id);
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ir::ValueId v = n.inputs[i];
        if (v == ir::kNoValue || sp.graph.value(v).constant) continue;
        ++u.uses[v];
        if (!partitioner::IsShapeOnlyOperand(n, static_cast<int>(i))) ++u.data_uses[v];
      }
    }
  }
  auto other_use = [&](ir::ValueId v) {
    ++u.uses[v];
    ++u.data_uses[v];
  };
  for (const partitioner::ValueLists* sends : {&sp.send_forward, &sp.send_backward})
    for (const auto& [peer, vs] : *sends)
      for (ir::ValueId v : vs) other_use(v);
  for (ir::ValueId v : sp.accumulate) other_use(v);
  if (sp.loss != ir::kNoValue) other_use(sp.loss);
  return u;
}

absl::StatusOr<std::unique_ptr<StageExecutor>> StageExecutor::Create(
    StageProgram& sp, const ExecutorOptions& options, int32_t microbatches, int64_t in_flight,
    std::shared_ptr<const backend::Backend> backend, std::map<ir::NodeId, std::vector<int>> all_reduced) {
  const partitioner::WorkspaceFn workspace = [be = backend](const ir::Graph& g, const ir::Node& n) {
    return be->WorkspaceBytes(g, n);
  };
  ASSIGN_OR_RETURN(StageLayout planned,
                   partitioner::PlanStageLayout(sp, in_flight, microbatches, /*alignment=*/64, workspace));
  auto layout = std::make_unique<StageLayout>(std::move(planned));
  std::unique_ptr<backend::Stream> stream = backend->CreateStream();
  ASSIGN_OR_RETURN(std::unique_ptr<StageArena> arena, StageArena::Create(*layout, sp.stage, *backend, stream.get()));
  std::unique_ptr<StageExecutor> stage(new StageExecutor(sp, options, microbatches, std::move(backend),
                                                         std::move(all_reduced), std::move(layout), std::move(stream),
                                                         std::move(arena)));
  ASSIGN_OR_RETURN(stage->buffers_.lr, stage->be_.Upload(ir::Tensor::Scalar<double>(0), stage->stream()));
  ASSIGN_OR_RETURN(stage->buffers_.step, stage->be_.Upload(ir::Tensor::Scalar<int64_t>(0), stage->stream()));
  return stage;
}

StageExecutor::StageExecutor(StageProgram& sp, const ExecutorOptions& options, int32_t microbatches,
                             std::shared_ptr<const backend::Backend> backend,
                             std::map<ir::NodeId, std::vector<int>> all_reduced, std::unique_ptr<StageLayout> layout,
                             std::unique_ptr<backend::Stream> stream, std::unique_ptr<StageArena> arena)
    : sp_(sp),
      options_(options),
      microbatches_(microbatches),
      replicas_(options.topology.replicas),
      backend_(std::move(backend)),
      be_(*backend_),
      layout_(std::move(layout)),
      stream_(std::move(stream)),
      arena_(std::move(arena)),
      uses_(CountUses(sp)),
      all_reduced_(std::move(all_reduced)),
      post_slots_(sp.graph, sp.state_updates, be_, stream_.get(), *arena_, buffers_.post) {
  send_f_.resize(sp.graph.num_values());
  send_b_.resize(sp.graph.num_values());
  for (const auto& [peer, vs] : sp.send_forward)
    for (ir::ValueId v : vs) send_f_[v].push_back(peer);
  for (const auto& [peer, vs] : sp.send_backward)
    for (ir::ValueId v : vs) send_b_[v].push_back(peer);
  accumulated_.assign(sp.graph.num_values(), false);
  for (ir::ValueId v : sp.accumulate) accumulated_[v] = true;
}

StageExecutor::~StageExecutor() = default;

absl::Status StageExecutor::EnableGraphs() {
  graphs_ = std::make_unique<StageGraphs>();
  ASSIGN_OR_RETURN(graphs_->offset, be_.Upload(ir::Tensor::Scalar<int64_t>(0), stream()));
  if (sp_.loss == ir::kNoValue) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::vector<int64_t> dims, ConcreteDims(sp_.graph.value(sp_.loss)));
  for (int32_t m = 0; m < microbatches_; ++m) {
    ASSIGN_OR_RETURN(ir::Tensor loss, be_.Zeros(sp_.graph.value(sp_.loss).dtype, dims, stream()));
    graphs_->losses.push_back(std::move(loss));
  }
  return absl::OkStatus();
}

absl::Status StageExecutor::PrepareStep() {
  for (const ir::Graph::StateUpdate& u : sp_.state_updates) {
    std::optional<ir::Tensor>& c = sp_.graph.value(u.state).constant;
    if (!c || c->SoleOwner()) continue;
    ASSIGN_OR_RETURN(*c, be_.Clone(*c, stream()));
  }
  if (graphs_ == nullptr) return absl::OkStatus();
  std::vector<const void*> at;
  for (ir::ValueId v = 0; v < sp_.graph.num_values(); ++v)
    if (sp_.graph.value(v).constant) at.push_back(sp_.graph.value(v).constant->address());
  if (at == graphs_->constants) return absl::OkStatus();
  graphs_->segments.clear();
  graphs_->constants = std::move(at);
  return absl::OkStatus();
}

void StageExecutor::BeginStep(const StageStepInputs& inputs, comm::Comm& comm) {
  inputs_ = &inputs;
  comm_ = &comm;
  const int32_t n = sp_.graph.num_values();
  result_ = StageStepResult();
  result_.losses.assign(microbatches_, std::nan(""));
  tables_.assign(microbatches_, Table());
  arena_->ResetStats();
  post_slots_.set_scratch_bytes(0);
  accumulated_count_.assign(n, 0);
  reduced_.assign(n, false);
  pending_sends_.clear();
  pending_ready_.clear();
  bucket_.clear();
  bucket_bytes_ = 0;
  replayed_ = 0;
  lr_ = ir::Tensor::Scalar<double>(inputs.lr);
  step_ = ir::Tensor::Scalar<int64_t>(inputs.step + 1);
  const std::vector<std::vector<ir::NodeId>> uses = sp_.graph.ComputeUses();
  // Under graphs the optimizer's kernels read lr and step on the backend: a replay sees each step's.
  host_step_inputs_.clear();
  for (ir::ValueId v : sp_.step_inputs)
    if (graphs_ == nullptr && backend::ReadOnlyOnHost(be_, sp_.graph, uses, v)) host_step_inputs_.insert(v);
}

absl::StatusOr<StageStepResult> StageExecutor::Run(const partitioner::ActionList& list, const StageStepInputs& inputs,
                                                   comm::Comm& comm) {
  BeginStep(inputs, comm);
  // The optimizer phase reads the step inputs where its kernels run.
  RETURN_IF_ERROR(be_.FromHost(lr_, buffers_.lr, stream_.get()));
  RETURN_IF_ERROR(be_.FromHost(step_, buffers_.step, stream_.get()));
  if (graphs_ != nullptr) {
    RETURN_IF_ERROR(be_.FromHost(ir::Tensor::Scalar<int64_t>(inputs_->step), graphs_->offset, stream_.get()));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const partitioner::Action& a = list[i];
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {  // with the RECVs right after it for the same micro-batch, as one group
        const bool forward = a.kind == ActionKind::kRecvActivation;
        const partitioner::ValueLists& lists = forward ? sp_.recv_forward : sp_.recv_backward;
        std::vector<std::pair<int32_t, std::vector<ir::ValueId>>> from;
        const size_t end = partitioner::ReceiveRunEnd(list, i);
        for (size_t j = i; j < end; ++j) {
          if (list[j].kind == a.kind) from.push_back({list[j].peer, lists.at(list[j].peer)});
        }
        RETURN_IF_ERROR(Receive(a.microbatch, from, forward ? "F" : "B"));
        i = end - 1;
        break;
      }
      case ActionKind::kForward:
        RETURN_IF_ERROR(Forward(a.microbatch));
        break;
      case ActionKind::kBackward:
      case ActionKind::kRecompute:
        RETURN_IF_ERROR(Backward(a.microbatch, a.part));
        break;
      case ActionKind::kSendActivation:
      case ActionKind::kSendGradient:
        break;  // sent eagerly by the compute action (see the file comment)
      case ActionKind::kOptimizerStep:
        RETURN_IF_ERROR(Post());
        break;
    }
    if (IsCompute(a.kind) && !partitioner::ReceivesNext(list, i)) RETURN_IF_ERROR(IssueHeldSends(a));
  }
  RETURN_IF_ERROR(IssueHeldSends(list.empty() ? partitioner::Action{} : list.back()));
  if (graphs_ != nullptr && sp_.loss != ir::kNoValue) {
    for (size_t m = 0; m < result_.losses.size(); ++m) {
      ASSIGN_OR_RETURN(const ir::Tensor loss, be_.ToHost(graphs_->losses[m], stream_.get()));
      result_.losses[m] = loss.GetAsDouble(0);
    }
  }
  const StageArenaStats& st = arena_->stats();
  result_.measure.arena_bytes = st.arena_high_water();
  result_.measure.transient_bytes = result_.measure.arena_bytes - result_.measure.activations_peak;
  result_.measure.accumulator_bytes = st.accumulator_high_water;
  result_.measure.workspace_bytes = st.workspace_high_water;
  result_.measure.bytes_sent = comm_->bytes_sent();
  result_.measure.bytes_received = comm_->bytes_received();
  return std::move(result_);
}

double StageExecutor::Now() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - inputs_->t0).count();
}

double StageExecutor::Traced(double start, int32_t lane, std::string name, const char* category, int32_t m) {
  const double end = Now();
  result_.trace.push_back({sp_.stage, lane, std::move(name), category, m, start, end - start});
  return (end - start) * 1e-6;
}

backend::ExecContext StageExecutor::Context(int32_t m) const {
  // The trainer's stream (offset = step) at the micro-batch's rows: masks are the full batch's.
  const int64_t rows = inputs_->rows;
  return backend::ExecContext{
      options_.dropout,
      options_.seed,
      static_cast<uint64_t>(inputs_->step),
      m >= 0 ? (inputs_->first_microbatch + m) * rows : 0,
      rows,
      stream_.get(),
      graphs_ != nullptr ? static_cast<const uint64_t*>(graphs_->offset.device_raw()) : nullptr};
}

std::string StageExecutor::Where(int32_t m, StepPhase ph) const {
  std::string s = "stage " + std::to_string(sp_.stage);
  if (m >= 0) s += ", micro-batch " + std::to_string(m);
  return s + ", " + StepPhaseName(ph);
}

// Micro-batch m's table; the first call takes its saved slot and copies its feeds in.
absl::StatusOr<StageExecutor::Table*> StageExecutor::Get(int32_t m) {
  Table& t = tables_[m];
  if (t.live) return &t;
  RETURN_IF_ERROR(arena_->Acquire(m));
  t.live = true;
  t.values.assign(sp_.graph.num_values(), ir::Tensor());
  t.remaining = uses_.uses;
  t.data_remaining = uses_.data_uses;
  for (ir::ValueId v : sp_.data_inputs) RETURN_IF_ERROR(Put(t, m, v, inputs_->slices[m].at(v)));
  for (ir::ValueId v : sp_.step_inputs)
    if (uses_.uses[v] > 0) RETURN_IF_ERROR(Put(t, m, v, sp_.graph.value(v).name == autodiff::kLrName ? lr_ : step_));
  if (sp_.loss_scale != ir::kNoValue) RETURN_IF_ERROR(Put(t, m, sp_.loss_scale, inputs_->scales[m]));
  return &t;
}

// Holds x as micro-batch m's value v, copied into v's planned slot unless it is already there.
absl::Status StageExecutor::Put(Table& t, int32_t m, ir::ValueId v, const ir::Tensor& x) {
  if (t.remaining[v] <= 0) return absl::OkStatus();  // nobody here reads it
  if (t.data_remaining[v] <= 0) {                    // only shape-only readers: keep the dims
    t.values[v] = ir::Tensor::DimsOnly(x.dtype(), x.dims());
    return absl::OkStatus();
  }
  if (x.address() != nullptr && x.address() == Planned(v, m)) {
    t.values[v] = x;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(ir::Tensor slot, arena_->Slot(v, m, x.dtype(), x.dims(), "value", /*zero=*/false));
  if (x.num_bytes() > 0)
    RETURN_IF_ERROR(x.on_host() ? be_.FromHost(x, slot, stream_.get()) : be_.Copy(x, slot, stream_.get()));
  t.values[v] = std::move(slot);
  return absl::OkStatus();
}

// Where micro-batch m's value v lives: its arena slot, or, for a view the plan makes of a constant (a parameter
// reshaped, say), the constant's storage; null when the plan gives it neither.
const void* StageExecutor::Planned(ir::ValueId v, int32_t m) const {
  if (const uint8_t* at = arena_->Address(v, m)) return at;
  const ir::ValueId root = arena_->layout().plan(m).values[v].buffer;
  return root != v && sp_.graph.value(root).constant ? sp_.graph.value(root).constant->address() : nullptr;
}

// One use of v is done; `shape_only`: the use read only its dims.
void StageExecutor::Release(Table& t, ir::ValueId v, bool shape_only) {
  const bool had_data = t.data_remaining[v] > 0;
  if (!shape_only) --t.data_remaining[v];
  const bool drop = --t.remaining[v] <= 0;
  if (!drop && !(had_data && t.data_remaining[v] <= 0)) return;
  t.values[v] = drop ? ir::Tensor() : ir::Tensor::DimsOnly(t.values[v].dtype(), t.values[v].dims());
}

// The arena bytes micro-batch m holds (distinct buffers, aligned as planned).
int64_t StageExecutor::Footprint(const Table& t, int32_t m) const {
  const partitioner::MemoryPlan& plan = arena_->layout().plan(m);
  std::set<ir::ValueId> buffers;
  int64_t bytes = 0;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(t.values.size()); ++v) {
    const partitioner::ValueMemory& vm = plan.values[v];
    if (!t.values[v].has_data() || vm.region != partitioner::MemoryRegion::kArena) continue;
    if (buffers.insert(vm.buffer).second) bytes += ir::AlignUp(plan.values[vm.buffer].bytes);
  }
  return bytes;
}

// Bytes held by the micro-batches forwarded and not yet backwarded, sampled when a forward ends
// (before any of them has received its backward inputs): the stage's activations.
void StageExecutor::SampleInFlight() {
  int64_t bytes = 0;
  int32_t n = 0;
  for (const Table& t : tables_) {
    if (t.live && t.forwarded) {
      bytes += t.footprint;
      ++n;
    }
  }
  result_.measure.activations_peak = std::max(result_.measure.activations_peak, bytes);
  result_.measure.max_in_flight = std::max(result_.measure.max_in_flight, n);
}

absl::Status StageExecutor::Forward(int32_t m) {
  ASSIGN_OR_RETURN(Table * tp, Get(m));
  Table& t = *tp;
  const double start = Now();
  RETURN_IF_ERROR(RunNodes(sp_.forward, 0, static_cast<int32_t>(sp_.forward.size()), m, StepPhase::kForward, -1, t));
  if (sp_.loss != ir::kNoValue) Release(t, sp_.loss);
  t.forwarded = true;
  t.footprint = Footprint(t, m);
  result_.measure.saved_bytes = std::max(result_.measure.saved_bytes, t.footprint);
  ++result_.measure.microbatches_forwarded;
  SampleInFlight();
  result_.measure.forward_s += Traced(start, 0, "F" + std::to_string(m), "forward", m);
  return absl::OkStatus();
}

// One part of micro-batch m's backward: a run of backward nodes or a recompute region. After the
// last part the micro-batch is done: every gradient accumulated, every value released.
absl::Status StageExecutor::Backward(int32_t m, int32_t part) {
  ASSIGN_OR_RETURN(Table * tp, Get(m));
  Table& t = *tp;
  if (part < 0 || part >= static_cast<int32_t>(sp_.parts.size())) {
    return absl::InternalError(Where(m, StepPhase::kBackward) + ": no backward part " + std::to_string(part));
  }
  const partitioner::BackwardPart& p = sp_.parts[part];
  const bool recompute = p.kind == ActionKind::kRecompute;
  const double start = Now();
  RETURN_IF_ERROR(RunNodes(sp_.backward, p.begin, p.end, m, StepPhase::kBackward, part, t));
  const double seconds =
      Traced(start, 0, (recompute ? "R" : "B") + std::to_string(m), recompute ? "recompute" : "backward", m);
  result_.measure.backward_s += seconds;
  if (recompute) result_.measure.recompute_s += seconds;
  if (part + 1 < static_cast<int32_t>(sp_.parts.size())) return absl::OkStatus();
  for (ir::ValueId v : sp_.accumulate) {
    if (accumulated_count_[v] != m + 1) {
      return absl::InternalError(Where(m, StepPhase::kBackward) + ": gradient '" + sp_.graph.value(v).name +
                                 "' was not computed");
    }
  }
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(t.values.size()); ++v) {
    if (t.values[v].defined()) {
      return absl::InternalError(Where(m, StepPhase::kBackward) + ": value '" + sp_.graph.value(v).name +
                                 "' is still held after the backward (a pipeline program bug)");
    }
  }
  t = Table();
  arena_->Release(m);
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
