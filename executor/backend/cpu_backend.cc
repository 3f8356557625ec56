// The CPU backend: host memory, the kernels of executor/cpu through cpu::CpuEvaluator (thread-safe:
// it keeps no state but its default context, and every call passes one), synchronous streams.
// Accumulation is acc[i] + x[i], the addition the unpartitioned graph's gradient Sums perform.
#include <chrono>
#include <cstring>
#include <new>

#include "executor/backend/backend.h"
#include "executor/backend/copy_checks.h"
#include "executor/cpu/cpu_evaluator.h"
#include "executor/cpu/thread_pool.h"
#include "executor/cpu/workspace.h"
#include "executor/runtime/interpreter.h"
#include "frontend/ir/status.h"

namespace onnxpipe::backend {
namespace {

template <typename T>
void AddInto(T* acc, const T* x, int64_t n) {
  cpu::ParallelFor(n, 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) acc[i] += x[i];
  });
}

// The host is synchronous: a timed event's time is when it was recorded.
class HostEvent : public Event {
 public:
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

class HostStream : public Stream {
 public:
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<Event>> Record() override { return std::make_shared<Event>(); }
  absl::Status Wait(const Event&) override { return absl::OkStatus(); }
  absl::StatusOr<std::shared_ptr<Event>> RecordTimed() override { return std::make_shared<HostEvent>(); }
  absl::StatusOr<double> SecondsBetween(const Event& start, const Event& end) override {
    const auto* a = dynamic_cast<const HostEvent*>(&start);
    const auto* b = dynamic_cast<const HostEvent*>(&end);
    if (a == nullptr || b == nullptr) return INVALID_ARGUMENT() << "SecondsBetween: not timed host events";
    return std::chrono::duration<double>(b->at - a->at).count();
  }
};

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  ir::Placement placement() const override { return ir::Placement::Host(); }

  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const override {
    if (bytes < 0) return INVALID_ARGUMENT() << "cannot allocate " << bytes << " bytes";
    try {
      return ir::Tensor::AllocateBuffer(bytes);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("cpu: allocating " + std::to_string(bytes) +
                                          " bytes of host memory failed (out of memory)");
    }
  }
  absl::StatusOr<int64_t> FreeMemoryBytes() const override { return HostAvailableBytes(); }
  absl::Status Fill(const ir::Tensor& dst, uint8_t byte, Stream*) const override {
    RETURN_IF_ERROR(CheckPlaced(dst, placement(), "fill"));
    if (dst.num_bytes() > 0) std::memset(dst.device_raw(), byte, dst.num_bytes());
    return absl::OkStatus();
  }
  absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, Stream*) const override {
    RETURN_IF_ERROR(CheckCopy(src, placement(), dst, placement()));
    if (src.num_bytes() > 0 && src.address() != dst.address())
      std::memmove(dst.device_raw(), src.device_raw(), src.num_bytes());
    return absl::OkStatus();
  }
  absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, Stream* s) const override {
    return Copy(host, dst, s);
  }
  absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, Stream*) const override {
    RETURN_IF_ERROR(CheckPlaced(src, placement(), "copy to the host"));
    return src.Clone();
  }

  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const ExecContext& ctx, ir::OutputAllocator* outputs) const override {
    cpu::EvalContext c;
    c.training = ctx.training;
    c.seed = ctx.seed;
    c.offset = ctx.device_offset != nullptr ? *ctx.device_offset : ctx.offset;
    c.row_offset = ctx.row_offset;
    c.rows = ctx.rows;
    c.outputs = outputs;
    return evaluator_.Evaluate(node, inputs, c);
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    return cpu::CpuWorkspaceBytes(g, node);
  }
  absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, Stream*) const override {
    RETURN_IF_ERROR(CheckCopy(x, placement(), acc, placement(), "accumulate"));
    const int64_t n = acc.num_elements();
    ir::Tensor a = acc;
    if (acc.dtype() == ir::DType::kF32) {
      AddInto(a.mutable_data<float>(), x.data<float>(), n);
    } else if (acc.dtype() == ir::DType::kF64) {
      AddInto(a.mutable_data<double>(), x.data<double>(), n);
    } else {
      return UNIMPLEMENTED() << "gradient accumulation in " << ir::DTypeName(acc.dtype());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<bool> AllFinite(const ir::Tensor& t, Stream*) const override {
    RETURN_IF_ERROR(CheckPlaced(t, placement(), "check for non-finite values"));
    return runtime::AllFinite(t);
  }
  std::unique_ptr<Stream> CreateStream() const override { return std::make_unique<HostStream>(); }

 private:
  cpu::CpuEvaluator evaluator_;
};

}  // namespace

std::shared_ptr<const Backend> MakeCpuBackend() { return std::make_shared<CpuBackend>(); }

}  // namespace onnxpipe::backend
