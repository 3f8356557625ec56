// Why a reader thread per peer: NCCL's contract lets a sender go on before the receiver posts its
// receive, and two ranks may send to each other at the same moment; reading every connection as
// data arrives keeps both sides' socket buffers from filling, so no send can deadlock, and an ended
// connection (a killed process) is seen within milliseconds instead of at the next receive.
// Frame: [kind][tag][dtype][rank][payload bytes][text bytes] as u64, the dims, the payload, the text.
#include "executor/comm/tcp_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace onnxpipe::comm {
namespace {

constexpr char kMeshMagic[] = "onnxpipe-mesh-1";
constexpr uint64_t kMaxRank = 16;
constexpr int kNumDTypes = 9;

// A tag for the n-th all-reduce of a group (FNV-1a over the group, mixed with n).
uint64_t ReduceTag(const std::vector<int>& ranks, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int r : ranks) h = (h ^ static_cast<uint64_t>(r)) * 1099511628211ull;
  return h ^ (static_cast<uint64_t>(n) * 0x9E3779B97F4A7C15ull);
}

bool SameShape(const ir::Tensor& a, const ir::Tensor& b) { return a.dtype() == b.dtype() && a.dims() == b.dims(); }

}  // namespace

TcpComm::TcpComm(int rank, int world, const TcpCommOptions& options)
    : rank_(rank),
      timeout_s_(options.timeout_s),
      silence_s_(options.silence_s),
      backend_(options.backend ? options.backend : backend::MakeCpuBackend()),
      host_(backend::MakeCpuBackend()) {
  for (int r = 0; r < world; ++r) peers_.push_back(std::make_unique<Peer>());
}

absl::StatusOr<std::unique_ptr<TcpComm>> TcpComm::Create(const TcpCommOptions& options) {
  const RendezvousOptions& ro = options.rendezvous;
  ASSIGN_OR_RETURN(Socket listener, Listen("", 0));
  ASSIGN_OR_RETURN(const int port, BoundPort(listener));
  ASSIGN_OR_RETURN(const std::vector<RendezvousPeer> table, Rendezvous(ro, std::to_string(port)));
  std::unique_ptr<TcpComm> c(new TcpComm(ro.rank, ro.world_size, options));
  const Deadline deadline = DeadlineIn(ro.timeout_s);
  const std::string who = "rank " + std::to_string(ro.rank);
  // Dial every lower rank, then take the connections of the higher ones (each says its rank first).
  for (int j = 0; j < ro.rank; ++j) {
    absl::StatusOr<Socket> s = Connect(table[j].host, std::stoi(table[j].blob), deadline);
    if (!s.ok()) return Annotate(s.status(), who + " connecting to rank " + std::to_string(j));
    std::string hello;
    PutU64(hello, sizeof(kMeshMagic) - 1);
    hello += kMeshMagic;
    PutU64(hello, static_cast<uint64_t>(ro.rank));
    RETURN_IF_ERROR(WriteAll(*s, hello.data(), hello.size(), who + " greeting rank " + std::to_string(j)));
    c->peers_[j]->socket = *std::move(s);
  }
  for (int pending = ro.world_size - 1 - ro.rank; pending > 0;) {
    absl::StatusOr<Socket> s = Accept(listener, deadline);
    if (!s.ok()) {
      return COMM_ERROR(kDeadlineExceeded)
             << who << ": " << pending << " higher rank(s) did not connect before the rendezvous timeout";
    }
    absl::StatusOr<std::string> magic = ReadString(*s, who + " reading a greeting", deadline, 64);
    char num[8];
    if (!magic.ok() || *magic != kMeshMagic || !ReadAll(*s, num, 8, "greeting", deadline).ok()) continue;
    const int j = static_cast<int>(GetU64(num));
    if (j <= ro.rank || j >= ro.world_size || c->peers_[j]->socket.valid()) {
      return COMM_ERROR(kInternal) << who << ": an unexpected connection from a process saying it is rank " << j;
    }
    c->peers_[j]->socket = *std::move(s);
    --pending;
  }
  const auto now = std::chrono::steady_clock::now();
  for (int j = 0; j < ro.world_size; ++j) {
    if (j == ro.rank) continue;
    c->peers_[j]->heard = now;
    c->peers_[j]->reader = std::thread([p = c.get(), j] { p->ReadLoop(j); });
  }
  if (ro.world_size > 1) c->heartbeat_ = std::thread([p = c.get()] { p->HeartbeatLoop(); });
  return c;
}

