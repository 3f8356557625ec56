// Wire: per sender, an i64 pair [count, header bytes], a u8 header (for each tensor: name length, name, dtype, rank,
// dims, as little-endian u64 words and bytes), then the tensors in header order. The receiver sizes every buffer
// from what it already received, as Recv needs.
#include "executor/comm/gather.h"

#include <cstring>

#include "executor/comm/socket.h"
#include "frontend/ir/status.h"

namespace onnxpipe::comm {
namespace {

#define ONNXPIPE_COUNT_DTYPE(e, name, size) +1
constexpr uint64_t kNumDTypes = 0 ONNXPIPE_DTYPE_LIST(ONNXPIPE_COUNT_DTYPE);
#undef ONNXPIPE_COUNT_DTYPE

std::string Header(const NamedTensors& tensors) {
  std::string h;
  for (const auto& [name, t] : tensors) {
    PutU64(h, name.size());
    h += name;
    PutU64(h, static_cast<uint64_t>(t.dtype()));
    PutU64(h, t.dims().size());
    for (int64_t d : t.dims()) PutU64(h, static_cast<uint64_t>(d));
  }
  return h;
}

absl::StatusOr<std::vector<std::pair<std::string, ir::Tensor>>> ParseHeader(const std::string& h, int64_t count,
                                                                            int from) {
  std::vector<std::pair<std::string, ir::Tensor>> out;
  size_t at = 0;
  auto word = [&](uint64_t* v) {
    if (at + 8 > h.size()) return false;
    *v = GetU64(h.data() + at);
    at += 8;
    return true;
  };
  for (int64_t i = 0; i < count; ++i) {
    uint64_t len = 0, dtype = 0, rank = 0;
    if (!word(&len) || at + len > h.size()) break;
    std::string name = h.substr(at, len);
    at += len;
    if (!word(&dtype) || dtype >= kNumDTypes || !word(&rank) || rank > 16) break;
    std::vector<int64_t> dims(rank);
    bool ok = true;
    for (int64_t& d : dims) {
      uint64_t v = 0;
      ok = ok && word(&v);
      d = static_cast<int64_t>(v);
    }
    if (!ok) break;
    out.emplace_back(std::move(name), ir::Tensor(static_cast<ir::DType>(dtype), std::move(dims)));
  }
  if (static_cast<int64_t>(out.size()) != count || at != h.size()) {
    return COMM_ERROR(kDataLoss) << "gathering tensors: rank " << from << " sent a malformed list of " << count
                                 << " tensors";
  }
  return out;
}

}  // namespace

absl::StatusOr<NamedTensors> GatherNamedTensors(Comm& comm, const std::vector<int>& senders, int root, uint64_t tag,
                                                const NamedTensors& local) {
  if (comm.rank() != root) {
    const std::string h = Header(local);
    const ir::Tensor sizes =
        ir::Tensor::FromVector<int64_t>({2}, {static_cast<int64_t>(local.size()), static_cast<int64_t>(h.size())});
    ir::Tensor header(ir::DType::kU8, {static_cast<int64_t>(h.size())});
    if (!h.empty()) std::memcpy(header.mutable_data<uint8_t>(), h.data(), h.size());
    RETURN_IF_ERROR(comm.Send(root, tag, sizes, nullptr));
    RETURN_IF_ERROR(comm.Send(root, tag + 1, header, nullptr));
    uint64_t k = tag + 2;
    for (const auto& [name, t] : local) RETURN_IF_ERROR(comm.Send(root, k++, t, nullptr));
    return local;
  }
  NamedTensors all = local;
  for (int from : senders) {
    if (from == root) continue;
    ir::Tensor sizes(ir::DType::kI64, {2});
    RETURN_IF_ERROR(comm.Recv(from, tag, sizes, nullptr));
    const int64_t count = sizes.data<int64_t>()[0], bytes = sizes.data<int64_t>()[1];
    if (count < 0 || bytes < 0 || bytes > (int64_t{1} << 32)) {
      return COMM_ERROR(kDataLoss) << "gathering tensors: rank " << from << " announced " << count << " tensors in "
                                   << bytes << " header bytes";
    }
    ir::Tensor header(ir::DType::kU8, {bytes});
    RETURN_IF_ERROR(comm.Recv(from, tag + 1, header, nullptr));
    ASSIGN_OR_RETURN(
        auto tensors,
        ParseHeader(std::string(reinterpret_cast<const char*>(header.data<uint8_t>()), bytes), count, from));
    uint64_t k = tag + 2;
    for (auto& [name, t] : tensors) {
      RETURN_IF_ERROR(comm.Recv(from, k++, t, nullptr));
      all.emplace(name, std::move(t));  // the first holder's copy stays
    }
  }
  return all;
}

absl::Status Barrier(Comm& comm, const std::string& what) {
  std::vector<int> everyone(comm.size());
  for (int r = 0; r < comm.size(); ++r) everyone[r] = r;
  absl::Status st = comm.AllReduce(ir::Tensor::Scalar<float>(0), everyone, nullptr);
  if (!st.ok()) return absl::Status(st.code(), what + ": " + std::string(st.message()));
  return absl::OkStatus();
}

}  // namespace onnxpipe::comm
