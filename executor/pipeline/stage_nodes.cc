// Running the stage's nodes: their operands, the backend's kernels, the checks after each node (the node hook,
// check_numerics), and what follows a micro-batch node (its outputs held in their planned slots, the loss read,
// gradients accumulated, values sent, operands released). Under graphs (ExecutorOptions::graphs) the micro-batch
// nodes run as segments recorded once and replayed, the host redoing its bookkeeping with the recorded outputs.
#include <cstdio>
#include <exception>
#include <string>
#include <utility>

#include "executor/pipeline/stage_executor.h"
#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::pipeline {
namespace {

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

// Node n's operands from `values` (constants from the graph: on the backend since Create).
absl::StatusOr<std::vector<ir::Tensor>> StageExecutor::Operands(const ir::Node& n,
                                                                const std::vector<ir::Tensor>& values, int32_t m,
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
      if (!values[v].defined() || (!values[v].has_data() && !partitioner::IsShapeOnlyOperand(n, static_cast<int>(i)))) {
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
absl::StatusOr<std::vector<std::vector<ir::Tensor>>> StageExecutor::EvalGroup(const std::vector<const ir::Node*>& nodes,
                                                                              const std::vector<ir::Tensor>& values,
                                                                              int32_t m, StepPhase ph) {
  std::vector<std::vector<ir::Tensor>> operands;
  for (const ir::Node* n : nodes) {
    ASSIGN_OR_RETURN(std::vector<ir::Tensor> o, Operands(*n, values, m, ph));
    operands.push_back(std::move(o));
  }
  arena_->Select(m);
  ir::OutputAllocator* slots = m < 0 ? static_cast<ir::OutputAllocator*>(&post_slots_) : arena_.get();
  const backend::ExecContext ctx = Context(m < 0 ? 0 : m);
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> out = Guarded([&]() {
    if (nodes.size() > 1) return be_.RunGroup(nodes, operands, ctx, slots);
    absl::StatusOr<std::vector<ir::Tensor>> one = be_.Run(*nodes[0], operands[0], ctx, slots);
    if (!one.ok()) return absl::StatusOr<std::vector<std::vector<ir::Tensor>>>(one.status());
    return absl::StatusOr<std::vector<std::vector<ir::Tensor>>>(std::vector<std::vector<ir::Tensor>>{*std::move(one)});
  });
  // (The context strings are made only on an error: this runs for every node of every step.)
  if (!out.ok()) {
    return Annotate(out.status(), Where(m, ph) + (nodes.size() == 1 ? " " + ir::NodeLabel(*nodes[0]) : ""));
  }
  for (size_t i = 0; i < nodes.size(); ++i) RETURN_IF_ERROR(Checked(*nodes[i], &(*out)[i], m, ph));
  return out;
}

// Runs node `id` of the stage graph with operands from `values`; returns its outputs.
absl::StatusOr<std::vector<ir::Tensor>> StageExecutor::Eval(ir::NodeId id, const std::vector<ir::Tensor>& values,
                                                            int32_t m, StepPhase ph) {
  ASSIGN_OR_RETURN(std::vector<std::vector<ir::Tensor>> out, EvalGroup({&sp_.graph.node(id)}, values, m, ph));
  return std::move(out[0]);
}

// After node n ran: the node hook, then the checks of its outputs.
absl::Status StageExecutor::Checked(const ir::Node& n, std::vector<ir::Tensor>* out, int32_t m, StepPhase ph) {
  auto where = [&] { return Where(m, ph) + " " + ir::NodeLabel(n); };
  if (options_.node_hook) {
    const absl::Status st = Guarded([&] { return options_.node_hook(NodeEvent{sp_.stage, m, ph, &n}, out); });
    if (!st.ok()) return Annotate(st, where());
  }
  if (out->size() < n.outputs.size()) return absl::InternalError(where() + ": the backend returned too few outputs");
  if (!options_.check_numerics) return absl::OkStatus();
  for (size_t k = 0; k < n.outputs.size(); ++k) {
    if (n.outputs[k] == ir::kNoValue || !(*out)[k].has_data()) continue;
    ASSIGN_OR_RETURN(const bool finite, be_.AllFinite((*out)[k], stream_.get()));
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
absl::Status StageExecutor::RunMicrobatchNode(ir::NodeId id, int32_t m, StepPhase ph, Table& t, Segment* seg,
                                              bool replay) {
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
      if (accumulated_count_[v] == microbatches_ && replicas_ > 1) {
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

// Micro-batch m's loss: to the host now, or (graphs) copied to its buffer, read after the actions.
absl::Status StageExecutor::ReadLoss(const ir::Tensor& loss, int32_t m, bool replay) {
  if (graphs_ != nullptr) return replay ? absl::OkStatus() : be_.Copy(loss, graphs_->losses[m], stream_.get());
  ASSIGN_OR_RETURN(const ir::Tensor host, be_.ToHost(loss, stream_.get()));
  result_.losses[m] = host.GetAsDouble(0);
  return absl::OkStatus();
}

// Adds micro-batch m's value of v into its accumulator as soon as it is made, in micro-batch
// order: acc = ((g0 + g1) + g2) + ... . Micro-batch 0's kernel wrote g0 into the accumulator
// itself (the layout's plan `first`); later ones wrote into the transient region.
// `issue`: false when a replayed graph has done the addition.
absl::Status StageExecutor::Accumulate(Table& t, ir::ValueId v, int32_t m, bool issue) {
  const ir::Tensor& g = t.values[v];
  if (!g.has_data())
    return absl::InternalError(Where(m, StepPhase::kBackward) + ": gradient '" + sp_.graph.value(v).name +
                               "' is not held");
  if (m > 0 && issue) {
    absl::Status st = be_.Accumulate(arena_->Accumulator(v), g, stream_.get());
    if (!st.ok())
      return Annotate(st, Where(m, StepPhase::kBackward) + " accumulating '" + sp_.graph.value(v).name + "'");
  }
  ++accumulated_count_[v];
  Release(t, v);
  return absl::OkStatus();
}

// Runs nodes [begin, end) of `ids` for micro-batch m (its forward, or backward part `part`):
// one by one, or (graphs, after the first step) as segments: the nodes up to one whose outputs
// are sent or up to a node the backend cannot capture, recorded once and then replayed.
absl::Status StageExecutor::RunNodes(const std::vector<ir::NodeId>& ids, int32_t begin, int32_t end, int32_t m,
                                     StepPhase ph, int32_t part, Table& t) {
  const bool segments = graphs_ != nullptr && inputs_->steps_done > 0;
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
      RETURN_IF_ERROR(Annotate(seg.graph->Launch(stream_.get()), Where(m, ph) + ": launching a graph"));
      replayed_ = 0;
      for (int32_t k = i; k < j; ++k) RETURN_IF_ERROR(RunMicrobatchNode(ids[k], m, ph, t, &seg, /*replay=*/true));
      ++result_.measure.graph_launches;
      result_.measure.replayed_nodes += j - i;
      arena_->MergeStats(seg.stats);
    } else {
      // A failed recording ran nothing: the bookkeeping goes back to before it and the nodes run one by one, now
      // and in the next steps.
      const Table before = t;
      const std::vector<int32_t> counts = accumulated_count_;
      const StageArenaStats stats = arena_->stats();
      if (absl::Status st = Capture(ids, i, j, m, ph, t, seg); !st.ok()) {
        t = before;
        accumulated_count_ = counts;
        arena_->ResetStats();
        arena_->MergeStats(stats);
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
void StageExecutor::WarnRecordingFailed(const absl::Status& st) {
  ++result_.measure.failed_recordings;
  if (std::exchange(graphs_->warned, true)) return;
  std::fprintf(stderr, "onnxpipe: warning: %s; those nodes run without a graph (said once per stage)\n",
               std::string(st.message()).c_str());
}

// True when node `id`'s outputs leave the stage in phase `ph`.
bool StageExecutor::Sends(ir::NodeId id, StepPhase ph) const {
  const auto& sends = ph == StepPhase::kForward ? send_f_ : send_b_;
  for (ir::ValueId v : sp_.graph.node(id).outputs)
    if (v != ir::kNoValue && !sends[v].empty()) return true;
  return false;
}

// Records nodes [i, j) of `ids` into `seg` (and so runs them once).
absl::Status StageExecutor::Capture(const std::vector<ir::NodeId>& ids, int32_t i, int32_t j, int32_t m, StepPhase ph,
                                    Table& t, Segment& seg) {
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
  seg.stats = arena_->stats();
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