TcpComm::~TcpComm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  for (size_t j = 0; j < peers_.size(); ++j) {
    if (static_cast<int>(j) == rank_) continue;
    (void)WriteFrame(static_cast<int>(j), Kind::kBye, 0, nullptr, "");
    peers_[j]->socket.ShutdownWrite();
  }
  {
    // Wait a little for the peers' goodbyes, so that closing leaves nothing unread (which would reset
    // the connection and could cost a peer the last bytes we sent it).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(2), [&] {
      for (size_t j = 0; j < peers_.size(); ++j)
        if (static_cast<int>(j) != rank_ && !peers_[j]->closed) return false;
      return true;
    });
  }
  for (auto& p : peers_) p->socket.ShutdownBoth();
  for (auto& p : peers_)
    if (p->reader.joinable()) p->reader.join();
}

void TcpComm::ReadLoop(int src) {
  Peer& p = *peers_[src];
  const std::string what = "rank " + std::to_string(rank_) + " reading from rank " + std::to_string(src);
  absl::Status failure;
  for (;;) {
    char head[48];
    absl::Status st = ReadAll(p.socket, head, sizeof(head), what);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!p.left && (abort_.ok() || !absl::IsNotFound(st))) failure = st;
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      p.mid_frame = true;
      p.heard = std::chrono::steady_clock::now();
    }
    Incoming in;
    in.kind = static_cast<Kind>(GetU64(head));
    in.tag = GetU64(head + 8);
    const uint64_t dtype = GetU64(head + 16), nd = GetU64(head + 24), payload = GetU64(head + 32),
                   text = GetU64(head + 40);
    if (nd > kMaxRank || dtype >= kNumDTypes || text > (1 << 20)) {
      failure = COMM_ERROR(kDataLoss) << what << ": a malformed frame";
      break;
    }
    std::vector<int64_t> dims(nd);
    std::string dim_bytes(8 * nd, '\0');
    if (nd > 0) st = ReadAll(p.socket, dim_bytes.data(), dim_bytes.size(), what);
    for (uint64_t i = 0; i < nd; ++i) dims[i] = static_cast<int64_t>(GetU64(dim_bytes.data() + 8 * i));
    if (st.ok() && (in.kind == Kind::kMessage || in.kind == Kind::kReduceIn || in.kind == Kind::kReduceOut)) {
      in.tensor = ir::Tensor(static_cast<ir::DType>(dtype), dims);
      if (static_cast<uint64_t>(in.tensor.num_bytes()) != payload) {
        st = COMM_ERROR(kDataLoss) << what << ": a frame's payload does not match its shape";
      } else if (payload > 0) {
        st = ReadAll(p.socket, in.tensor.raw(), payload, what);
      }
    }
    if (st.ok() && text > 0) {
      in.text.resize(text);
      st = ReadAll(p.socket, in.text.data(), text, what);
    }
    if (!st.ok()) {
      failure = absl::IsNotFound(st) ? COMM_ERROR(kUnavailable) << what << ": the connection ended mid-frame" : st;
      break;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      p.mid_frame = false;
      p.heard = std::chrono::steady_clock::now();
    }
    if (in.kind == Kind::kHeartbeat) continue;
    if (in.kind == Kind::kAbort) {
      AbortLocally(absl::AbortedError(in.text));
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in.kind == Kind::kBye) {
        p.left = true;
      } else {
        received_ += in.tensor.has_data() ? in.tensor.num_bytes() : 0;
        p.mailbox.push_back(std::move(in));
      }
    }
    cv_.notify_all();
  }
  if (!failure.ok()) {
    AbortLocally(COMM_ERROR(kUnavailable)
                 << "rank " << src << " is gone: its connection to rank " << rank_
                 << " ended without a goodbye (the process died, was killed, or the network failed): "
                 << failure.message());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    p.closed = true;
  }
  cv_.notify_all();
}

absl::Status TcpComm::WriteFrame(int dst, Kind kind, uint64_t tag, const ir::Tensor* t, const std::string& text) {
  std::string head;
  PutU64(head, static_cast<uint64_t>(kind));
  PutU64(head, tag);
  PutU64(head, t ? static_cast<uint64_t>(t->dtype()) : 0);
  PutU64(head, t ? t->dims().size() : 0);
  PutU64(head, t ? static_cast<uint64_t>(t->num_bytes()) : 0);
  PutU64(head, text.size());
  if (t)
    for (int64_t d : t->dims()) PutU64(head, static_cast<uint64_t>(d));
  Peer& p = *peers_[dst];
  const std::string what = "rank " + std::to_string(rank_) + " sending to rank " + std::to_string(dst);
  std::lock_guard<std::mutex> lock(p.write_mu);
  RETURN_IF_ERROR(WriteAll(p.socket, head.data(), head.size(), what));
  if (t && t->num_bytes() > 0) RETURN_IF_ERROR(WriteAll(p.socket, t->raw(), t->num_bytes(), what));
  if (!text.empty()) RETURN_IF_ERROR(WriteAll(p.socket, text.data(), text.size(), what));
  return absl::OkStatus();
}

