// The driver. It interprets the compiled plan: every node, transfer, accumulation and action comes
// from the stage programs and action lists the partitioner built. Each stage thread owns its
// StageProgram (graph with its parameters), its StageArena
// (every micro-batch value and accumulator in its planned slot) and its micro-batch tables; threads
// share nothing but the read-only feeds and the comm group, so the only synchronisation is the
// comm's. Why sends are eager (right after the producing node) and the SEND actions are no-ops
// here: a value leaves the stage as soon as it exists, which is what the memory plan assumes (its
// slot is reused right after) and what lets the receiver start early; the comm's stream-ordered
// Send lets the slot be overwritten by later work (the in-process transport stages a copy). A RECV
// action receives its values as one comm group straight into their planned slots. With NCCL the
// SEND action is where the stage would wait for its outstanding isends of the micro-batch.
#include "executor/pipeline/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>

#include "executor/comm/inprocess_comm.h"
#include "executor/pipeline/executor_parts.h"
#include "executor/pipeline/post_slots.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/align.h"
#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"
#include "partitioner/transfer_order.h"

namespace onnxpipe::pipeline {
namespace {

using partitioner::ActionKind;

using Clock = std::chrono::steady_clock;

constexpr uint64_t kTagMicrobatch = 0, kTagPost = 1;

uint64_t Tag(int64_t step, uint64_t kind, int32_t m, ir::ValueId v) {
  return (static_cast<uint64_t>(step & 0xFFFF) << 48) | (kind << 44) | (static_cast<uint64_t>(m & 0xFFF) << 32) |
         static_cast<uint32_t>(v);
}

// A comm failure annotated with what was being done; a peer's abort passes as it is (the root cause is the peer's).
absl::Status CommError(const absl::Status& st, const std::string& what) {
  return st.ok() || comm::IsAbortedByPeer(st) ? st : Annotate(st, what);
}

// f(), a thrown exception becoming an Internal error (a kernel or a hook that throws fails its node).
template <typename F>
auto Guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("exception: ") + e.what());
  } catch (...) {
    return absl::InternalError("unknown exception");
  }
}

}  // namespace

const char* StepPhaseName(StepPhase p) { return std::array{"forward", "backward", "optimizer"}[static_cast<int>(p)]; }

// One stage's work for one step.
class PipelineExecutor::StageRun {
 public:
  StageRun(PipelineExecutor& ex, StageProgram& sp, StageArena& arena, backend::Stream* stream, comm::Comm& comm,
           const StepFeeds& feeds, const std::vector<std::map<ir::ValueId, ir::Tensor>>& slices,
           const std::vector<ir::Tensor>& scales, Clock::time_point t0)
      : ex_(ex),
        be_(*ex.backend_),
        stream_(stream),
        sp_(sp),
        uses_(ex.uses_[sp.stage]),
        arena_(arena),
        buffers_(*ex.buffers_[sp.stage]),
        post_slots_(sp.graph, sp.state_updates, *ex.backend_, stream, arena, buffers_.post),
        comm_(comm),
        feeds_(feeds),
        slices_(slices),
        scales_(scales),
        t0_(t0),
        graphs_(ex.graphs_.empty() ? nullptr : ex.graphs_[sp.stage].get()) {
    const int32_t M = ex.microbatches_;
    tables_.resize(M);
    losses.assign(M, std::nan(""));
    arena_.ResetStats();
    send_f_.resize(sp.graph.num_values());
    send_b_.resize(sp.graph.num_values());
    for (const auto& [peer, vs] : sp.send_forward)
      for (ir::ValueId v : vs) send_f_[v].push_back(peer);
    for (const auto& [peer, vs] : sp.send_backward)
      for (ir::ValueId v : vs) send_b_[v].push_back(peer);
    accumulated_.assign(sp.graph.num_values(), false);
    accumulated_count_.assign(sp.graph.num_values(), 0);
    for (ir::ValueId v : sp.accumulate) accumulated_[v] = true;
    reduced_.assign(sp.graph.num_values(), false);
    lr_ = ir::Tensor::Scalar<double>(feeds.lr);
    step_ = ir::Tensor::Scalar<int64_t>(feeds.step + 1);
    const std::vector<std::vector<ir::NodeId>> uses = sp.graph.ComputeUses();
    // Under graphs the optimizer's kernels read lr and step on the backend: a replay sees each step's.
    for (ir::ValueId v : sp.step_inputs)
      if (graphs_ == nullptr && backend::ReadOnlyOnHost(be_, sp.graph, uses, v)) host_step_inputs_.insert(v);
  }

