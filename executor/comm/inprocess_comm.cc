// Why the sender stages a copy: NCCL's stream order lets the sender overwrite its buffer with work
// issued after the send; a thread transport that buffered the sender's own storage could not allow
// that. Why the last member of an all-reduce sums alone: one summation in one order is what makes
// every member's result the same bits; the others only copy it.
#include "executor/comm/inprocess_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "executor/comm/grouping_comm.h"
#include "frontend/ir/status.h"

namespace onnxpipe::comm {
namespace {

constexpr char kAbortPrefix[] = "pipeline aborted: ";

bool SameShape(const ir::Tensor& a, const ir::Tensor& b) { return a.dtype() == b.dtype() && a.dims() == b.dims(); }

// The event marking the work issued on `stream` so far (null for host order).
absl::StatusOr<std::shared_ptr<backend::Event>> Mark(backend::Stream* stream) {
  if (stream == nullptr) return std::shared_ptr<backend::Event>();
  return stream->Record();
}

absl::Status WaitFor(backend::Stream* stream, const std::shared_ptr<backend::Event>& e) {
  if (stream == nullptr || e == nullptr) return absl::OkStatus();
  return stream->Wait(*e);
}

}  // namespace

bool IsAbortedByPeer(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted && s.message().substr(0, sizeof(kAbortPrefix) - 1) == kAbortPrefix;
}

absl::Status OutOfOrder(int self, int src, uint64_t want, uint64_t next) {
  return FAILED_PRECONDITION() << "rank " << self << " receiving message " << want << " from rank " << src
                               << ": the next message from rank " << src << " is message " << next
                               << "; two ranks must post their sends and receives in the same order (NCCL matches "
                               << "them by order, not by tag)";
}

absl::Status AbortedStatus(const absl::Status& reason) {
  return absl::AbortedError(kAbortPrefix + std::string(reason.message()));
}

std::string RanksString(const std::vector<int>& ranks) {
  std::string s = "{";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "}";
}

std::string DescribeTensor(const ir::Tensor& t) {
  std::ostringstream os;
  os << ir::DTypeName(t.dtype()) << " (";
  for (size_t i = 0; i < t.dims().size(); ++i) os << (i ? ", " : "") << t.dims()[i];
  os << ")";
  return os.str();
}

class InProcessComm : public GroupingComm {
 public:
  InProcessComm(std::shared_ptr<InProcessGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) override {
    RETURN_IF_ERROR(CheckNotGrouped("AllReduce"));
    return group_->AllReduce(rank_, t, ranks, stream);
  }
  void Abort(const absl::Status& reason) override { group_->Abort(reason); }
  absl::Status abort_status() const override { return group_->abort_status(); }
  int64_t bytes_sent() const override {
    std::lock_guard<std::mutex> lock(group_->mu_);
    return group_->sent_[rank_];
  }
  int64_t bytes_received() const override {
    std::lock_guard<std::mutex> lock(group_->mu_);
    return group_->received_[rank_];
  }

 protected:
  absl::Status CheckPeer(int peer, const char* verb) const override { return group_->CheckPeer(rank_, peer, verb); }
  absl::Status SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) override {
    return group_->Send(rank_, dst, tag, t, stream);
  }
  absl::Status RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) override {
    return group_->Recv(rank_, src, tag, into, stream);
  }
  bool HoldsSends() const override { return group_->nccl_semantics_; }
  absl::StatusOr<ir::Tensor> Own(const ir::Tensor& t, backend::Stream* stream) override {
    std::shared_ptr<uint8_t> pooled;  // the copy keeps its buffer; it does not go back to the pool
    return group_->Stage(t, stream, &pooled);
  }
  absl::Status AwaitSends() override { return group_->AwaitSent(rank_); }

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

int64_t StagingPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}

std::shared_ptr<InProcessGroup> InProcessGroup::Create(int world_size, double timeout_s,
                                                       std::shared_ptr<const backend::Backend> backend,
                                                       std::shared_ptr<StagingPool> staging) {
  if (backend == nullptr) backend = backend::MakeCpuBackend();
  return std::shared_ptr<InProcessGroup>(
      new InProcessGroup(world_size, timeout_s, std::move(backend), std::move(staging)));
}

