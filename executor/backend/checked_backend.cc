#include "executor/backend/checked_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>

#include "executor/backend/copy_checks.h"
#include "frontend/ir/status.h"

namespace onnxpipe::backend {
namespace {

constexpr ir::Placement kDevice{ir::Placement::Kind::kDevice, 7};

// Every live checked buffer (start -> length in pages' bytes), and the ones the calls in progress
// have opened.
class Regions {
 public:
  static Regions& Get() {
    static Regions* r = new Regions();
    return *r;
  }
  std::recursive_mutex mu;
  std::map<uintptr_t, size_t> live;
  std::set<uintptr_t> open;
  int depth = 0;

  // The buffer holding `p`, or 0.
  uintptr_t Find(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = live.upper_bound(a);
    if (it == live.begin()) return 0;
    --it;
    return a < it->first + it->second ? it->first : 0;
  }
  void Open(const void* p) {
    const uintptr_t start = Find(p);
    if (start == 0 || !open.insert(start).second) return;
    mprotect(reinterpret_cast<void*>(start), live.at(start), PROT_READ | PROT_WRITE);
  }
  void CloseAll() {
    for (uintptr_t start : open) mprotect(reinterpret_cast<void*>(start), live.at(start), PROT_NONE);
    open.clear();
  }
};

// One backend call: holds the lock, opens what it touches, closes everything when the outermost
// call ends.
class Call {
 public:
  Call() : lock_(Regions::Get().mu) { ++Regions::Get().depth; }
  ~Call() {
    Regions& r = Regions::Get();
    if (--r.depth == 0) r.CloseAll();
  }
  // A host-placed view of t (its buffer opened) for the CPU kernels.
  ir::Tensor Host(const ir::Tensor& t) {
    if (!t.has_data() || t.on_host()) return t;
    Regions::Get().Open(t.address());
    return t.WithPlacement(ir::Placement::Host());
  }

 private:
  std::unique_lock<std::recursive_mutex> lock_;
};

// Hands the kernels host-placed views of the driver's planned slots (opened for the call).
class OpenedSlots : public ir::OutputAllocator {
 public:
  explicit OpenedSlots(ir::OutputAllocator* inner, Call& call) : inner_(inner), call_(call) {}
  absl::StatusOr<ir::Tensor> Allocate(const ir::Node& node, int index, ir::DType dtype,
                                      const std::vector<int64_t>& dims) override {
    ASSIGN_OR_RETURN(ir::Tensor t, inner_->Allocate(node, index, dtype, dims));
    return call_.Host(t);
  }
  bool SharesInputBuffer(const ir::Node& node, int index) const override {
    return inner_->SharesInputBuffer(node, index);
  }
  absl::StatusOr<void*> Workspace(const ir::Node& node, int64_t bytes) override {
    ASSIGN_OR_RETURN(void* p, inner_->Workspace(node, bytes));
    Regions::Get().Open(p);
    return p;
  }

 private:
  ir::OutputAllocator* inner_;
  Call& call_;
};

class CheckedBackend : public Backend {
 public:
  std::string name() const override { return "checked"; }
  ir::Placement placement() const override { return kDevice; }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override { return HostAvailableBytes(); }

  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const override {
    if (bytes < 0) return INVALID_ARGUMENT() << "cannot allocate " << bytes << " bytes";
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t len = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return absl::ResourceExhaustedError("checked backend: mmap of " + std::to_string(len) + " bytes failed");
    {
      Call call;
      Regions::Get().live[reinterpret_cast<uintptr_t>(p)] = len;
    }
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [len](uint8_t* q) {
      Call call;
      Regions& r = Regions::Get();
      r.open.erase(reinterpret_cast<uintptr_t>(q));
      r.live.erase(reinterpret_cast<uintptr_t>(q));
      munmap(q, len);
    });
  }
  absl::Status Fill(const ir::Tensor& dst, uint8_t byte, Stream* s) const override {
    RETURN_IF_ERROR(CheckPlaced(dst, placement(), "fill"));
    Call call;
    return cpu_->Fill(call.Host(dst), byte, s);
  }
  absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, Stream* s) const override {
    RETURN_IF_ERROR(CheckCopy(src, placement(), dst, placement()));
    Call call;
    return cpu_->Copy(call.Host(src), call.Host(dst), s);
  }
  absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, Stream* s) const override {
    RETURN_IF_ERROR(CheckCopy(host, ir::Placement::Host(), dst, placement(), "copy from the host"));
    Call call;
    return cpu_->Copy(host, call.Host(dst), s);
  }
  absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, Stream* s) const override {
    RETURN_IF_ERROR(CheckPlaced(src, placement(), "copy to the host"));
    Call call;
    return cpu_->ToHost(call.Host(src), s);
  }

  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const ExecContext& ctx, ir::OutputAllocator* outputs) const override {
    Call call;
    std::vector<ir::Tensor> in;
    in.reserve(inputs.size());
    for (const ir::Tensor& t : inputs) in.push_back(call.Host(t));
    OpenedSlots slots(outputs, call);
    ASSIGN_OR_RETURN(std::vector<ir::Tensor> out, cpu_->Run(node, in, ctx, outputs ? &slots : nullptr));
    for (ir::Tensor& t : out) {
      if (!t.has_data()) continue;
      if (Regions::Get().Find(t.address()) != 0) {
        t = t.WithPlacement(placement());
      } else if (!outputs) {  // a fresh host result: into checked memory of its own
        ASSIGN_OR_RETURN(t, Clone(t, ctx.stream));
      }
    }
    return out;
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    return cpu_->WorkspaceBytes(g, node);
  }
  absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, Stream* s) const override {
    RETURN_IF_ERROR(CheckCopy(x, placement(), acc, placement(), "accumulate"));
    Call call;
    return cpu_->Accumulate(call.Host(acc), call.Host(x), s);
  }
  absl::StatusOr<bool> AllFinite(const ir::Tensor& t, Stream* s) const override {
    RETURN_IF_ERROR(CheckPlaced(t, placement(), "check for non-finite values"));
    Call call;
    return cpu_->AllFinite(call.Host(t), s);
  }
  std::unique_ptr<Stream> CreateStream() const override { return cpu_->CreateStream(); }

 private:
  std::shared_ptr<const Backend> cpu_ = MakeCpuBackend();
};

}  // namespace

std::shared_ptr<const Backend> MakeCheckedBackend() { return std::make_shared<CheckedBackend>(); }

}  // namespace onnxpipe::backend