  absl::Status Run(const partitioner::ActionList& list) {
    // The optimizer phase reads the step inputs where its kernels run.
    RETURN_IF_ERROR(be_.FromHost(lr_, buffers_.lr, stream_));
    RETURN_IF_ERROR(be_.FromHost(step_, buffers_.step, stream_));
    if (graphs_ != nullptr) {
      RETURN_IF_ERROR(be_.FromHost(ir::Tensor::Scalar<int64_t>(feeds_.step), graphs_->offset, stream_));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const partitioner::Action& a = list[i];
      switch (a.kind) {
        case ActionKind::kRecvActivation:
          RETURN_IF_ERROR(Receive(a.microbatch, a.peer, sp_.recv_forward.at(a.peer), "F"));
          break;
        case ActionKind::kRecvGradient:
          RETURN_IF_ERROR(Receive(a.microbatch, a.peer, sp_.recv_backward.at(a.peer), "B"));
          break;
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
      for (size_t m = 0; m < losses.size(); ++m) {
        ASSIGN_OR_RETURN(const ir::Tensor loss, be_.ToHost(graphs_->losses[m], stream_));
        losses[m] = loss.GetAsDouble(0);
      }
    }
    const StageArenaStats& st = arena_.stats();
    measure.arena_bytes = st.arena_high_water();
    measure.transient_bytes = measure.arena_bytes - measure.activations_peak;
    measure.accumulator_bytes = st.accumulator_high_water;
    measure.workspace_bytes = st.workspace_high_water;
    measure.bytes_sent = comm_.bytes_sent();
    measure.bytes_received = comm_.bytes_received();
    return absl::OkStatus();
  }

  std::vector<double> losses;
  double grad_norm = std::nan("");

 private:
  static bool IsCompute(ActionKind k) {
    return k == ActionKind::kForward || k == ActionKind::kBackward || k == ActionKind::kRecompute;
  }
  // Issues the sends a holding comm keeps, at the end of `after` (a no-op for a comm that sends at once).
  absl::Status IssueHeldSends(const partitioner::Action& after) {
    return CommError(comm_.Flush(), "stage " + std::to_string(sp_.stage) + ": sending after " +
                                        partitioner::ActionToString(after));
  }

 public:
  StageMeasure measure;
  std::vector<TraceEvent> trace;

 private:
  struct Table {
    bool live = false;
    bool forwarded = false;
    int64_t footprint = 0;  // bytes held at the end of the forward
    std::vector<ir::Tensor> values;
    std::vector<int32_t> remaining, data_remaining;
  };

  double Now() const { return std::chrono::duration<double, std::micro>(Clock::now() - t0_).count(); }
  // Ends an action that began at Now() == `start`: traces it and returns its seconds.
  double Traced(double start, int32_t lane, std::string name, const char* category, int32_t m) {
    const double end = Now();
    trace.push_back({sp_.stage, lane, std::move(name), category, m, start, end - start});
    return (end - start) * 1e-6;
  }
  backend::ExecContext Context(int32_t m) const {
    // The trainer's stream (offset = step) at the micro-batch's rows: masks are the full batch's.
    const int64_t rows = ex_.microbatch_size_;
    return backend::ExecContext{
        ex_.options_.dropout,
        ex_.options_.seed,
        static_cast<uint64_t>(feeds_.step),
        m >= 0 ? (ex_.options_.topology.replica() * ex_.microbatches_ + m) * rows : 0,
        rows,
        stream_,
        graphs_ != nullptr ? static_cast<const uint64_t*>(graphs_->offset.device_raw()) : nullptr};
  }
  std::string Where(int32_t m, StepPhase ph) const {
    std::string s = "stage " + std::to_string(sp_.stage);
    if (m >= 0) s += ", micro-batch " + std::to_string(m);
    return s + ", " + StepPhaseName(ph);
  }

  // Micro-batch m's table; the first call takes its saved slot and copies its feeds in.
  absl::StatusOr<Table*> Get(int32_t m) {
    Table& t = tables_[m];
    if (t.live) return &t;
    RETURN_IF_ERROR(arena_.Acquire(m));
    t.live = true;
    t.values.assign(sp_.graph.num_values(), ir::Tensor());
    t.remaining = uses_.uses;
    t.data_remaining = uses_.data_uses;
    for (ir::ValueId v : sp_.data_inputs) RETURN_IF_ERROR(Put(t, m, v, slices_[m].at(v)));
    for (ir::ValueId v : sp_.step_inputs)
      if (uses_.uses[v] > 0) RETURN_IF_ERROR(Put(t, m, v, sp_.graph.value(v).name == autodiff::kLrName ? lr_ : step_));
    if (sp_.loss_scale != ir::kNoValue) RETURN_IF_ERROR(Put(t, m, sp_.loss_scale, scales_[m]));
    return &t;
  }
  // Holds x as micro-batch m's value v, copied into v's planned slot unless it is already there.
  absl::Status Put(Table& t, int32_t m, ir::ValueId v, const ir::Tensor& x) {
    if (t.remaining[v] <= 0) return absl::OkStatus();  // nobody here reads it
    if (t.data_remaining[v] <= 0) {                    // only shape-only readers: keep the dims
      t.values[v] = ir::Tensor::DimsOnly(x.dtype(), x.dims());
      return absl::OkStatus();
    }
    if (x.address() != nullptr && x.address() == Planned(v, m)) {
      t.values[v] = x;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(ir::Tensor slot, arena_.Slot(v, m, x.dtype(), x.dims(), "value", /*zero=*/false));
    if (x.num_bytes() > 0) RETURN_IF_ERROR(x.on_host() ? be_.FromHost(x, slot, stream_) : be_.Copy(x, slot, stream_));
    t.values[v] = std::move(slot);
    return absl::OkStatus();
  }
  // Where micro-batch m's value v lives: its arena slot, or, for a view the plan makes of a constant (a parameter
  // reshaped, say), the constant's storage; null when the plan gives it neither.
  const void* Planned(ir::ValueId v, int32_t m) const {
    if (const uint8_t* at = arena_.Address(v, m)) return at;
    const ir::ValueId root = arena_.layout().plan(m).values[v].buffer;
    return root != v && sp_.graph.value(root).constant ? sp_.graph.value(root).constant->address() : nullptr;
  }
  // One use of v is done; `shape_only`: the use read only its dims.
  void Release(Table& t, ir::ValueId v, bool shape_only = false) {
    const bool had_data = t.data_remaining[v] > 0;
    if (!shape_only) --t.data_remaining[v];
    const bool drop = --t.remaining[v] <= 0;
    if (!drop && !(had_data && t.data_remaining[v] <= 0)) return;
    t.values[v] = drop ? ir::Tensor() : ir::Tensor::DimsOnly(t.values[v].dtype(), t.values[v].dims());
  }
  // The arena bytes micro-batch m holds (distinct buffers, aligned as planned).
  int64_t Footprint(const Table& t, int32_t m) const {
    const partitioner::MemoryPlan& plan = arena_.layout().plan(m);
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
  void SampleInFlight() {
    int64_t bytes = 0;
    int32_t n = 0;
    for (const Table& t : tables_) {
      if (t.live && t.forwarded) {
        bytes += t.footprint;
        ++n;
      }
    }
    measure.activations_peak = std::max(measure.activations_peak, bytes);
    measure.max_in_flight = std::max(measure.max_in_flight, n);
  }

  // The values of one RECV action, received as one group straight into their planned slots. A value
  // the plan gives no slot (one only read for its dims) lands in a buffer of its own.
  absl::Status Receive(int32_t m, int32_t peer, const std::vector<ir::ValueId>& values, const char* phase) {
    ASSIGN_OR_RETURN(Table * tp, Get(m));
    Table& t = *tp;
    const double start = Now();
    const std::string where = "stage " + std::to_string(sp_.stage) + ", micro-batch " + std::to_string(m);
    std::vector<ir::Tensor> into;
    for (ir::ValueId v : values) {
      const ir::Value& val = sp_.graph.value(v);
      ASSIGN_OR_RETURN(const std::vector<int64_t> dims, ConcreteDims(val));
      absl::StatusOr<ir::Tensor> buffer = arena_.Address(v, m) != nullptr
                                              ? arena_.Slot(v, m, val.dtype, dims, "received value", /*zero=*/false)
                                              : be_.Zeros(val.dtype, dims, stream_);
      if (!buffer.ok()) return Annotate(buffer.status(), where + ": receiving '" + val.name + "'");
      into.push_back(*std::move(buffer));
    }
    absl::Status st = comm_.GroupStart();
    for (size_t i = 0; i < values.size() && st.ok(); ++i) {
      st = comm_.Recv(peer, Tag(feeds_.step, kTagMicrobatch, m, values[i]), into[i], stream_);
    }
    if (absl::Status end = comm_.GroupEnd(); st.ok()) st = end;
    if (!st.ok()) {
      std::string names;
      for (ir::ValueId v : values) names += (names.empty() ? "'" : ", '") + sp_.graph.value(v).name + "'";
      return CommError(st, where + ": receiving " + names + " from stage " + std::to_string(peer));
    }
    for (size_t i = 0; i < values.size(); ++i) RETURN_IF_ERROR(Put(t, m, values[i], into[i]));
    measure.recv_wait_s +=
        Traced(start, 1, std::string("recv ") + phase + std::to_string(m) + " from " + std::to_string(peer), "recv", m);
    return absl::OkStatus();
  }

  // Node n's operands from `values` (constants from the graph: on the backend since Create).
  absl::StatusOr<std::vector<ir::Tensor>> Operands(const ir::Node& n, const std::vector<ir::Tensor>& values, int32_t m,
                                                   StepPhase ph) const {
    std::vector<ir::Tensor> operands;
    operands.reserve(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ir::ValueId v = n.inputs[i];
      if (v == ir::kNoValue) {
        operands.emplace_back();
      } else if (sp_.graph.value(v).constant) {
        operands.push_back(*sp_.graph.value(v).constant);
      } else {
        if (!values[v].defined() ||
            (!values[v].has_data() && !partitioner::IsShapeOnlyOperand(n, static_cast<int>(i)))) {
          return absl::InternalError(Where(m, ph) + " " + ir::NodeLabel(n) + ": operand '" + sp_.graph.value(v).name +
                                     "' is not available (a pipeline program bug)");
        }
        operands.push_back(values[v]);
      }
    }
    return operands;
  }

  // Runs `nodes` (independent of each other) with their operands on the backend, as one group
  // (Backend::RunGroup); then, per node, the hook, the output count and the numerics check.
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> EvalGroup(const std::vector<const ir::Node*>& nodes,
                                                                 const std::vector<ir::Tensor>& values, int32_t m,
                                                                 StepPhase ph) {
    std::vector<std::vector<ir::Tensor>> operands;
    for (const ir::Node* n : nodes) {
      ASSIGN_OR_RETURN(std::vector<ir::Tensor> o, Operands(*n, values, m, ph));
      operands.push_back(std::move(o));
    }
    arena_.Select(m);
    ir::OutputAllocator* slots = m < 0 ? static_cast<ir::OutputAllocator*>(&post_slots_) : &arena_;
    const backend::ExecContext ctx = Context(m < 0 ? 0 : m);
    absl::StatusOr<std::vector<std::vector<ir::Tensor>>> out = Guarded([&]() {
      if (nodes.size() > 1) return ex_.backend_->RunGroup(nodes, operands, ctx, slots);
      absl::StatusOr<std::vector<ir::Tensor>> one = ex_.backend_->Run(*nodes[0], operands[0], ctx, slots);
      if (!one.ok()) return absl::StatusOr<std::vector<std::vector<ir::Tensor>>>(one.status());
      return absl::StatusOr<std::vector<std::vector<ir::Tensor>>>(
          std::vector<std::vector<ir::Tensor>>{*std::move(one)});
    });
    // (The context strings are made only on an error: this runs for every node of every step.)
    if (!out.ok()) {
      return Annotate(out.status(), Where(m, ph) + (nodes.size() == 1 ? " " + ir::NodeLabel(*nodes[0]) : ""));
    }
    for (size_t i = 0; i < nodes.size(); ++i) RETURN_IF_ERROR(Checked(*nodes[i], &(*out)[i], m, ph));
    return out;
  }

  // Runs node `id` of the stage graph with operands from `values`; returns its outputs.
  absl::StatusOr<std::vector<ir::Tensor>> Eval(ir::NodeId id, const std::vector<ir::Tensor>& values, int32_t m,
                                               StepPhase ph) {
    ASSIGN_OR_RETURN(std::vector<std::vector<ir::Tensor>> out, EvalGroup({&sp_.graph.node(id)}, values, m, ph));
    return std::move(out[0]);
  }

  // After node n ran: the node hook, then the checks of its outputs.
  absl::Status Checked(const ir::Node& n, std::vector<ir::Tensor>* out, int32_t m, StepPhase ph) {
    auto where = [&] { return Where(m, ph) + " " + ir::NodeLabel(n); };
    if (ex_.options_.node_hook) {
      const absl::Status st = Guarded([&] { return ex_.options_.node_hook(NodeEvent{sp_.stage, m, ph, &n}, out); });
      if (!st.ok()) return Annotate(st, where());
    }
    if (out->size() < n.outputs.size()) return absl::InternalError(where() + ": the backend returned too few outputs");
    if (!ex_.options_.check_numerics) return absl::OkStatus();
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.outputs[k] == ir::kNoValue || !(*out)[k].has_data()) continue;
      ASSIGN_OR_RETURN(const bool finite, be_.AllFinite((*out)[k], stream_));
      if (!finite) {
        return FAILED_PRECONDITION() << where() << " produced a non-finite value in output '"
                                     << sp_.graph.value(n.outputs[k]).name << "'";
      }
    }
    return absl::OkStatus();
  }

  // Runs node `id` of micro-batch m: evaluates it (or, `replay`, takes the outputs `seg` recorded:
  // its graph has been launched), holds its outputs, reads the loss, accumulates, sends (deferred to
  // FlushSends inside a segment) and releases its operands.
  absl::Status RunMicrobatchNode(ir::NodeId id, int32_t m, StepPhase ph, Table& t, Segment* seg = nullptr,
                                 bool replay = false) {
    std::vector<ir::Tensor> out;
    if (replay) {
      out = seg->outputs.at(replayed_++);
    } else {
      ASSIGN_OR_RETURN(out, Eval(id, t.values, m, ph));
      if (seg != nullptr) {  // addresses only: a view of a parameter must not keep its storage shared
        std::vector<ir::Tensor>& kept = seg->outputs.emplace_back();
        for (const ir::Tensor& o : out) kept.push_back(backend::Unowned(o));
      }
    }
    const ir::Node& n = sp_.graph.node(id);
    const auto& sends = ph == StepPhase::kForward ? send_f_ : send_b_;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const ir::ValueId v = n.outputs[k];
      if (v == ir::kNoValue) continue;
      // Where the plan puts v: its own slot, or its buffer owner's (a view).
      const void* want = Planned(v, m);
      if (out[k].num_bytes() > 0 && (want == nullptr || out[k].address() != want)) {
        return absl::InternalError(
            Where(m, ph) + " " + ir::NodeLabel(n) + " returned output '" + sp_.graph.value(v).name +
            "' outside its planned slot: its kernel must take outputs from AllocOutput/ViewOutput");
      }
      RETURN_IF_ERROR(Put(t, m, v, out[k]));
      if (v == sp_.loss) RETURN_IF_ERROR(ReadLoss(out[k], m, replay));  // its slot is reused right after
      if (accumulated_[v]) {
        RETURN_IF_ERROR(Accumulate(t, v, m, /*issue=*/!replay));
        if (accumulated_count_[v] == ex_.microbatches_ && replicas_ > 1) {
          if (seg != nullptr) {
            pending_ready_.push_back(v);
          } else {
            RETURN_IF_ERROR(GradientReady(v));
          }
        }
      }
      for (int32_t peer : sends[v]) {
        if (seg != nullptr) {
          pending_sends_.emplace_back(peer, v);
          continue;
        }
        RETURN_IF_ERROR(Send(t, m, ph, peer, v));
      }
    }
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ir::ValueId v = n.inputs[i];
      if (v != ir::kNoValue && !sp_.graph.value(v).constant) {
        Release(t, v, partitioner::IsShapeOnlyOperand(n, static_cast<int>(i)));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Send(Table& t, int32_t m, StepPhase ph, int32_t peer, ir::ValueId v) {
    const absl::Status st = comm_.Send(peer, Tag(feeds_.step, kTagMicrobatch, m, v), t.values[v], stream_);
    RETURN_IF_ERROR(CommError(st, Where(m, ph) + " sending '" + sp_.graph.value(v).name + "'"));
    Release(t, v);
    return absl::OkStatus();
  }
  absl::Status FlushSends(Table& t, int32_t m, StepPhase ph) {
    std::vector<std::pair<int32_t, ir::ValueId>> pending;
    pending.swap(pending_sends_);
    for (const auto& [peer, v] : pending) RETURN_IF_ERROR(Send(t, m, ph, peer, v));
    std::vector<ir::ValueId> ready;
    ready.swap(pending_ready_);
    for (ir::ValueId v : ready) RETURN_IF_ERROR(GradientReady(v));
    return absl::OkStatus();
  }

  // Data parallelism, DDP's reducer: a gradient whose last micro-batch is accumulated joins the open bucket, and a
  // bucket of ExecutorOptions::dp_bucket_bytes is all-reduced over the replicas at once, while the backward goes on
  // (a comm on its own stream overlaps it with the remaining kernels). Every replica runs the same program, so the
  // buckets and their order are the same on all of them; the sum is the comm's, in replica order, whenever it runs.
  absl::Status GradientReady(ir::ValueId v) {
    bucket_.push_back(v);
    bucket_bytes_ += arena_.Accumulator(v).num_bytes();
    if (bucket_bytes_ < ex_.options_.dp_bucket_bytes) return absl::OkStatus();
    ++measure.dp_buckets_in_backward;
    return ReduceBucket();
  }
  absl::Status ReduceBucket() {
    const std::vector<int> group = ex_.options_.topology.DataParallelGroup();
    for (ir::ValueId v : bucket_) {
      RETURN_IF_ERROR(CommError(ex_.options_.world->AllReduce(arena_.Accumulator(v), group, stream_),
                                Where(-1, StepPhase::kBackward) + " all-reducing '" + sp_.graph.value(v).name +
                                    "' over the data-parallel replicas"));
      reduced_[v] = true;
    }
    bucket_.clear();
    bucket_bytes_ = 0;
    return absl::OkStatus();
  }
  // Micro-batch m's loss: to the host now, or (graphs) copied to its buffer, read after the actions.
  absl::Status ReadLoss(const ir::Tensor& loss, int32_t m, bool replay) {
    if (graphs_ != nullptr) return replay ? absl::OkStatus() : be_.Copy(loss, graphs_->losses[m], stream_);
    ASSIGN_OR_RETURN(const ir::Tensor host, be_.ToHost(loss, stream_));
    losses[m] = host.GetAsDouble(0);
    return absl::OkStatus();
  }

  // Runs nodes [begin, end) of `ids` for micro-batch m (its forward, or backward part `part`):
  // one by one, or (graphs, after the first step) as segments: the nodes up to one whose outputs
  // are sent or up to a node the backend cannot capture, recorded once and then replayed.
  absl::Status RunNodes(const std::vector<ir::NodeId>& ids, int32_t begin, int32_t end, int32_t m, StepPhase ph,
                        int32_t part, Table& t) {
    const bool segments = graphs_ != nullptr && ex_.steps_done_ > 0;
    int32_t index = 0;
    for (int32_t i = begin; i < end;) {
      if (!segments || !be_.Capturable(sp_.graph.node(ids[i]))) {
        RETURN_IF_ERROR(RunMicrobatchNode(ids[i], m, ph, t));
        ++i;
        continue;
      }
      int32_t j = i + 1;
      while (j < end && !Sends(ids[j - 1], ph) && be_.Capturable(sp_.graph.node(ids[j]))) ++j;
      Segment& seg = graphs_->segments[{static_cast<int32_t>(ph), m, part, index++}];
      if (seg.eager) {
        for (int32_t k = i; k < j; ++k) RETURN_IF_ERROR(RunMicrobatchNode(ids[k], m, ph, t));
      } else if (seg.graph != nullptr) {
        RETURN_IF_ERROR(Annotate(seg.graph->Launch(stream_), Where(m, ph) + ": launching a graph"));
        replayed_ = 0;
        for (int32_t k = i; k < j; ++k) RETURN_IF_ERROR(RunMicrobatchNode(ids[k], m, ph, t, &seg, /*replay=*/true));
        ++measure.graph_launches;
        measure.replayed_nodes += j - i;
        arena_.MergeStats(seg.stats);
      } else {
        // A failed recording ran nothing: the bookkeeping goes back to before it and the nodes run one by one, now
        // and in the next steps.
        const Table before = t;
        const std::vector<int32_t> counts = accumulated_count_;
        const StageArenaStats stats = arena_.stats();
        if (absl::Status st = Capture(ids, i, j, m, ph, t, seg); !st.ok()) {
          t = before;
          accumulated_count_ = counts;
          arena_.ResetStats();
          arena_.MergeStats(stats);
          pending_sends_.clear();
          pending_ready_.clear();
          seg = Segment();
          seg.eager = true;
          WarnRecordingFailed(st);
          for (int32_t k = i; k < j; ++k) RETURN_IF_ERROR(RunMicrobatchNode(ids[k], m, ph, t));
        }
      }
      RETURN_IF_ERROR(FlushSends(t, m, ph));
      i = j;
    }
    return absl::OkStatus();
  }
  // Once per stage: the nodes of a recording that failed run eagerly (slower, as correct).
  void WarnRecordingFailed(const absl::Status& st) {
    ++measure.failed_recordings;
    if (std::exchange(graphs_->warned, true)) return;
    std::fprintf(stderr, "onnxpipe: warning: %s; those nodes run without a graph (said once per stage)\n",
                 std::string(st.message()).c_str());
  }
  // True when node `id`'s outputs leave the stage in phase `ph`.
  bool Sends(ir::NodeId id, StepPhase ph) const {
    const auto& sends = ph == StepPhase::kForward ? send_f_ : send_b_;
    for (ir::ValueId v : sp_.graph.node(id).outputs)
      if (v != ir::kNoValue && !sends[v].empty()) return true;
    return false;
  }
  // Records nodes [i, j) of `ids` into `seg` (and so runs them once).
  absl::Status Capture(const std::vector<ir::NodeId>& ids, int32_t i, int32_t j, int32_t m, StepPhase ph, Table& t,
                       Segment& seg) {
    const std::string what = Where(m, ph) + ": recording " + ir::NodeLabel(sp_.graph.node(ids[i])) + " to " +
                             ir::NodeLabel(sp_.graph.node(ids[j - 1])) + " as a graph failed";
    RETURN_IF_ERROR(Annotate(stream_->BeginCapture(), what));
    seg = Segment();
    absl::Status st = absl::OkStatus();
    for (int32_t k = i; k < j && st.ok(); ++k) st = RunMicrobatchNode(ids[k], m, ph, t, &seg);
    if (!st.ok()) {  // EndCapture would run the nodes recorded before the failure: they run again eagerly
      (void)stream_->AbortCapture();
      return Annotate(st, what);
    }
    absl::StatusOr<std::unique_ptr<backend::Graph>> graph = stream_->EndCapture();
    if (!graph.ok()) return Annotate(graph.status(), what);
    seg.graph = *std::move(graph);
    seg.stats = arena_.stats();
    return absl::OkStatus();
  }

  // Adds micro-batch m's value of v into its accumulator as soon as it is made, in micro-batch
  // order: acc = ((g0 + g1) + g2) + ... . Micro-batch 0's kernel wrote g0 into the accumulator
  // itself (the layout's plan `first`); later ones wrote into the transient region.
  // `issue`: false when a replayed graph has done the addition.
  absl::Status Accumulate(Table& t, ir::ValueId v, int32_t m, bool issue) {
    const ir::Tensor& g = t.values[v];
    if (!g.has_data())
      return absl::InternalError(Where(m, StepPhase::kBackward) + ": gradient '" + sp_.graph.value(v).name +
                                 "' is not held");
    if (m > 0 && issue) {
      absl::Status st = be_.Accumulate(arena_.Accumulator(v), g, stream_);
      if (!st.ok())
        return Annotate(st, Where(m, StepPhase::kBackward) + " accumulating '" + sp_.graph.value(v).name + "'");
    }
    ++accumulated_count_[v];
    Release(t, v);
    return absl::OkStatus();
  }

  absl::Status Forward(int32_t m) {
    ASSIGN_OR_RETURN(Table * tp, Get(m));
    Table& t = *tp;
    const double start = Now();
    RETURN_IF_ERROR(RunNodes(sp_.forward, 0, static_cast<int32_t>(sp_.forward.size()), m, StepPhase::kForward, -1, t));
    if (sp_.loss != ir::kNoValue) Release(t, sp_.loss);
    t.forwarded = true;
    t.footprint = Footprint(t, m);
    measure.saved_bytes = std::max(measure.saved_bytes, t.footprint);
    ++measure.microbatches_forwarded;
    SampleInFlight();
    measure.forward_s += Traced(start, 0, "F" + std::to_string(m), "forward", m);
    return absl::OkStatus();
  }

  // One part of micro-batch m's backward: a run of backward nodes or a recompute region. After the
  // last part the micro-batch is done: every gradient accumulated, every value released.
  absl::Status Backward(int32_t m, int32_t part) {
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
    measure.backward_s += seconds;
    if (recompute) measure.recompute_s += seconds;
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
    arena_.Release(m);
    return absl::OkStatus();
  }

  // Post Sum `id` of a shared parameter's contributions as an all-reduce over `group` (its holders):
  // this stage's accumulated contribution becomes the sum in place and is the Sum's output.
  absl::StatusOr<std::vector<ir::Tensor>> AllReduceSum(ir::NodeId id, const std::vector<int>& group,
                                                       const std::vector<ir::Tensor>& pv) {
    const ir::Node& n = sp_.graph.node(id);
    const ir::Tensor& mine = pv[n.inputs[std::find(group.begin(), group.end(), sp_.stage) - group.begin()]];
    std::string stages;
    for (int s : group) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
    const std::string what = Where(-1, StepPhase::kPost) + " " + ir::NodeLabel(n) + ": all-reducing the gradient of '" +
                             n.origin + "' over stages {" + stages + "}";
    const double start = Now();
    const absl::Status st = comm_.AllReduce(mine, group, stream_);
    measure.recv_wait_s += Traced(start, 1, "all-reduce " + n.origin, "recv", -1);
    RETURN_IF_ERROR(CommError(st, what));
    if (ex_.options_.check_numerics) {
      ASSIGN_OR_RETURN(const bool finite, be_.AllFinite(mine, stream_));
      if (!finite) return FAILED_PRECONDITION() << what << " produced a non-finite value";
    }
    return std::vector<ir::Tensor>{mine};
  }

  // The optimizer updates (or the per-gradient sums of squares) of one op from post node i on,
  // consecutive and independent, whose operands are all at hand in `pv` (none to receive): run as one
  // group (Backend::RunGroup: one multi-tensor kernel on a GPU instead of one launch per parameter).
  std::vector<const ir::Node*> UpdateGroup(size_t i, const std::vector<ir::Tensor>& pv) const {
    std::vector<const ir::Node*> group;
    std::set<ir::ValueId> made;
    for (; i < sp_.post.size(); ++i) {
      const ir::Node& n = sp_.graph.node(sp_.post[i]);
      const bool groups = partitioner::IsUpdateOp(n.op) || n.op == ir::OpKind::kSumSquares;
      if (!groups || (!group.empty() && n.op != group[0]->op)) break;
      const bool ready = std::all_of(n.inputs.begin(), n.inputs.end(), [&](ir::ValueId v) {
        return v == ir::kNoValue || sp_.graph.value(v).constant || (pv[v].defined() && !made.count(v));
      });
      if (!ready) break;
      group.push_back(&n);
      made.insert(n.outputs.begin(), n.outputs.end());
    }
    return group;
  }

  absl::Status Post() {
    const double start = Now();
    ir::Graph& sg = sp_.graph;
    std::vector<ir::Tensor> pv(sg.num_values());
    for (ir::ValueId v : sp_.accumulate) pv[v] = arena_.Accumulator(v);
    // Data parallelism: each replica's accumulated gradients become their sum over the replicas, in replica order
    // (one process with D x M micro-batches would have added the same terms in micro-batch order). The backward
    // reduced the full buckets (GradientReady); the last, partial one goes now.
    if (replicas_ > 1) {
      RETURN_IF_ERROR(ReduceBucket());
      for (ir::ValueId v : sp_.accumulate) {
        if (!reduced_[v]) {
          return absl::InternalError(Where(-1, StepPhase::kPost) + ": gradient '" + sg.value(v).name +
                                     "' was never all-reduced over the data-parallel replicas");
        }
      }
    }
    for (ir::ValueId v : sp_.step_inputs) {
      const bool lr = sg.value(v).name == autodiff::kLrName;
      pv[v] = host_step_inputs_.count(v) ? (lr ? lr_ : step_) : (lr ? buffers_.lr : buffers_.step);
    }
    auto send = [&](int32_t peer, uint64_t kind, ir::ValueId v, const ir::Tensor& x) -> absl::Status {
      return CommError(comm_.Send(peer, Tag(feeds_.step, kind, 0, v), x, stream_),
                       Where(-1, StepPhase::kPost) + " sending '" + sg.value(v).name + "'");
    };
    auto recv = [&](int32_t peer, uint64_t kind, ir::ValueId v) -> absl::StatusOr<ir::Tensor> {
      const std::string what =
          Where(-1, StepPhase::kPost) + " receiving '" + sg.value(v).name + "' from stage " + std::to_string(peer);
      absl::StatusOr<std::vector<int64_t>> dims = ConcreteDims(sg.value(v));
      // A buffer of the plan's boundary memory (a value received once per step), not the phase's scratch; kept
      // for the next steps.
      ir::Tensor& kept = buffers_.received[v];
      absl::StatusOr<ir::Tensor> into = kept;
      if (!dims.ok()) {
        into = dims.status();
      } else if (!kept.has_data() || kept.dims() != *dims || kept.dtype() != sg.value(v).dtype) {
        into = be_.Zeros(sg.value(v).dtype, *dims, stream_);
        if (into.ok()) kept = *into;
      }
      if (!into.ok()) return Annotate(into.status(), what);
      const double r0 = Now();
      absl::Status st = comm_.Recv(peer, Tag(feeds_.step, kind, 0, v), *into, stream_);
      measure.recv_wait_s += (Now() - r0) * 1e-6;
      RETURN_IF_ERROR(CommError(st, what));
      return into;
    };
    const std::map<ir::NodeId, std::vector<int>>& reduced = ex_.all_reduced_[sp_.stage];
    const std::set<ir::ValueId> accumulated(sp_.accumulate.begin(), sp_.accumulate.end());
    std::set<ir::ValueId> reduced_here, reduced_inputs;  // contributions all-reduced instead of sent (here, anywhere)
    for (const auto& [id, group] : reduced)
      for (ir::ValueId v : sg.node(id).inputs) {
        reduced_inputs.insert(v);
        if (accumulated.count(v)) reduced_here.insert(v);
      }
    for (const auto& [peer, vs] : sp_.send_post)
      for (ir::ValueId v : vs)
        if (accumulated.count(v) && !reduced_here.count(v)) RETURN_IF_ERROR(send(peer, kTagPost, v, pv[v]));
    // Inside a graph segment the sends wait for its end (`deferred`): a segment ends after its node that sends.
    std::vector<std::pair<int32_t, ir::ValueId>> deferred;
    bool sent = false;
    auto publish = [&](const ir::Node& n, const std::vector<ir::Tensor>& out, bool defer) -> absl::Status {
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const ir::ValueId o = n.outputs[k];
        if (o == ir::kNoValue) continue;
        pv[o] = out[k];
        for (const auto& [peer, vs] : sp_.send_post) {
          if (std::find(vs.begin(), vs.end(), o) == vs.end()) continue;
          sent = true;
          if (defer) {
            deferred.emplace_back(peer, o);
          } else {
            RETURN_IF_ERROR(send(peer, kTagPost, o, out[k]));
          }
        }
      }
      return absl::OkStatus();
    };
    PostSegments segments(*this, pv);
    for (size_t i = 0;;) {
      if (i == sp_.post.size()) {
        const absl::Status st = segments.End();
        if (st.ok()) break;
        ASSIGN_OR_RETURN(i, segments.Fail(st));
        continue;
      }
      const ir::NodeId id = sp_.post[i];
      std::vector<const ir::Node*> group = UpdateGroup(i, pv);
      if (group.size() <= 1) group = {&sg.node(id)};
      if (segments.Covers(group, reduced.count(id) > 0)) {
        sent = false;
        absl::StatusOr<std::vector<std::vector<ir::Tensor>>> outs = segments.Run(group, i);
        absl::Status st = outs.status();
        for (size_t j = 0; j < group.size() && st.ok(); ++j) st = publish(*group[j], (*outs)[j], /*defer=*/true);
        if (st.ok() && sent) st = segments.End();
        for (const auto& [peer, v] : deferred)
          if (st.ok()) st = send(peer, kTagPost, v, pv[v]);
        deferred.clear();
        if (!st.ok()) {
          ASSIGN_OR_RETURN(i, segments.Fail(st));
          continue;
        }
        i += group.size();
        continue;
      }
      if (const absl::Status st = segments.End(); !st.ok()) {
        ASSIGN_OR_RETURN(i, segments.Fail(st));
        continue;
      }
      if (group.size() > 1) {
        ASSIGN_OR_RETURN(const std::vector<std::vector<ir::Tensor>> outs, EvalGroup(group, pv, -1, StepPhase::kPost));
        for (size_t j = 0; j < group.size(); ++j) RETURN_IF_ERROR(publish(*group[j], outs[j], /*defer=*/false));
        i += group.size();
        continue;
      }
      std::vector<ir::Tensor> out;
      if (auto it = reduced.find(id); it != reduced.end()) {
        ASSIGN_OR_RETURN(out, AllReduceSum(id, it->second, pv));
      } else {
        // A value from a peer comes after every value that peer sent before it (NCCL matches by order): those are
        // received first, into their kept buffers.
        for (ir::ValueId v : sg.node(id).inputs) {
          if (v == ir::kNoValue || sg.value(v).constant || pv[v].defined()) continue;
          for (const auto& [peer, vs] : sp_.recv_post) {
            const auto at = std::find(vs.begin(), vs.end(), v);
            for (auto it = vs.begin(); at != vs.end() && it <= at; ++it) {
              if (pv[*it].defined() || reduced_inputs.count(*it)) continue;
              ASSIGN_OR_RETURN(pv[*it], recv(peer, kTagPost, *it));
            }
          }
        }
        ASSIGN_OR_RETURN(out, Eval(id, pv, -1, StepPhase::kPost));
      }
      RETURN_IF_ERROR(publish(sg.node(id), out, /*defer=*/false));
      ++i;
    }
    if (sp_.grad_norm != ir::kNoValue) {
      ASSIGN_OR_RETURN(const ir::Tensor norm, be_.ToHost(pv[sp_.grad_norm], stream_));
      grad_norm = norm.GetAsDouble(0);
    }
    for (const ir::Graph::StateUpdate& u : sp_.state_updates) {
      const ir::Value& s = sg.value(u.state);
      const ir::Tensor& x = pv[u.new_value];
      if (!x.defined() || !s.constant || x.address() != s.constant->address()) {
        return absl::InternalError(Where(-1, StepPhase::kPost) + ": the new value of '" + s.name +
                                   "' was not written over the state");
      }
    }
    measure.optimizer_scratch_bytes = post_slots_.scratch_bytes() + segments.replayed_scratch();
    measure.post_s += Traced(start, 0, "O", "optimizer", -1);
    return absl::OkStatus();
  }

  // The optimizer phase under graphs (after the first step): consecutive post nodes or update groups
  // whose operands are at hand and which the backend can capture form a segment, recorded in the
  // second step and replayed after (as RunNodes' segments); receives, all-reduces and nodes that
  // wait for the device run between segments, and a segment ends after a node whose output is sent.
  class PostSegments {
   public:
    PostSegments(StageRun& r, std::vector<ir::Tensor>& pv) : r_(r), pv_(pv) {}

    bool Covers(const std::vector<const ir::Node*>& group, bool all_reduced) const {
      if (r_.graphs_ == nullptr || r_.ex_.steps_done_ == 0 || r_.graphs_->post_eager || all_reduced) return false;
      for (const ir::Node* n : group) {
        if (!r_.be_.Capturable(*n)) return false;
        for (ir::ValueId v : n->inputs)
          if (v != ir::kNoValue && !r_.sp_.graph.value(v).constant && !pv_[v].defined()) return false;
      }
      return true;
    }
    // The outputs of `group` (post node `at` on): evaluated while the segment records, or as recorded
    // when it replays.
    absl::StatusOr<std::vector<std::vector<ir::Tensor>>> Run(const std::vector<const ir::Node*>& group, size_t at) {
      if (seg_ == nullptr) {
        begin_ = at;
        RETURN_IF_ERROR(Begin());
      }
      std::vector<std::vector<ir::Tensor>> outs;
      if (replay_) {
        for (size_t j = 0; j < group.size(); ++j) outs.push_back(seg_->outputs.at(next_++));
        r_.measure.replayed_nodes += static_cast<int64_t>(group.size());
        return outs;
      }
      ASSIGN_OR_RETURN(outs, r_.EvalGroup(group, pv_, -1, StepPhase::kPost));
      for (const std::vector<ir::Tensor>& o : outs) {
        std::vector<ir::Tensor>& kept = seg_->outputs.emplace_back();
        for (const ir::Tensor& t : o) kept.push_back(backend::Unowned(t));
      }
      return outs;
    }
    // Closes the open segment, if any: a recording becomes its graph.
    absl::Status End() {
      if (seg_ == nullptr) return absl::OkStatus();
      Segment& seg = *seg_;
      if (replay_) {
        seg_ = nullptr;
        replayed_scratch_ += seg.scratch;
        return absl::OkStatus();
      }
      absl::StatusOr<std::unique_ptr<backend::Graph>> graph = r_.stream_->EndCapture();
      if (!graph.ok()) return graph.status();  // seg_ stays: Fail goes back to the recording's start
      seg_ = nullptr;
      seg.graph = *std::move(graph);
      seg.stats = r_.arena_.stats();
      seg.scratch = r_.post_slots_.scratch_bytes() - scratch_at_begin_;
      return absl::OkStatus();
    }
    // After `st` (an error) in a segment: a replay's error is the step's; a failed recording ran
    // nothing, so the phase goes back to where it began (the post node returned) and the optimizer
    // phase runs without graphs from there on, now and in the next steps.
    absl::StatusOr<size_t> Fail(const absl::Status& st) {
      const bool recording = seg_ != nullptr && !replay_;
      seg_ = nullptr;
      if (!recording) return st;
      (void)r_.stream_->AbortCapture();  // none of it runs: the phase goes back to its start
      pv_ = pv_before_;
      r_.post_slots_.set_scratch_bytes(scratch_at_begin_);
      r_.arena_.ResetStats();
      r_.arena_.MergeStats(stats_before_);
      r_.graphs_->post_eager = true;
      r_.WarnRecordingFailed(Annotate(st, What()));
      return begin_;
    }
    int64_t replayed_scratch() const { return replayed_scratch_; }

   private:
    absl::Status Begin() {
      seg_ = &r_.graphs_->segments[{static_cast<int32_t>(StepPhase::kPost), -1, -1, index_++}];
      next_ = 0;
      replay_ = seg_->graph != nullptr;
      if (replay_) {
        RETURN_IF_ERROR(
            Annotate(seg_->graph->Launch(r_.stream_), r_.Where(-1, StepPhase::kPost) + ": launching a graph"));
        ++r_.measure.graph_launches;
        r_.arena_.MergeStats(seg_->stats);
        return absl::OkStatus();
      }
      *seg_ = Segment();
      scratch_at_begin_ = r_.post_slots_.scratch_bytes();
      pv_before_ = pv_;
      stats_before_ = r_.arena_.stats();
      absl::Status st = r_.stream_->BeginCapture();
      if (!st.ok()) seg_ = nullptr;
      return Annotate(st, What());
    }
    std::string What() const {
      return r_.Where(-1, StepPhase::kPost) + ": recording optimizer nodes as a graph failed";
    }

    StageRun& r_;
    std::vector<ir::Tensor>& pv_;
    std::vector<ir::Tensor> pv_before_;  // at the recording's start
    StageArenaStats stats_before_;
    Segment* seg_ = nullptr;
    bool replay_ = false;
    size_t next_ = 0, begin_ = 0;
    int32_t index_ = 0;
    int64_t scratch_at_begin_ = 0, replayed_scratch_ = 0;
  };

  PipelineExecutor& ex_;
  const backend::Backend& be_;
  backend::Stream* stream_;
  StageProgram& sp_;
  const Uses& uses_;
  StageArena& arena_;
  StepBuffers& buffers_;
  PostSlots post_slots_;
  comm::Comm& comm_;
  const StepFeeds& feeds_;
  const std::vector<std::map<ir::ValueId, ir::Tensor>>& slices_;
  const std::vector<ir::Tensor>& scales_;
  Clock::time_point t0_;
  StageGraphs* graphs_;  // with ExecutorOptions::graphs
  std::vector<Table> tables_;
  std::vector<std::vector<int32_t>> send_f_, send_b_;
  std::vector<bool> accumulated_;
  std::vector<int32_t> accumulated_count_;
  ir::Tensor lr_, step_;                                        // host scalars (on the backend: buffers_)
  std::set<ir::ValueId> host_step_inputs_;                      // step inputs the optimizer's kernels read on the host
  std::vector<std::pair<int32_t, ir::ValueId>> pending_sends_;  // (peer, value) sent after a segment
  const int32_t replicas_ = ex_.options_.topology.replicas;
  std::vector<ir::ValueId> pending_ready_;  // gradients complete inside a segment: GradientReady after it
  std::vector<ir::ValueId> bucket_;         // complete gradients not yet all-reduced, in order
  int64_t bucket_bytes_ = 0;
  std::vector<bool> reduced_;  // by value: all-reduced over the replicas this step
  size_t replayed_ = 0;                                         // the next recorded outputs of the segment replaying
};

PipelineExecutor::~PipelineExecutor() = default;

absl::StatusOr<PipelineStepResult> PipelineExecutor::Step(const StepFeeds& feeds) {
  if (broken_) return FAILED_PRECONDITION() << "a previous step failed; the pipeline's parameters are inconsistent";
  const int32_t K = program_.num_stages, M = microbatches_;
  const int32_t D = options_.topology.replicas, first = options_.topology.replica() * M;  // this replica's
  const int64_t b = microbatch_size_;
  const ir::Graph& g0 = program_.stages[0].graph;  // ids and names are the same on every stage

  // Micro-batch slices of every data input: the global batch's D x M, of which this replica runs
  // [first, first + M).
  std::vector<std::map<ir::ValueId, ir::Tensor>> slices(M);
  std::map<std::string, std::vector<ir::Tensor>> by_name;
  for (const std::string& name : data_inputs_) {
    auto it = feeds.batch.find(name);
    if (it == feeds.batch.end())
      return INVALID_ARGUMENT() << "step " << feeds.step << ": no data for input '" << name << "'";
    const ir::Tensor& t = it->second;
    const ir::ValueId v = g0.FindValue(name);
    if (t.rank() < 1 || t.dims()[0] != b * M * D) {
      return INVALID_ARGUMENT() << "step " << feeds.step << ": input '" << name << "' has "
                                << (t.rank() < 1 ? 0 : t.dims()[0]) << " rows; " << M * D << " micro-batches of " << b
                                << " need " << b * M * D;
    }
    if (t.dtype() != g0.value(v).dtype) {
      return INVALID_ARGUMENT() << "step " << feeds.step << ": input '" << name << "' is " << ir::DTypeName(t.dtype())
                                << ", the model expects " << ir::DTypeName(g0.value(v).dtype);
    }
    if (name == loss_rule_.labels_input) {
      for (int32_t m = 0; m < M * D; ++m) {
        ASSIGN_OR_RETURN(ir::Tensor s, SliceRows(t, m * b, (m + 1) * b));
        by_name[name].push_back(s);
      }
    }
    for (int32_t m = 0; m < M; ++m) {
      ASSIGN_OR_RETURN(slices[m][v], SliceRows(t, (first + m) * b, (first + m + 1) * b));
    }
  }
  // The shares of the global batch's micro-batches; this replica's are [first, first + M).
  std::vector<double> shares(M, 1.0 / D);
  if (!loss_rule_.labels_input.empty()) {
    absl::StatusOr<std::vector<double>> s = LossShares(loss_rule_, by_name.at(loss_rule_.labels_input));
    if (!s.ok()) return Annotate(s.status(), "step " + std::to_string(feeds.step));
    shares.assign(s->begin() + first, s->begin() + first + M);
  }
  std::vector<ir::Tensor> scales;
  for (double s : shares)
    scales.push_back(ir::Tensor::Scalar<double>(s).CastTo(seed_like_.dtype()).Reshaped(seed_like_.dims()));

  // The optimizer phase updates each stage's states in place: give every state storage of its own
  // (the training graph's initializers, or tensors another holder or caller shares, are copied).
  for (size_t s = 0; s < program_.stages.size(); ++s) {
    if (!is_local(static_cast<int32_t>(s))) continue;
    StageProgram& sp = program_.stages[s];
    for (const ir::Graph::StateUpdate& u : sp.state_updates) {
      std::optional<ir::Tensor>& c = sp.graph.value(u.state).constant;
      if (!c || c->SoleOwner()) continue;
      ASSIGN_OR_RETURN(*c, backend_->Clone(*c, streams_[s].get()));
    }
  }
  PrepareGraphs();
  // The stages' comms: this replica's view of the world, or a group of threads made for the step.
  std::shared_ptr<comm::InProcessGroup> group;
  if (options_.world == nullptr) {
    group = comm::InProcessGroup::Create(K, options_.recv_timeout_s, backend_, staging_);
    if (options_.nccl_semantics) group->UseNcclSemantics();
  }
  std::vector<std::unique_ptr<comm::Comm>> comms(K);
  std::vector<std::unique_ptr<StageRun>> runs(K);
  const Clock::time_point t0 = Clock::now();
  for (int32_t s = 0; s < K; ++s) {
    if (!is_local(s)) continue;
    if (group) comms[s] = group->Endpoint(s);
    comm::Comm& c = group ? *comms[s] : *pipeline_comm_;
    runs[s] = std::make_unique<StageRun>(*this, program_.stages[s], *arenas_[s], streams_[s].get(), c, feeds, slices,
                                         scales, t0);
  }
  std::vector<absl::Status> status(K);
  std::vector<std::thread> threads;
  for (int32_t s = 0; s < K; ++s) {
    if (!runs[s]) continue;
    threads.emplace_back([&, s] {
      comm::Comm& c = group ? *comms[s] : *pipeline_comm_;
      try {
        status[s] = runs[s]->Run(lists_[s]);
        // The step ends when the stage's device work has: its parameters and timings are final.
        if (status[s].ok() && streams_[s] != nullptr) status[s] = streams_[s]->Synchronize();
      } catch (const std::exception& e) {
        status[s] = absl::InternalError("stage " + std::to_string(s) + ": exception: " + e.what());
      } catch (...) {
        status[s] = absl::InternalError("stage " + std::to_string(s) + ": unknown exception");
      }
      if (!status[s].ok() && !comm::IsAbortedByPeer(status[s])) c.Abort(status[s]);
    });
  }
  for (std::thread& t : threads) t.join();
  PipelineStepResult r;
  double loss_part = 0, norm_part = 0;
  const absl::Status root = group ? group->abort_status() : options_.world->abort_status();
  if (root.ok()) {
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.shares = shares;
    r.stages.resize(K);
    for (int32_t s = 0; s < K; ++s) {
      if (!runs[s]) continue;
      r.stages[s] = runs[s]->measure;
      r.trace.insert(r.trace.end(), runs[s]->trace.begin(), runs[s]->trace.end());
    }
    if (runs[program_.loss_stage]) {
      r.microbatch_losses = runs[program_.loss_stage]->losses;
      for (int32_t m = 0; m < M; ++m) loss_part += shares[m] * r.microbatch_losses[m];
    }
    const int32_t ns = program_.grad_norm_stage;
    if (ns >= 0 && runs[ns] && options_.topology.replica() == 0) norm_part = runs[ns]->grad_norm;
    r.loss = loss_part;
    r.grad_norm = ns >= 0 ? norm_part : std::nan("");
  }
  const absl::Status shared = root.ok() && options_.world ? ShareResult(r, loss_part, norm_part) : root;
  if (!shared.ok()) {
    broken_ = true;
    return absl::Status(shared.code(), "step " + std::to_string(feeds.step) + ": " + std::string(shared.message()));
  }
  ++steps_done_;
  if (!std::isfinite(r.loss)) {
    broken_ = true;
    return FAILED_PRECONDITION() << "step " << feeds.step << ": the loss is " << r.loss
                                 << "; rerun with --check-numerics to name the stage, micro-batch and node that "
                                    "first produce a non-finite value";
  }
  return r;
}

absl::Status PipelineExecutor::ShareResult(PipelineStepResult& r, double loss_part, double norm_part) {
  // Every rank adds what it holds (0 elsewhere): the loss stage of each replica its replica's share-weighted
  // losses (replica order), replica 0's norm stage the norm (the replicas' norms are the same after the all-reduce).
  ir::Tensor parts = ir::Tensor::FromVector<double>({2}, {loss_part, norm_part});
  std::vector<int> everyone(options_.world->size());
  for (size_t i = 0; i < everyone.size(); ++i) everyone[i] = static_cast<int>(i);
  RETURN_IF_ERROR(Annotate(options_.world->AllReduce(parts, everyone, nullptr), "sharing the step's loss"));
  r.loss = parts.data<double>()[0];
  if (program_.grad_norm_stage >= 0) r.grad_norm = parts.data<double>()[1];
  return absl::OkStatus();
}

void PipelineExecutor::PrepareGraphs() {
  for (size_t s = 0; s < graphs_.size(); ++s) {
    if (graphs_[s] == nullptr) continue;
    const ir::Graph& g = program_.stages[s].graph;
    std::vector<const void*> at;
    for (ir::ValueId v = 0; v < g.num_values(); ++v)
      if (g.value(v).constant) at.push_back(g.value(v).constant->address());
    if (at == graphs_[s]->constants) continue;
    graphs_[s]->segments.clear();  // their kernels read the old storage
    graphs_[s]->constants = std::move(at);
  }
}

}  // namespace onnxpipe::pipeline