InProcessGroup::InProcessGroup(int world_size, double timeout_s, std::shared_ptr<const backend::Backend> backend,
                               std::shared_ptr<StagingPool> staging)
    : world_size_(world_size < 1 ? 1 : world_size),
      timeout_s_(timeout_s),
      backend_(std::move(backend)),
      staging_(std::move(staging)),
      mailbox_(world_size_),
      sent_(world_size_, 0),
      received_(world_size_, 0),
      unreceived_(world_size_, 0) {}

std::unique_ptr<Comm> InProcessGroup::Endpoint(int rank) {
  if (rank < 0 || rank >= world_size_) return nullptr;
  return std::make_unique<InProcessComm>(shared_from_this(), rank);
}

void InProcessGroup::Abort(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) return;
    abort_ = reason.ok() ? absl::CancelledError("aborted without a reason") : reason;
    // Queued messages are dropped now: nobody will receive them.
    for (auto& q : mailbox_) q.clear();
  }
  cv_.notify_all();
}

absl::Status InProcessGroup::abort_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

int64_t InProcessGroup::pending_messages() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& q : mailbox_) n += static_cast<int64_t>(q.size());
  return n;
}

absl::Status InProcessGroup::CheckPeer(int self, int peer, const char* verb) const {
  if (peer < 0 || peer >= world_size_ || peer == self) {
    return INVALID_ARGUMENT() << "rank " << self << " " << verb << " rank " << peer << " of a group of " << world_size_;
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::AbortedLocked() const { return abort_.ok() ? absl::OkStatus() : AbortedStatus(abort_); }

absl::Status InProcessGroup::WaitLocked(std::unique_lock<std::mutex>& lock, const std::function<bool()>& done,
                                        const std::function<std::string()>& what) {
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s_));
  for (;;) {
    RETURN_IF_ERROR(AbortedLocked());
    if (done()) return absl::OkStatus();
    if (timeout_s_ <= 0) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !done()) {
      RETURN_IF_ERROR(AbortedLocked());
      return absl::DeadlineExceededError(what() + " (waited more than " + std::to_string(timeout_s_) + " s)");
    }
  }
}

absl::StatusOr<std::shared_ptr<uint8_t>> InProcessGroup::TakeStaging(int64_t bytes, backend::Stream* stream) const {
  StagingPool::Entry e;
  {
    std::lock_guard<std::mutex> lock(staging_->mu_);
    if (auto it = staging_->free_.find(bytes); it != staging_->free_.end()) {
      e = std::move(it->second);
      staging_->free_.erase(it);
    } else {
      ++staging_->allocations_;
    }
  }
  if (e.buffer == nullptr) return backend_->Allocate(bytes);
  for (const std::shared_ptr<backend::Event>& read : e.done) RETURN_IF_ERROR(WaitFor(stream, read));
  return std::move(e.buffer);
}

absl::StatusOr<ir::Tensor> InProcessGroup::Stage(const ir::Tensor& t, backend::Stream* stream,
                                                 std::shared_ptr<uint8_t>* pooled) const {
  if (t.placement() == backend_->placement() && staging_ != nullptr) {
    ASSIGN_OR_RETURN(*pooled, TakeStaging(t.num_bytes(), stream));
    ir::Tensor staged = ir::Tensor::View(t.dtype(), t.dims(), *pooled, 0, backend_->placement());
    RETURN_IF_ERROR(backend_->Copy(t, staged, stream));
    return staged;
  }
  if (t.placement() == backend_->placement()) return backend_->Clone(t, stream);
  if (t.on_host()) return t.Clone();
  return INVALID_ARGUMENT() << "a tensor on " << t.placement().ToString()
                            << " is in no memory of the group (the host or " << backend_->name() << ")";
}

