// The stage's optimizer phase: its post nodes (the gradient Sums, the global norm, the updates of the parameters it
// holds) over the accumulated gradients, after the data-parallel all-reduce of the last gradient bucket; tied
// parameters' contributions are all-reduced over their holders or sent to the stage that sums them. The updates of
// one op run as one group (a multi-tensor kernel on a GPU), and under graphs the phase runs as recorded segments.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "executor/pipeline/stage_executor.h"
#include "frontend/autodiff/optimizer.h"
#include "frontend/ir/status.h"
#include "partitioner/memory_planner.h"

namespace onnxpipe::pipeline {

// The optimizer phase under graphs (after the first step): consecutive post nodes or update groups
// whose operands are at hand and which the backend can capture form a segment, recorded in the
// second step and replayed after (as RunNodes' segments); receives, all-reduces and nodes that
// wait for the device run between segments, and a segment ends after a node whose output is sent.
class StageExecutor::PostSegments {
 public:
  PostSegments(StageExecutor& r, std::vector<ir::Tensor>& pv) : r_(r), pv_(pv) {}

  bool Covers(const std::vector<const ir::Node*>& group, bool all_reduced) const {
    if (r_.graphs_ == nullptr || r_.inputs_->steps_done == 0 || r_.graphs_->post_eager || all_reduced) return false;
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
      r_.result_.measure.replayed_nodes += static_cast<int64_t>(group.size());
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
    seg.stats = r_.arena_->stats();
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
    r_.arena_->ResetStats();
    r_.arena_->MergeStats(stats_before_);
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
          Annotate(seg_->graph->Launch(r_.stream_.get()), r_.Where(-1, StepPhase::kPost) + ": launching a graph"));
      ++r_.result_.measure.graph_launches;
      r_.arena_->MergeStats(seg_->stats);
      return absl::OkStatus();
    }
    *seg_ = Segment();
    scratch_at_begin_ = r_.post_slots_.scratch_bytes();
    pv_before_ = pv_;
    stats_before_ = r_.arena_->stats();
    absl::Status st = r_.stream_->BeginCapture();
    if (!st.ok()) seg_ = nullptr;
    return Annotate(st, What());
  }
  std::string What() const { return r_.Where(-1, StepPhase::kPost) + ": recording optimizer nodes as a graph failed"; }

  StageExecutor& r_;
  std::vector<ir::Tensor>& pv_;
  std::vector<ir::Tensor> pv_before_;  // at the recording's start
  StageArenaStats stats_before_;
  Segment* seg_ = nullptr;
  bool replay_ = false;
  size_t next_ = 0, begin_ = 0;
  int32_t index_ = 0;
  int64_t scratch_at_begin_ = 0, replayed_scratch_ = 0;
};

// The optimizer updates (or the per-gradient sums of squares) of one op from post node i on,
// consecutive and independent, whose operands are all at hand in `pv` (none to receive): run as one
// group (Backend::RunGroup: one multi-tensor kernel on a GPU instead of one launch per parameter).
std::vector<const ir::Node*> StageExecutor::UpdateGroup(size_t i, const std::vector<ir::Tensor>& pv) const {
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

absl::Status StageExecutor::Post() {
  const double start = Now();
  ir::Graph& sg = sp_.graph;
  std::vector<ir::Tensor> pv(sg.num_values());
  for (ir::ValueId v : sp_.accumulate) pv[v] = arena_->Accumulator(v);
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
  const std::set<ir::ValueId> accumulated(sp_.accumulate.begin(), sp_.accumulate.end());
  // The contributions all-reduced instead of sent: this stage's, and any stage's.
  std::set<ir::ValueId> reduced_here, reduced_inputs;
  for (const auto& [id, group] : all_reduced_)
    for (ir::ValueId v : sg.node(id).inputs) {
      reduced_inputs.insert(v);
      if (accumulated.count(v)) reduced_here.insert(v);
    }
  for (const auto& [peer, vs] : sp_.send_post)
    for (ir::ValueId v : vs)
      if (accumulated.count(v) && !reduced_here.count(v)) RETURN_IF_ERROR(SendPost(peer, v, pv[v]));
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
          RETURN_IF_ERROR(SendPost(peer, o, out[k]));
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
    if (segments.Covers(group, all_reduced_.count(id) > 0)) {
      sent = false;
      absl::StatusOr<std::vector<std::vector<ir::Tensor>>> outs = segments.Run(group, i);
      absl::Status st = outs.status();
      for (size_t j = 0; j < group.size() && st.ok(); ++j) st = publish(*group[j], (*outs)[j], /*defer=*/true);
      if (st.ok() && sent) st = segments.End();
      for (const auto& [peer, v] : deferred)
        if (st.ok()) st = SendPost(peer, v, pv[v]);
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
    if (auto it = all_reduced_.find(id); it != all_reduced_.end()) {
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
            ASSIGN_OR_RETURN(pv[*it], ReceivePost(peer, *it));
          }
        }
      }
      ASSIGN_OR_RETURN(out, Eval(id, pv, -1, StepPhase::kPost));
    }
    RETURN_IF_ERROR(publish(sg.node(id), out, /*defer=*/false));
    ++i;
  }
  if (sp_.grad_norm != ir::kNoValue) {
    ASSIGN_OR_RETURN(const ir::Tensor norm, be_.ToHost(pv[sp_.grad_norm], stream_.get()));
    result_.grad_norm = norm.GetAsDouble(0);
  }
  for (const ir::Graph::StateUpdate& u : sp_.state_updates) {
    const ir::Value& s = sg.value(u.state);
    const ir::Tensor& x = pv[u.new_value];
    if (!x.defined() || !s.constant || x.address() != s.constant->address()) {
      return absl::InternalError(Where(-1, StepPhase::kPost) + ": the new value of '" + s.name +
                                 "' was not written over the state");
    }
  }
  result_.measure.optimizer_scratch_bytes = post_slots_.scratch_bytes() + segments.replayed_scratch();
  result_.measure.post_s += Traced(start, 0, "O", "optimizer", -1);
  return absl::OkStatus();
}

}  // namespace onnxpipe::pipeline
