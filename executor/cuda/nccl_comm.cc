#include "executor/cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

constexpr uint64_t kUniqueIdTag = uint64_t{1} << 62;

absl::StatusOr<ncclDataType_t> NcclType(ir::DType t) {
  switch (t) {
    case ir::DType::kF32:
      return ncclFloat32;
    case ir::DType::kF64:
      return ncclFloat64;
    case ir::DType::kBF16:
      return ncclBfloat16;
    case ir::DType::kF16:
      return ncclFloat16;
    case ir::DType::kI64:
      return ncclInt64;
    case ir::DType::kI32:
      return ncclInt32;
    case ir::DType::kU8:
      return ncclUint8;
    case ir::DType::kI8:
      return ncclInt8;
    default:
      return UNIMPLEMENTED() << "NCCL has no all-reduce for " << ir::DTypeName(t);
  }
}

absl::Status Cuda(cudaError_t e, const std::string& where) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(where + ": " + cudaGetErrorString(e));
}

absl::Status NcclError(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::InternalError(what + ": NCCL error " + std::to_string(static_cast<int>(r)) + " (" +
                             ncclGetErrorString(r) + ")");
}

}  // namespace

struct NcclComm::State {
  ncclComm_t comm = nullptr;
  // PrepareGroups' communicators of the groups this rank is in, by the group's ranks in ascending order.
  std::vector<std::pair<std::vector<int>, ncclComm_t>> groups;
  std::vector<ncclComm_t> All() const {
    std::vector<ncclComm_t> all = {comm};
    for (const auto& [ranks, c] : groups) all.push_back(c);
    return all;
  }
  cudaStream_t stream = nullptr;
  int device = 0;
  std::atomic<bool> stop{false}, aborted{false};
  std::mutex issue_mu;  // one thread issues on the communicator at a time
  std::thread watcher;
};

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(const NcclCommOptions& o) {
  RET_CHECK(o.backend != nullptr) << "NcclComm needs the CUDA backend";
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->backend_ = o.backend;
  c->state_ = std::make_unique<State>();
  c->state_->device = o.device;
  comm::TcpCommOptions t;
  t.rendezvous = o.rendezvous;
  t.timeout_s = o.timeout_s;
  t.silence_s = o.silence_s;
  t.backend = o.backend;
  ASSIGN_OR_RETURN(c->control_, comm::TcpComm::Create(t));
  // Rank 0's unique id to every rank, over the control plane.
  ncclUniqueId id;
  ir::Tensor bytes(ir::DType::kU8, {static_cast<int64_t>(sizeof(id))});
  if (c->rank() == 0) {
    RETURN_IF_ERROR(NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    std::memcpy(bytes.raw(), &id, sizeof(id));
    for (int r = 1; r < c->size(); ++r) RETURN_IF_ERROR(c->control_->Send(r, kUniqueIdTag, bytes, nullptr));
  } else {
    RETURN_IF_ERROR(c->control_->Recv(0, kUniqueIdTag, bytes, nullptr));
    std::memcpy(&id, bytes.raw(), sizeof(id));
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  RETURN_IF_ERROR(
      NcclError(ncclCommInitRank(&c->state_->comm, c->size(), id, c->rank()),
                "rank " + std::to_string(c->rank()) + ": ncclCommInitRank on GPU " + std::to_string(o.device)));
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&c->state_->stream, cudaStreamNonBlocking));
  // The watcher: a peer's failure (on the control plane) or an asynchronous NCCL error aborts the communicator,
  // which releases kernels waiting for a peer that is gone.
  NcclComm* self = c.get();
  c->state_->watcher = std::thread([self] {
    State& s = *self->state_;
    while (!s.stop.load()) {
      absl::Status reason = self->control_->abort_status();
      std::vector<ncclComm_t> comms;
      {
        std::lock_guard<std::mutex> lock(s.issue_mu);  // PrepareGroups may be adding one
        comms = s.All();
      }
      for (ncclComm_t c : comms) {
        ncclResult_t async = ncclSuccess;
        if (reason.ok() && ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          reason = NcclError(async, "rank " + std::to_string(self->rank()) + ": NCCL");
          self->control_->Abort(reason);
        }
      }
      if (!reason.ok() && !s.aborted.exchange(true)) {
        for (ncclComm_t c : comms) ncclCommAbort(c);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  return c;
}

NcclComm::~NcclComm() {
  if (state_ == nullptr) return;
  state_->stop = true;
  if (state_->watcher.joinable()) state_->watcher.join();
  if (!state_->aborted.load()) {
    for (const auto& [ranks, c] : state_->groups) ncclCommDestroy(c);
    if (state_->comm != nullptr) ncclCommDestroy(state_->comm);
  }
  if (state_->stream != nullptr) cudaStreamDestroy(state_->stream);
}

void NcclComm::Abort(const absl::Status& reason) {
  control_->Abort(reason);  // the peers learn it on the control plane; the watcher aborts the communicator
}

absl::Status NcclComm::CheckPeer(int peer, const char* verb) const {
  if (peer < 0 || peer >= size()) {  // itself included: NCCL sends to its own rank within a group
    return INVALID_ARGUMENT() << "rank " << rank() << " " << verb << " rank " << peer << ", not a rank of a world of "
                              << size();
  }
  return abort_status().ok() ? absl::OkStatus() : comm::AbortedStatus(abort_status());
}

absl::Status NcclComm::Issue(const std::vector<Transfer>& transfers, const char* what,
                             const std::function<int(const std::vector<void*>& data)>& issue) {
  if (!abort_status().ok()) return comm::AbortedStatus(abort_status());
  State& s = *state_;
  const std::string where = "rank " + std::to_string(rank()) + ": " + what;
  // Host tensors travel through device copies, made before and read back after on the host's order.
  std::vector<ir::Tensor> dev;
  std::vector<void*> data;
  std::vector<cudaStream_t> callers;
  bool host = false;
  std::unique_ptr<backend::Stream> staging;
  for (const Transfer& t : transfers) {
    dev.push_back(t.tensor);
    if (t.tensor.on_host()) {
      if (staging == nullptr) staging = backend_->CreateStream();
      ASSIGN_OR_RETURN(dev.back(), backend_->Upload(t.tensor, staging.get()));
      host = true;
    }
    data.push_back(dev.back().device_raw());
    const cudaStream_t caller = t.stream != nullptr ? NativeStream(t.stream) : nullptr;
    if (caller == nullptr) host = true;
    if (caller != nullptr && std::find(callers.begin(), callers.end(), caller) == callers.end()) callers.push_back(caller);
  }
  if (staging != nullptr) RETURN_IF_ERROR(staging->Synchronize());
  CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device));
  std::lock_guard<std::mutex> lock(s.issue_mu);
  std::vector<cudaEvent_t> events(callers.size() + 1, nullptr);
  for (cudaEvent_t& e : events) CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaEvent_t after = events.back();
  absl::Status st = absl::OkStatus();
  for (size_t i = 0; i < callers.size() && st.ok(); ++i) {
    st = Cuda(cudaEventRecord(events[i], callers[i]), where);
    if (st.ok()) st = Cuda(cudaStreamWaitEvent(s.stream, events[i], 0), where);
  }
  if (st.ok()) st = NcclError(static_cast<ncclResult_t>(issue(data)), where);
  if (st.ok()) st = Cuda(cudaEventRecord(after, s.stream), where);
  for (size_t i = 0; i < callers.size() && st.ok(); ++i) st = Cuda(cudaStreamWaitEvent(callers[i], after, 0), where);
  if (st.ok() && host) {
    // A host caller waits here; the control plane's abort releases a wait for a peer that is gone.
    while (st.ok() && cudaEventQuery(after) == cudaErrorNotReady) {
      if (!abort_status().ok()) st = comm::AbortedStatus(abort_status());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (st.ok()) st = Cuda(cudaEventSynchronize(after), where);
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  RETURN_IF_ERROR(st);
  for (size_t i = 0; i < transfers.size(); ++i) {
    if (!transfers[i].tensor.on_host() || !transfers[i].read_back) continue;
    ASSIGN_OR_RETURN(const ir::Tensor back, backend_->ToHost(dev[i]));
    ir::Tensor dst = transfers[i].tensor;
    if (back.num_bytes() > 0) std::memcpy(dst.raw(), back.raw(), back.num_bytes());
  }
  return absl::OkStatus();
}

absl::StatusOr<ir::Tensor> NcclComm::Own(const ir::Tensor& t, backend::Stream* stream) {
  return backend_->Clone(t, stream);
}

absl::Status NcclComm::IssueGroup(const std::vector<Grouped>& ops) {
  std::vector<Transfer> transfers;
  for (const Grouped& op : ops) {
    transfers.push_back({op.tensor, op.stream, !op.send});
    (op.send ? sent_ : received_) += op.tensor.num_bytes();
  }
  return Issue(transfers, "ncclGroupStart/End of sends and receives", [&](const std::vector<void*>& data) {
    ncclResult_t r = ncclGroupStart();
    for (size_t i = 0; i < ops.size() && r == ncclSuccess; ++i) {
      const size_t bytes = static_cast<size_t>(ops[i].tensor.num_bytes());
      r = ops[i].send ? ncclSend(data[i], bytes, ncclUint8, ops[i].peer, state_->comm, state_->stream)
                      : ncclRecv(data[i], bytes, ncclUint8, ops[i].peer, state_->comm, state_->stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    return static_cast<int>(r != ncclSuccess ? r : end);
  });
}

absl::Status NcclComm::SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  return IssueGroup({Grouped{true, dst, tag, t, stream}});
}

absl::Status NcclComm::RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  return IssueGroup({Grouped{false, src, tag, into, stream}});
}

absl::Status NcclComm::PrepareGroups(const std::vector<std::vector<int>>& groups) {
  State& s = *state_;
  std::vector<std::vector<int>> made;
  for (const std::vector<int>& g : groups) {
    std::vector<int> sorted = g;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty() || sorted.front() < 0 || sorted.back() >= size() ||
        std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return INVALID_ARGUMENT() << "rank " << rank() << ": group " << comm::RanksString(g)
                                << " is not a set of ranks of a world of " << size();
    }
    if (static_cast<int>(sorted.size()) == size() || std::find(made.begin(), made.end(), sorted) != made.end()) {
      continue;  // the world's communicator, or one made already: every rank skips the same ones
    }
    made.push_back(sorted);
    const bool member = std::binary_search(sorted.begin(), sorted.end(), rank());
    ncclComm_t sub = nullptr;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device));
    RETURN_IF_ERROR(NcclError(ncclCommSplit(s.comm, member ? 0 : NCCL_SPLIT_NOCOLOR, rank(), &sub, nullptr),
                              "rank " + std::to_string(rank()) + ": ncclCommSplit for the group " +
                                  comm::RanksString(g)));
    if (member) {
      std::lock_guard<std::mutex> lock(s.issue_mu);
      s.groups.emplace_back(sorted, sub);
    }
  }
  return absl::OkStatus();
}

absl::Status NcclComm::AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckNotGrouped("AllReduce"));
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  bool world = static_cast<int>(sorted.size()) == size();
  for (int i = 0; world && i < size(); ++i) world = sorted[i] == i;
  ncclComm_t comm = world ? state_->comm : nullptr;
  for (const auto& [members, c] : state_->groups) {
    if (!world && members == sorted) comm = c;
  }
  if (comm == nullptr) {
    return FAILED_PRECONDITION() << "rank " << rank() << ": an NCCL all-reduce over ranks " << comm::RanksString(ranks)
                                 << ", a group PrepareGroups did not make (with this rank in it)";
  }
  if (!t.has_data()) return INVALID_ARGUMENT() << "rank " << rank() << ": all-reduce of a tensor without data";
  ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(t.dtype()));
  const int64_t count = t.num_elements();
  return Issue({{t, stream, true}}, "ncclAllReduce", [&](const std::vector<void*>& data) {
    return static_cast<int>(
        ncclAllReduce(data[0], data[0], static_cast<size_t>(count), type, ncclSum, comm, state_->stream));
  });
}

}  // namespace onnxpipe::cuda