absl::Status InProcessGroup::CopyPlaced(const ir::Tensor& src, const ir::Tensor& dst, backend::Stream* stream) const {
  const ir::Placement here = backend_->placement();
  if (src.placement() == here && dst.placement() == here) return backend_->Copy(src, dst, stream);
  if (src.on_host() && dst.placement() == here) return backend_->FromHost(src, dst, stream);
  if (src.on_host() && dst.on_host()) {
    ir::Tensor d = dst;
    if (src.num_bytes() > 0) std::memcpy(d.raw(), src.raw(), src.num_bytes());
    return absl::OkStatus();
  }
  if (src.placement() == here && dst.on_host()) {
    ASSIGN_OR_RETURN(const ir::Tensor h, backend_->ToHost(src, stream));
    return CopyPlaced(h, dst, stream);
  }
  return INVALID_ARGUMENT() << "cannot copy from " << src.placement().ToString() << " to " << dst.placement().ToString()
                            << " through " << backend_->name();
}

absl::Status InProcessGroup::Send(int src, int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(AbortedLocked());
  }
  std::shared_ptr<uint8_t> pooled;
  ASSIGN_OR_RETURN(ir::Tensor staged, Stage(t, stream, &pooled));
  ASSIGN_OR_RETURN(std::shared_ptr<backend::Event> ready, Mark(stream));
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(AbortedLocked());
    mailbox_[dst].push_back(Message{src, tag, std::move(staged), std::move(ready), std::move(pooled)});
    sent_[src] += t.num_bytes();
    ++unreceived_[src];
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status InProcessGroup::Recv(int dst, int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  Message m;
  {
    std::unique_lock<std::mutex> lock(mu_);
    std::deque<Message>& q = mailbox_[dst];
    auto match = q.end();
    RETURN_IF_ERROR(WaitLocked(
        lock,
        [&] {
          match = std::find_if(q.begin(), q.end(), [&](const Message& x) { return x.src == src; });
          return match != q.end();
        },
        [&] {
          return "rank " + std::to_string(dst) + " waited for message " + std::to_string(tag) + " from rank " +
                 std::to_string(src);
        }));
    if (match->tag != tag) return OutOfOrder(dst, src, tag, match->tag);
    m = std::move(*match);
    q.erase(match);
    --unreceived_[src];
    if (nccl_semantics_) cv_.notify_all();  // a sender may wait in AwaitSent
    received_[dst] += m.staged.num_bytes();
  }
  if (!SameShape(m.staged, into)) {
    return INVALID_ARGUMENT() << "rank " << dst << " receiving message " << tag << " from rank " << src
                              << ": the sender's tensor is " << DescribeTensor(m.staged)
                              << " but the receive buffer is " << DescribeTensor(into);
  }
  RETURN_IF_ERROR(WaitFor(stream, m.ready));
  RETURN_IF_ERROR(CopyPlaced(m.staged, into, stream));
  if (m.pooled != nullptr) {  // free again once this stream's copy has read it
    ASSIGN_OR_RETURN(std::shared_ptr<backend::Event> done, Mark(stream));
    std::lock_guard<std::mutex> lock(staging_->mu_);
    staging_->free_.emplace(m.staged.num_bytes(), StagingPool::Entry{std::move(m.pooled), {std::move(done)}});
  }
  return absl::OkStatus();
}

absl::Status InProcessGroup::AwaitSent(int rank) {
  std::unique_lock<std::mutex> lock(mu_);
  return WaitLocked(
      lock, [&] { return unreceived_[rank] == 0; },
      [&] { return "rank " + std::to_string(rank) + " waited for its sends to be received"; });
}

