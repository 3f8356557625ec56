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
      ncclResult_t async = ncclSuccess;
      if (reason.ok() && ncclCommGetAsyncError(s.comm, &async) == ncclSuccess && async != ncclSuccess &&
          async != ncclInProgress) {
        reason = NcclError(async, "rank " + std::to_string(self->rank()) + ": NCCL");
        self->control_->Abort(reason);
      }
      if (!reason.ok() && !s.aborted.exchange(true)) ncclCommAbort(s.comm);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  return c;
}

NcclComm::~NcclComm() {
  if (state_ == nullptr) return;
  state_->stop = true;
  if (state_->watcher.joinable()) state_->watcher.join();
  if (state_->comm != nullptr && !state_->aborted.load()) ncclCommDestroy(state_->comm);
  if (state_->stream != nullptr) cudaStreamDestroy(state_->stream);
}

void NcclComm::Abort(const absl::Status& reason) {
  control_->Abort(reason);  // the peers learn it on the control plane; the watcher aborts the communicator
}

absl::Status NcclComm::CheckPeer(int peer, const char* verb) const {
  if (peer < 0 || peer >= size() || peer == rank()) {
    return INVALID_ARGUMENT() << "rank " << rank() << " " << verb << " rank " << peer << ", not another rank of a "
                              << "world of " << size();
  }
  return abort_status().ok() ? absl::OkStatus() : comm::AbortedStatus(abort_status());
}

absl::Status NcclComm::Issue(const ir::Tensor& t, backend::Stream* stream, bool read_back, const char* what,
                             const std::function<int(void* data, int64_t bytes)>& issue) {
  if (!abort_status().ok()) return comm::AbortedStatus(abort_status());
  State& s = *state_;
  const std::string where = "rank " + std::to_string(rank()) + ": " + what;
  // Host tensors travel through a device copy, made and read back on the comm stream's order.
  ir::Tensor dev = t;
  std::unique_ptr<backend::Stream> staging;
  if (t.on_host()) {
    staging = backend_->CreateStream();
    ASSIGN_OR_RETURN(dev, backend_->Upload(t, staging.get()));
    RETURN_IF_ERROR(staging->Synchronize());
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(s.device));
  cudaStream_t caller = stream != nullptr ? NativeStream(stream) : nullptr;
  std::lock_guard<std::mutex> lock(s.issue_mu);
  cudaEvent_t before = nullptr, after = nullptr;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  absl::Status st = absl::OkStatus();
  if (caller != nullptr) {
    st = Cuda(cudaEventRecord(before, caller), where);
    if (st.ok()) st = Cuda(cudaStreamWaitEvent(s.stream, before, 0), where);
  }
  if (st.ok()) st = NcclError(static_cast<ncclResult_t>(issue(dev.device_raw(), dev.num_bytes())), where);
  if (st.ok()) st = Cuda(cudaEventRecord(after, s.stream), where);
  if (st.ok() && caller != nullptr) st = Cuda(cudaStreamWaitEvent(caller, after, 0), where);
  if (st.ok() && (caller == nullptr || t.on_host())) {
    // A host caller waits here; the control plane's abort releases a wait for a peer that is gone.
    while (st.ok() && cudaEventQuery(after) == cudaErrorNotReady) {
      if (!abort_status().ok()) st = comm::AbortedStatus(abort_status());
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (st.ok()) st = Cuda(cudaEventSynchronize(after), where);
  }
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  RETURN_IF_ERROR(st);
  if (t.on_host() && read_back) {
    ASSIGN_OR_RETURN(const ir::Tensor back, backend_->ToHost(dev));
    ir::Tensor dst = t;
    if (back.num_bytes() > 0) std::memcpy(dst.raw(), back.raw(), back.num_bytes());
  }
  return absl::OkStatus();
}

absl::Status NcclComm::SendNow(int dst, uint64_t tag, const ir::Tensor& t, backend::Stream* stream) {
  sent_ += t.num_bytes();
  return Issue(t, stream, /*read_back=*/false, "ncclSend", [&](void* data, int64_t bytes) {
    return static_cast<int>(ncclSend(data, static_cast<size_t>(bytes), ncclUint8, dst, state_->comm, state_->stream));
  });
}

absl::Status NcclComm::RecvNow(int src, uint64_t tag, const ir::Tensor& into, backend::Stream* stream) {
  received_ += into.num_bytes();
  return Issue(into, stream, /*read_back=*/true, "ncclRecv", [&](void* data, int64_t bytes) {
    return static_cast<int>(ncclRecv(data, static_cast<size_t>(bytes), ncclUint8, src, state_->comm, state_->stream));
  });
}

absl::Status NcclComm::AllReduce(const ir::Tensor& t, const std::vector<int>& ranks, backend::Stream* stream) {
  RETURN_IF_ERROR(CheckNotGrouped("AllReduce"));
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  bool world = static_cast<int>(sorted.size()) == size();
  for (int i = 0; world && i < size(); ++i) world = sorted[i] == i;
  if (!world) {
    return UNIMPLEMENTED() << "rank " << rank() << ": an NCCL all-reduce over ranks " << comm::RanksString(ranks)
                           << ": only the whole world's communicator exists (subgroups are not made yet)";
  }
  if (!t.has_data()) return INVALID_ARGUMENT() << "rank " << rank() << ": all-reduce of a tensor without data";
  ASSIGN_OR_RETURN(const ncclDataType_t type, NcclType(t.dtype()));
  const int64_t count = t.num_elements();
  return Issue(t, stream, /*read_back=*/true, "ncclAllReduce", [&](void* data, int64_t) {
    return static_cast<int>(
        ncclAllReduce(data, data, static_cast<size_t>(count), type, ncclSum, state_->comm, state_->stream));
  });
}

}  // namespace onnxpipe::cuda