absl::Status TcpComm::CheckPeer(int peer, const char* verb) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    return INVALID_ARGUMENT() << "rank " << rank_ << " " << verb << " rank " << peer << " of a group of " << size();
  }
  return absl::OkStatus();
}

absl::Status TcpComm::AbortedLocked() const { return abort_.ok() ? absl::OkStatus() : AbortedStatus(abort_); }

void TcpComm::HeartbeatLoop() {
  std::string beat;
  for (uint64_t v :
       {static_cast<uint64_t>(Kind::kHeartbeat), uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0}})
    PutU64(beat, v);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_; });
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    int silent = -1;
    for (size_t j = 0; j < peers_.size(); ++j) {
      Peer& p = *peers_[j];
      if (static_cast<int>(j) == rank_ || p.left || p.closed || p.mid_frame) continue;
      if (silence_s_ > 0 && std::chrono::duration<double>(now - p.heard).count() > silence_s_) silent = j;
    }
    lock.unlock();
    if (silent >= 0) {
      AbortLocally(COMM_ERROR(kUnavailable) << "rank " << silent << " has not been heard from for " << silence_s_
                                            << " s (stopped, frozen or cut off from the network)");
      peers_[silent]->socket.ShutdownBoth();  // a send blocked on it returns, and telling the others cannot block
      TellPeers();
    }
    // A peer whose connection is busy with a frame needs no beat (and must not wait for one).
    for (size_t j = 0; j < peers_.size(); ++j) {
      if (static_cast<int>(j) == rank_) continue;
      std::unique_lock<std::mutex> w(peers_[j]->write_mu, std::try_to_lock);
      if (w.owns_lock()) (void)WriteAll(peers_[j]->socket, beat.data(), beat.size(), "heartbeat");
    }
    lock.lock();
  }
}

void TcpComm::AbortLocally(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) return;
    abort_ = reason.ok() ? absl::CancelledError("aborted without a reason") : reason;
  }
  cv_.notify_all();
}

void TcpComm::Abort(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!abort_.ok()) return;
  }
  AbortLocally(reason);
  TellPeers();
}

void TcpComm::TellPeers() {
  const std::string text = "rank " + std::to_string(rank_) + ": " + std::string(abort_status().message());
  for (int j = 0; j < size(); ++j)
    if (j != rank_) (void)WriteFrame(j, Kind::kAbort, 0, nullptr, text);
}

absl::Status TcpComm::abort_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abort_;
}

int64_t TcpComm::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}

int64_t TcpComm::bytes_received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

absl::Status TcpComm::DoSend(int dst, Kind kind, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(AbortedLocked());
  }
  ir::Tensor host = t;
  if (!t.on_host()) {
    ASSIGN_OR_RETURN(host, backend_->ToHost(t, stream));
  } else if (stream != nullptr) {
    RETURN_IF_ERROR(stream->Synchronize());
  }
  absl::Status st = WriteFrame(dst, kind, tag, &host, "");
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(AbortedLocked());  // a dead peer's abort explains a failed write better than the write
  if (st.ok()) sent_ += t.num_bytes();
  return st;
}

absl::StatusOr<TcpComm::Incoming> TcpComm::Take(int src, Kind kind, uint64_t tag, const std::string& what) {
  Peer& p = *peers_[src];
  const Deadline deadline = DeadlineIn(timeout_s_);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    RETURN_IF_ERROR(AbortedLocked());
    // Messages are taken in the order they came; the frames of an all-reduce by their tag.
    auto it = std::find_if(p.mailbox.begin(), p.mailbox.end(), [&](const Incoming& in) {
      if (kind == Kind::kMessage) return in.kind == Kind::kMessage;
      return in.tag == tag && (in.kind == kind || in.kind == Kind::kError);
    });
    if (it != p.mailbox.end()) {
      if (it->tag != tag) return OutOfOrder(rank_, src, tag, it->tag);
      Incoming in = std::move(*it);
      p.mailbox.erase(it);
      if (in.kind == Kind::kError) return absl::InvalidArgumentError(in.text);
      return in;
    }
    if (p.left || p.closed) {
      return COMM_ERROR(kFailedPrecondition) << what << ": rank " << src << " has finished and left without sending it";
    }
    if (deadline == Deadline::max()) {
      cv_.wait(lock);
    } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      RETURN_IF_ERROR(AbortedLocked());
      return COMM_ERROR(kDeadlineExceeded) << what << " (waited more than " << timeout_s_ << " s)";
    }
  }
}