absl::Status InProcessGroup::AllReduce(int rank, const ir::Tensor& t, const std::vector<int>& ranks,
                                       backend::Stream* stream) {
  const std::string who = "rank " + std::to_string(rank) + ": all-reduce over ranks " + RanksString(ranks);
  int pos = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size_ || std::count(ranks.begin(), ranks.end(), ranks[i]) > 1) {
      return INVALID_ARGUMENT() << who << ": the ranks must be distinct ranks of a group of " << world_size_;
    }
    if (ranks[i] == rank) pos = static_cast<int>(i);
  }
  if (pos < 0) return INVALID_ARGUMENT() << who << ", which does not include it";
  if (!t.has_data() || t.placement() != backend_->placement()) {
    return INVALID_ARGUMENT() << who << ": the tensor must be in " << backend_->name() << " memory";
  }
  if (ranks.size() == 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::shared_ptr<backend::Event> ready, Mark(stream));

  std::unique_lock<std::mutex> lock(mu_);
  RETURN_IF_ERROR(AbortedLocked());
  std::vector<int64_t>& calls = reduce_calls_[ranks];
  calls.resize(ranks.size(), 0);
  const ReductionKey key{ranks, calls[pos]++};
  Reduction& r = reductions_[key];
  r.inputs.resize(ranks.size());
  r.ready.resize(ranks.size());
  for (size_t i = 0; i < ranks.size() && r.error.ok(); ++i) {
    if (r.inputs[i].defined() && !SameShape(r.inputs[i], t)) {
      r.error = INVALID_ARGUMENT() << "all-reduce " << key.second << " over ranks " << RanksString(ranks) << ": rank "
                                   << ranks[i] << " has " << DescribeTensor(r.inputs[i]) << " but rank " << rank
                                   << " has " << DescribeTensor(t);
      r.finished = true;
      cv_.notify_all();
    }
  }
  r.inputs[pos] = t;
  r.ready[pos] = std::move(ready);
  if (++r.arrived == static_cast<int>(ranks.size()) && r.error.ok()) {
    // The last member sums, on its stream, after every member's work on its tensor.
    lock.unlock();
    std::shared_ptr<uint8_t> pooled;
    absl::StatusOr<ir::Tensor> sum = [&]() -> absl::StatusOr<ir::Tensor> {
      for (const std::shared_ptr<backend::Event>& e : r.ready) RETURN_IF_ERROR(WaitFor(stream, e));
      ir::Tensor acc;
      if (staging_ != nullptr) {  // a kept buffer, once the members have copied its last sum out
        ASSIGN_OR_RETURN(pooled, TakeStaging(t.num_bytes(), stream));
        acc = ir::Tensor::View(t.dtype(), t.dims(), pooled, 0, backend_->placement());
        RETURN_IF_ERROR(backend_->Copy(r.inputs[0], acc, stream));
      } else {
        ASSIGN_OR_RETURN(acc, backend_->Clone(r.inputs[0], stream));
      }
      for (size_t i = 1; i < r.inputs.size(); ++i) RETURN_IF_ERROR(backend_->Accumulate(acc, r.inputs[i], stream));
      return acc;
    }();
    absl::StatusOr<std::shared_ptr<backend::Event>> done = sum.ok() ? Mark(stream) : sum.status();
    lock.lock();
    r.pooled.buffer = std::move(pooled);  // back to the pool once every member has copied the sum out
    if (done.ok()) {
      r.sum = *std::move(sum);
      r.done = *std::move(done);
    } else {
      r.error = Annotate(done.status(), who);
    }
    r.finished = true;
    cv_.notify_all();
  }
  RETURN_IF_ERROR(WaitLocked(
      lock, [&] { return r.finished; }, [&] { return who + " waited for the other members"; }));
  const absl::Status error = r.error;
  const ir::Tensor sum = r.sum;
  const std::shared_ptr<backend::Event> done = r.done;
  lock.unlock();
  absl::Status st = error;
  absl::StatusOr<std::shared_ptr<backend::Event>> copied = nullptr;
  if (st.ok()) st = WaitFor(stream, done);
  if (st.ok()) st = backend_->Copy(sum, t, stream);
  if (st.ok()) copied = Mark(stream);
  if (st.ok()) st = copied.status();
  lock.lock();
  if (st.ok() && *copied != nullptr) r.pooled.done.push_back(*std::move(copied));
  if (++r.departed == static_cast<int>(ranks.size())) {
    // Every member's copy of the sum is issued: its buffer is free once those have run.
    if (r.pooled.buffer != nullptr && r.error.ok()) {
      std::lock_guard<std::mutex> pool(staging_->mu_);
      staging_->free_.emplace(t.num_bytes(), std::move(r.pooled));
    }
    reductions_.erase(key);
  }
  return st;
}

}  // namespace onnxpipe::comm
