#include "executor/backend/backend.h"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "frontend/ir/status.h"

namespace onnxpipe::backend {

absl::StatusOr<std::shared_ptr<Event>> Stream::RecordTimed() {
  return UNIMPLEMENTED() << "this stream has no timing events";
}

absl::StatusOr<double> Stream::SecondsBetween(const Event&, const Event&) {
  return UNIMPLEMENTED() << "this stream has no timing events";
}

ir::Tensor Unowned(const ir::Tensor& t) {
  if (!t.has_data()) return t;
  // An aliasing pointer with no owner: the address, and a use count of 0.
  std::shared_ptr<uint8_t> bytes(std::shared_ptr<uint8_t>(), static_cast<uint8_t*>(const_cast<void*>(t.address())));
  return ir::Tensor::View(t.dtype(), t.dims(), std::move(bytes), 0, t.placement());
}

absl::Status Stream::BeginCapture() { return UNIMPLEMENTED() << "this stream cannot record graphs"; }

absl::StatusOr<std::unique_ptr<Graph>> Stream::EndCapture() {
  return UNIMPLEMENTED() << "this stream cannot record graphs";
}

absl::Status Stream::AbortCapture() { return UNIMPLEMENTED() << "this stream cannot record graphs"; }

absl::StatusOr<std::vector<std::vector<ir::Tensor>>> Backend::RunGroup(
    const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<ir::Tensor>>& inputs,
    const ExecContext& ctx, ir::OutputAllocator* outputs) const {
  RET_CHECK(nodes.size() == inputs.size()) << nodes.size() << " nodes with " << inputs.size() << " input lists";
  std::vector<std::vector<ir::Tensor>> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    absl::StatusOr<std::vector<ir::Tensor>> r = Run(*nodes[i], inputs[i], ctx, outputs);
    if (!r.ok()) return Annotate(r.status(), ir::NodeLabel(*nodes[i]));
    out.push_back(*std::move(r));
  }
  return out;
}

absl::StatusOr<ir::Tensor> Backend::Zeros(ir::DType dtype, std::vector<int64_t> dims, Stream* stream) const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> buffer, Allocate(n * ir::DTypeSize(dtype)));
  ir::Tensor t = ir::Tensor::View(dtype, std::move(dims), std::move(buffer), 0, placement());
  RETURN_IF_ERROR(Fill(t, 0, stream));
  return t;
}

absl::StatusOr<ir::Tensor> Backend::Clone(const ir::Tensor& t, Stream* stream) const {
  if (!t.has_data()) return t;
  if (t.on_host() && placement().host()) return t.Clone();
  ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> buffer, Allocate(t.num_bytes()));
  ir::Tensor out = ir::Tensor::View(t.dtype(), t.dims(), std::move(buffer), 0, placement());
  RETURN_IF_ERROR(t.on_host() ? FromHost(t, out, stream) : Copy(t, out, stream));
  return out;
}

absl::StatusOr<ir::Tensor> Backend::Upload(const ir::Tensor& host, Stream* stream) const {
  if (placement().host() || !host.has_data()) return host;
  return Clone(host, stream);
}

absl::StatusOr<int64_t> Backend::FreeMemoryBytes() const {
  return absl::UnimplementedError(name() + " backend: no free-memory query");
}

namespace {

// The first "<key> <n> kB" line of a /proc file, in bytes; -1 when absent.
int64_t ProcKib(const char* path, const char* key) {
  std::ifstream in(path);
  const std::string prefix = std::string(key) + ":";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;
  }
  return -1;
}

// A number in a cgroup file ("max" or absent: -1).
int64_t CgroupValue(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return -1;
  return std::stoll(v);
}

}  // namespace

absl::StatusOr<int64_t> HostAvailableBytes() {
  int64_t avail = ProcKib("/proc/meminfo", "MemAvailable");
  if (avail < 0) return absl::UnimplementedError("/proc/meminfo has no MemAvailable line");
  // A job's own limits count too: a Slurm or container cgroup (v2) and the address-space limit (ulimit -v).
  const int64_t cg_max = CgroupValue("/sys/fs/cgroup/memory.max");
  const int64_t cg_cur = CgroupValue("/sys/fs/cgroup/memory.current");
  if (cg_max >= 0 && cg_cur >= 0) avail = std::min(avail, std::max<int64_t>(cg_max - cg_cur, 0));
  struct rlimit as = {};
  const int64_t vm_size = ProcKib("/proc/self/status", "VmSize");
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && vm_size >= 0) {
    avail = std::min(avail, std::max<int64_t>(static_cast<int64_t>(as.rlim_cur) - vm_size, 0));
  }
  return avail;
}

bool ReadOnlyOnHost(const Backend& be, const ir::Graph& g, const std::vector<std::vector<ir::NodeId>>& uses,
                    ir::ValueId v) {
  if (uses[v].empty()) return false;
  for (ir::NodeId id : uses[v]) {
    const ir::Node& n = g.node(id);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] == v && !be.ReadsOnHost(n, static_cast<int>(i))) return false;
  }
  return true;
}

}  // namespace onnxpipe::backend
