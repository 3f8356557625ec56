// Mailboxes per destination rank under one group lock. Why tags are matched out of order: the
// pipeline driver receives in the order it sends, but matching by (src, tag) makes a driver bug
// show up as a wrong-value error or a reported deadlock rather than a silently swapped tensor.
#include "executor/comm/inprocess_comm.h"

#include <chrono>
#include <string>

#include "frontend/ir/status.h"

namespace onnxpipe::comm {
namespace {

constexpr char kAbortPrefix[] = "pipeline aborted: ";

}  // namespace

bool IsAbortedByPeer(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted &&
         s.message().substr(0, sizeof(kAbortPrefix) - 1) == kAbortPrefix;
}

class InProcessComm : public Comm {
 public:
  InProcessComm(std::shared_ptr<InProcessGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status Send(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) override {
    std::shared_ptr<backend::Event> ready;
    if (stream != nullptr) {
      absl::StatusOr<std::shared_ptr<backend::Event>> e = stream->Record();
      if (!e.ok()) return e.status();
      ready = *std::move(e);
    }
    return group_->Send(rank_, dst, tag, t, std::move(ready));
  }
  absl::StatusOr<ir::Tensor> Recv(int src, uint64_t tag, backend::Stream* stream) override {
    std::shared_ptr<backend::Event> ready;
    absl::StatusOr<ir::Tensor> t = group_->Recv(rank_, src, tag, &ready);
    if (t.ok() && ready != nullptr && stream != nullptr) {
      if (absl::Status st = stream->Wait(*ready); !st.ok()) return st;
    }
    return t;
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

 private:
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
};

std::shared_ptr<InProcessGroup> InProcessGroup::Create(int world_size, double recv_timeout_s) {
  return std::shared_ptr<InProcessGroup>(new InProcessGroup(world_size, recv_timeout_s));
}

InProcessGroup::InProcessGroup(int world_size, double recv_timeout_s)
    : world_size_(world_size < 1 ? 1 : world_size),
      recv_timeout_s_(recv_timeout_s),
      mailbox_(world_size_),
      sent_(world_size_, 0),
      received_(world_size_, 0) {}

std::unique_ptr<Comm> InProcessGroup::Endpoint(int rank) {
  if (rank < 0 || rank >= world_size_) return nullptr;
  return std::make_unique<InProcessComm>(shared_from_this(), rank);
}

void InProcessGroup::Abort(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) return;
    abort_ = reason.ok() ? absl::CancelledError("aborted without a reason") : reason;
    // Queued tensors are dropped now: nobody will receive them.
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

absl::Status InProcessGroup::Send(int src, int dst, uint64_t tag, const ir::Tensor& t,
                                  std::shared_ptr<backend::Event> ready) {
  if (dst < 0 || dst >= world_size_ || dst == src) {
    return INVALID_ARGUMENT() << "rank " << src << " sends to rank " << dst << " of a group of "
                              << world_size_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) {
      return absl::AbortedError(kAbortPrefix + std::string(abort_.message()));
    }
    mailbox_[dst].push_back(Message{src, tag, t, std::move(ready)});
    sent_[src] += t.defined() ? t.num_bytes() : 0;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<ir::Tensor> InProcessGroup::Recv(int dst, int src, uint64_t tag,
                                                 std::shared_ptr<backend::Event>* ready) {
  if (src < 0 || src >= world_size_ || src == dst) {
    return INVALID_ARGUMENT() << "rank " << dst << " receives from rank " << src << " of a group of "
                              << world_size_;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(recv_timeout_s_));
  for (;;) {
    if (!abort_.ok()) return absl::AbortedError(kAbortPrefix + std::string(abort_.message()));
    std::deque<Message>& q = mailbox_[dst];
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (it->src == src && it->tag == tag) {
        ir::Tensor t = std::move(it->tensor);
        if (ready != nullptr) *ready = std::move(it->ready);
        q.erase(it);
        received_[dst] += t.defined() ? t.num_bytes() : 0;
        return t;
      }
    }
    if (recv_timeout_s_ > 0) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError("rank " + std::to_string(dst) + " waited more than " +
                                           std::to_string(recv_timeout_s_) + " s for message " +
                                           std::to_string(tag) + " from rank " + std::to_string(src));
      }
      cv_.wait_until(lock, deadline);
    } else {
      cv_.wait(lock);
    }
  }
}

}  // namespace onnxpipe::comm