absl::Status TcpComm::Land(const ir::Tensor& host, const ir::Tensor& into, backend::Stream* stream,
                           const std::string& what) const {
  if (!SameShape(host, into)) {
    return INVALID_ARGUMENT() << what << ": the sender's tensor is " << DescribeTensor(host)
                              << " but the receive buffer is " << DescribeTensor(into);
  }
  if (!into.on_host()) return backend_->FromHost(host, into, stream);
  if (stream != nullptr) RETURN_IF_ERROR(stream->Synchronize());
  ir::Tensor dst = into;
  if (host.num_bytes() > 0) std::memcpy(dst.raw(), host.raw(), host.num_bytes());
  return absl::OkStatus();
}

absl::Status TcpComm::SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  return DoSend(dst, Kind::kMessage, tag, t, stream);
}

absl::Status TcpComm::RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  const std::string what = "rank " + std::to_string(rank_) + " receiving message " + std::to_string(tag) +
                           " from rank " + std::to_string(src);
  ASSIGN_OR_RETURN(const Incoming in, Take(src, Kind::kMessage, tag, what));
  return Land(in.tensor, into, stream, what);
}

absl::Status TcpComm::AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckNotGrouped("AllReduce"));
  const std::string who = "rank " + std::to_string(rank_) + ": all-reduce over ranks " + RanksString(ranks);
  bool member = false;
  for (int r : ranks) {
    if (r < 0 || r >= size() || std::count(ranks.begin(), ranks.end(), r) > 1) {
      return INVALID_ARGUMENT() << who << ": the ranks must be distinct ranks of a group of " << size();
    }
    member |= r == rank_;
  }
  if (!member) return INVALID_ARGUMENT() << who << ", which does not include it";
  if (!t.has_data()) return INVALID_ARGUMENT() << who << ": the tensor has no data";
  if (ranks.size() == 1) return absl::OkStatus();
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = reduce_calls_[ranks]++;
  }
  const uint64_t tag = ReduceTag(ranks, n);
  const std::string what = who + " (call " + std::to_string(n) + ")";
  if (ranks[0] != rank_) {
    RETURN_IF_ERROR(DoSend(ranks[0], Kind::kReduceIn, tag, t, stream));
    ASSIGN_OR_RETURN(const Incoming sum, Take(ranks[0], Kind::kReduceOut, tag, what + " waiting for the sum"));
    return Land(sum.tensor, t, stream, what);
  }
  // The fold, on this rank's stream, in the group's order (host tensors on the host).
  const backend::Backend& be = t.on_host() ? *host_ : *backend_;
  backend::Stream* on = t.on_host() ? nullptr : stream;
  if (t.on_host() && stream != nullptr) RETURN_IF_ERROR(stream->Synchronize());
  ASSIGN_OR_RETURN(ir::Tensor acc, be.Clone(t, on));
  for (size_t i = 1; i < ranks.size(); ++i) {
    absl::StatusOr<Incoming> in =
        Take(ranks[i], Kind::kReduceIn, tag, what + " waiting for rank " + std::to_string(ranks[i]));
    absl::Status st = in.status();
    if (st.ok() && !SameShape(in->tensor, t)) {
      st = INVALID_ARGUMENT() << "all-reduce " << n << " over ranks " << RanksString(ranks) << ": rank " << ranks[i]
                              << " has " << DescribeTensor(in->tensor) << " but rank " << rank_ << " has "
                              << DescribeTensor(t);
    }
    absl::StatusOr<ir::Tensor> x = st.ok() ? be.Upload(in->tensor, on) : st;
    if (x.ok()) st = be.Accumulate(acc, *x, on);
    if (!st.ok()) {
      for (size_t k = 1; k < ranks.size(); ++k)
        (void)WriteFrame(ranks[k], Kind::kError, tag, nullptr, std::string(st.message()));
      return IsAbortedByPeer(st) ? st : Annotate(st, who);
    }
  }
  for (size_t i = 1; i < ranks.size(); ++i) RETURN_IF_ERROR(DoSend(ranks[i], Kind::kReduceOut, tag, acc, on));
  return be.Copy(acc, t, on);
}

}  // namespace onnxpipe::comm
