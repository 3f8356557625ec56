// The stage's transfers: the micro-batch values sent to and received from the neighbouring stages (tagged by step,
// micro-batch and value name, so a transfer matches only its own), the optimizer phase's sends, receives and all-reduces of
// shared parameters' gradients, and, with data parallelism, the gradient buckets all-reduced over the replicas.
#include <algorithm>
#include <string>
#include <utility>

#include "executor/comm/comm.h"
#include "executor/pipeline/stage_executor.h"
#include "frontend/ir/status.h"

namespace onnxpipe::pipeline {
namespace {

constexpr uint64_t kTagMicrobatch = 0, kTagPost = 1;

// The value's part of a tag: FNV-1a of its name, which both ends share (their programs may number values apart: a
// rank's program comes from its own stage file).
uint64_t Tag(int64_t step, uint64_t kind, int32_t m, const ir::Graph& g, ir::ValueId v) {
  uint32_t h = 2166136261u;
  for (const char c : g.value(v).name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return (static_cast<uint64_t>(step & 0xFFFF) << 48) | (kind << 44) | (static_cast<uint64_t>(m & 0xFFF) << 32) | h;
}

// A comm failure annotated with what was being done; a peer's abort passes as it is (the root cause is the peer's).
absl::Status CommError(const absl::Status& st, const std::string& what) {
  return st.ok() || comm::IsAbortedByPeer(st) ? st : Annotate(st, what);
}

}  // namespace

// Issues the sends a holding comm keeps, at the end of `after` (a no-op for a comm that sends at once).
absl::Status StageExecutor::IssueHeldSends(const partitioner::Action& after) {
  return CommError(comm_->Flush(),
                   "stage " + std::to_string(sp_.stage) + ": sending after " + partitioner::ActionToString(after));
}

// The values of a run of RECV actions, received as one group straight into their planned slots. A
// value the plan gives no slot (one only read for its dims) lands in a buffer of its own.
absl::Status StageExecutor::Receive(int32_t m, const std::vector<std::pair<int32_t, std::vector<ir::ValueId>>>& from,
                                    const char* phase) {
  ASSIGN_OR_RETURN(Table * tp, Get(m));
  Table& t = *tp;
  const double start = Now();
  const std::string where = "stage " + std::to_string(sp_.stage) + ", micro-batch " + std::to_string(m);
  std::vector<std::pair<int32_t, ir::ValueId>> values;  // (peer, value) in posting order
  for (const auto& [peer, vs] : from)
    for (ir::ValueId v : vs) values.push_back({peer, v});
  std::vector<ir::Tensor> into;
  for (const auto& [peer, v] : values) {
    const ir::Value& val = sp_.graph.value(v);
    ASSIGN_OR_RETURN(const std::vector<int64_t> dims, ConcreteDims(val));
    absl::StatusOr<ir::Tensor> buffer = arena_->Address(v, m) != nullptr
                                            ? arena_->Slot(v, m, val.dtype, dims, "received value", /*zero=*/false)
                                            : be_.Zeros(val.dtype, dims, stream_.get());
    if (!buffer.ok()) return Annotate(buffer.status(), where + ": receiving '" + val.name + "'");
    into.push_back(*std::move(buffer));
  }
  absl::Status st = comm_->GroupStart();
  for (size_t i = 0; i < values.size() && st.ok(); ++i) {
    const auto& [peer, v] = values[i];
    st = comm_->Recv(peer, Tag(inputs_->step, kTagMicrobatch, m, sp_.graph, v), into[i], stream_.get());
  }
  if (absl::Status end = comm_->GroupEnd(); st.ok()) st = end;
  std::string peers;
  for (const auto& [peer, vs] : from) peers += (peers.empty() ? "" : ", ") + std::to_string(peer);
  if (!st.ok()) {
    std::string names;
    for (const auto& [peer, v] : values) names += (names.empty() ? "'" : ", '") + sp_.graph.value(v).name + "'";
    return CommError(st, where + ": receiving " + names + " from stage " + peers);
  }
  for (size_t i = 0; i < values.size(); ++i) RETURN_IF_ERROR(Put(t, m, values[i].second, into[i]));
  result_.measure.recv_wait_s +=
      Traced(start, 1, std::string("recv ") + phase + std::to_string(m) + " from " + peers, "recv", m);
  return absl::OkStatus();
}

absl::Status StageExecutor::Send(Table& t, int32_t m, StepPhase ph, int32_t peer, ir::ValueId v) {
  const absl::Status st = comm_->Send(peer, Tag(inputs_->step, kTagMicrobatch, m, sp_.graph, v), t.values[v], stream_.get());
  RETURN_IF_ERROR(CommError(st, Where(m, ph) + " sending '" + sp_.graph.value(v).name + "'"));
  Release(t, v);
  return absl::OkStatus();
}

absl::Status StageExecutor::FlushSends(Table& t, int32_t m, StepPhase ph) {
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
absl::Status StageExecutor::GradientReady(ir::ValueId v) {
  bucket_.push_back(v);
  bucket_bytes_ += arena_->Accumulator(v).num_bytes();
  if (bucket_bytes_ < options_.dp_bucket_bytes) return absl::OkStatus();
  ++result_.measure.dp_buckets_in_backward;
  return ReduceBucket();
}

absl::Status StageExecutor::ReduceBucket() {
  const std::vector<int> group = options_.topology.DataParallelGroup();
  for (ir::ValueId v : bucket_) {
    RETURN_IF_ERROR(CommError(options_.world->AllReduce(arena_->Accumulator(v), group, stream_.get()),
                              Where(-1, StepPhase::kBackward) + " all-reducing '" + sp_.graph.value(v).name +
                                  "' over the data-parallel replicas"));
    reduced_[v] = true;
  }
  bucket_.clear();
  bucket_bytes_ = 0;
  return absl::OkStatus();
}

// Post Sum `id` of a shared parameter's contributions as an all-reduce over `group` (its holders):
// this stage's accumulated contribution becomes the sum in place and is the Sum's output.
absl::StatusOr<std::vector<ir::Tensor>> StageExecutor::AllReduceSum(ir::NodeId id, const std::vector<int>& group,
                                                                    const std::vector<ir::Tensor>& pv) {
  const ir::Node& n = sp_.graph.node(id);
  const ir::Tensor& mine = pv[n.inputs[std::find(group.begin(), group.end(), sp_.stage) - group.begin()]];
  std::string stages;
  for (int s : group) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
  const std::string what = Where(-1, StepPhase::kPost) + " " + ir::NodeLabel(n) + ": all-reducing the gradient of '" +
                           n.origin + "' over stages {" + stages + "}";
  const double start = Now();
  const absl::Status st = comm_->AllReduce(mine, group, stream_.get());
  result_.measure.recv_wait_s += Traced(start, 1, "all-reduce " + n.origin, "recv", -1);
  RETURN_IF_ERROR(CommError(st, what));
  if (options_.check_numerics) {
    ASSIGN_OR_RETURN(const bool finite, be_.AllFinite(mine, stream_.get()));
    if (!finite) return FAILED_PRECONDITION() << what << " produced a non-finite value";
  }
  return std::vector<ir::Tensor>{mine};
}

absl::Status StageExecutor::SendPost(int32_t peer, ir::ValueId v, const ir::Tensor& x) {
  return CommError(comm_->Send(peer, Tag(inputs_->step, kTagPost, 0, sp_.graph, v), x, stream_.get()),
                   Where(-1, StepPhase::kPost) + " sending '" + sp_.graph.value(v).name + "'");
}

absl::StatusOr<ir::Tensor> StageExecutor::ReceivePost(int32_t peer, ir::ValueId v) {
  const ir::Value& val = sp_.graph.value(v);
  const std::string what =
      Where(-1, StepPhase::kPost) + " receiving '" + val.name + "' from stage " + std::to_string(peer);
  absl::StatusOr<std::vector<int64_t>> dims = ConcreteDims(val);
  // A buffer of the plan's boundary memory (a value received once per step), not the phase's scratch; kept for the
  // next steps.
  ir::Tensor& kept = buffers_.received[v];
  absl::StatusOr<ir::Tensor> into = kept;
  if (!dims.ok()) {
    into = dims.status();
  } else if (!kept.has_data() || kept.dims() != *dims || kept.dtype() != val.dtype) {
    into = be_.Zeros(val.dtype, *dims, stream_.get());
    if (into.ok()) kept = *into;
  }
  if (!into.ok()) return Annotate(into.status(), what);
  const double start = Now();
  absl::Status st = comm_->Recv(peer, Tag(inputs_->step, kTagPost, 0, sp_.graph, v), *into, stream_.get());
  result_.measure.recv_wait_s += (Now() - start) * 1e-6;
  RETURN_IF_ERROR(CommError(st, what));
  return into;
}

}  // namespace onnxpipe::pipeline
