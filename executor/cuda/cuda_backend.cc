// Why the host fallback copies through the backend's own calls: the driver and the CPU kernels then
// see exactly the tensors they would on the CPU backend, so a model trains identically (bit for bit
// where every op falls back) whichever ops have CUDA kernels yet.
#include "executor/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <set>

#include "executor/backend/copy_checks.h"
#include "executor/cuda/backend_kernels.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"

namespace onnxpipe::cuda {
namespace {

// Copies to the host made by this thread (ToHost waits for the stream): a kernel that made one
// while it ran reads device data on the host (a label check, a shape operand) and cannot be
// captured into a graph.
thread_local int64_t host_reads = 0;

class CudaEvent : public backend::Event {
 public:
  explicit CudaEvent(cudaEvent_t e) : event(e) {}
  ~CudaEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event;
};

// An instantiated CUDA graph of one device.
class CudaGraph : public backend::Graph {
 public:
  CudaGraph(int device, cudaGraphExec_t exec) : device_(device), exec_(exec) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }
  absl::Status Launch(backend::Stream* stream) override;

 private:
  const int device_;
  cudaGraphExec_t exec_;
};

class CudaStream : public backend::Stream {
 public:
  CudaStream(int device, cudaStream_t s) : device_(device), stream_(s) {}
  ~CudaStream() override { cudaStreamDestroy(stream_); }
  cudaStream_t get() const { return stream_; }
  absl::Status Synchronize() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<backend::Event>> Record() override { return NewEvent(cudaEventDisableTiming); }
  absl::StatusOr<std::shared_ptr<backend::Event>> RecordTimed() override { return NewEvent(cudaEventDefault); }
  absl::StatusOr<double> SecondsBetween(const backend::Event& start, const backend::Event& end) override {
    const auto* a = dynamic_cast<const CudaEvent*>(&start);
    const auto* b = dynamic_cast<const CudaEvent*>(&end);
    if (a == nullptr || b == nullptr) return INVALID_ARGUMENT() << "SecondsBetween: not CUDA events";
    CUDA_RETURN_IF_ERROR(cudaEventSynchronize(b->event));
    float ms = 0;
    CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, a->event, b->event));
    return ms * 1e-3;
  }
  absl::Status Wait(const backend::Event& event) override {
    const auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr) return INVALID_ARGUMENT() << "a CUDA stream can only wait for a CUDA event";
    CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, e->event, 0));
    return absl::OkStatus();
  }
  // Thread-local capture: another stage's thread, not capturing, may use the CUDA API meanwhile.
  absl::Status BeginCapture() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<backend::Graph>> EndCapture() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);  // an invalidated capture fails here
    if (ended != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // not the next launch's error
      CUDA_RETURN_IF_ERROR(ended);
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_RETURN_IF_ERROR(made);
    auto g = std::make_unique<CudaGraph>(device_, exec);
    RETURN_IF_ERROR(g->Launch(this));  // the recorded work has not run yet
    return g;
  }
  absl::Status AbortCapture() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // an invalidated capture's error must not reach the next launch's check
    if (ended != cudaSuccess && ended != cudaErrorStreamCaptureInvalidated) CUDA_RETURN_IF_ERROR(ended);
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::shared_ptr<backend::Event>> NewEvent(unsigned flags) {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    cudaEvent_t e;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, flags));
    auto event = std::make_shared<CudaEvent>(e);
    CUDA_RETURN_IF_ERROR(cudaEventRecord(e, stream_));
    return event;
  }

  int device_;
  cudaStream_t stream_;
};

absl::Status CudaGraph::Launch(backend::Stream* stream) {
  auto* cs = dynamic_cast<CudaStream*>(stream);
  if (cs == nullptr) return INVALID_ARGUMENT() << "a CUDA graph is launched on a CUDA stream";
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, cs->get()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaStream>> NewStream(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t s;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return std::make_unique<CudaStream>(device, s);
}

class CudaBackendImpl : public CudaBackend {
 public:
  CudaBackendImpl(int device, CudaOptions options, std::unique_ptr<CudaStream> default_stream)
      : device_(device),
        options_(options),
        default_stream_(std::move(default_stream)),
        table_(RegisterAllKernels(options, device, attention_runs_)) {}

  std::string name() const override { return "cuda"; }
  ir::Placement placement() const override { return ir::Placement::Device(device_); }

  absl::StatusOr<int64_t> FreeMemoryBytes() const override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    size_t free = 0, total = 0;
    CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
    return static_cast<int64_t>(free);
  }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const override {
    if (bytes < 0) return INVALID_ARGUMENT() << "cannot allocate " << bytes << " bytes";
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)));
    if (err != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      return absl::ResourceExhaustedError("cuda: allocating " + std::to_string(bytes) + " bytes on GPU " +
                                          std::to_string(device_) + " failed: " + cudaGetErrorString(err));
    }
    const int device = device_;
    const std::shared_ptr<Counters> counters = counters_;
    const int64_t held = counters->allocated += bytes;
    for (int64_t peak = counters->peak; held > peak && !counters->peak.compare_exchange_weak(peak, held);) {
    }
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [device, counters, bytes](uint8_t* q) {
      cudaSetDevice(device);
      cudaFree(q);
      counters->allocated -= bytes;
    });
  }
  absl::Status Fill(const ir::Tensor& dst, uint8_t byte, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckPlaced(dst, placement(), "fill"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst.device_raw(), byte, dst.num_bytes(), Raw(s)));
    return absl::OkStatus();
  }
  absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckCopy(src, placement(), dst, placement()));
    if (src.num_bytes() == 0 || src.address() == dst.address()) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.device_raw(), src.device_raw(), src.num_bytes(), cudaMemcpyDeviceToDevice, Raw(s)));
    return absl::OkStatus();
  }
  absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckCopy(host, ir::Placement::Host(), dst, placement(), "copy from the host"));
    if (host.num_bytes() == 0) return absl::OkStatus();
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    // Pageable host memory: the call returns once the bytes are staged, so `host` may go at once.
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.device_raw(), host.raw(), host.num_bytes(), cudaMemcpyHostToDevice, Raw(s)));
    return absl::OkStatus();
  }
  absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckPlaced(src, placement(), "copy to the host"));
    ir::Tensor out(src.dtype(), src.dims());
    if (out.num_bytes() == 0) return out;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ++host_reads;
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.raw(), src.device_raw(), out.num_bytes(), cudaMemcpyDeviceToHost, Raw(s)));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(Raw(s)));
    return out;
  }

  absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                              const backend::ExecContext& ctx,
                                              ir::OutputAllocator* outputs) const override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (auto it = table_.find(node.op); it != table_.end() && Placed(inputs, it->second.host_inputs)) {
      const int64_t reads = host_reads;
      KernelResult r = WithKernelContext<std::vector<ir::Tensor>>(
          ctx, outputs, [&](const KernelContext& kc) { return it->second.run(kc, node, inputs); });
      if (host_reads != reads) MarkHostBound({&node});
      if (r.has_value()) return *std::move(r);
    }
    return HostFallback(node, inputs, ctx, outputs);
  }
  absl::StatusOr<std::vector<std::vector<ir::Tensor>>> RunGroup(const std::vector<const ir::Node*>& nodes,
                                                                const std::vector<std::vector<ir::Tensor>>& inputs,
                                                                const backend::ExecContext& ctx,
                                                                ir::OutputAllocator* outputs) const override {
    auto it = nodes.empty() || nodes.size() != inputs.size() ? table_.end() : table_.find(nodes[0]->op);
    bool fits = it != table_.end() && it->second.group;
    for (size_t i = 0; fits && i < nodes.size(); ++i)
      fits = nodes[i]->op == nodes[0]->op && Placed(inputs[i], it->second.host_inputs);
    if (fits) {
      CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
      const int64_t reads = host_reads;
      GroupResult r = WithKernelContext<std::vector<std::vector<ir::Tensor>>>(
          ctx, outputs, [&](const KernelContext& kc) { return it->second.group(kc, nodes, inputs); });
      if (host_reads != reads) MarkHostBound(nodes);
      if (r.has_value()) return *std::move(r);
    }
    return Backend::RunGroup(nodes, inputs, ctx, outputs);
  }
  int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const override {
    // Host fallbacks use the host's scratch, not the plan's.
    auto it = table_.find(node.op);
    return it != table_.end() && it->second.workspace ? it->second.workspace(g, node) : 0;
  }
  absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckCopy(x, placement(), acc, placement(), "accumulate"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const int64_t n = acc.num_elements();
    if (acc.dtype() == ir::DType::kF32) {
      CUDA_RETURN_IF_ERROR(LaunchAccumulateF32(static_cast<float*>(acc.device_raw()),
                                               static_cast<const float*>(x.device_raw()), n, Raw(s)));
    } else if (acc.dtype() == ir::DType::kF64) {
      CUDA_RETURN_IF_ERROR(LaunchAccumulateF64(static_cast<double*>(acc.device_raw()),
                                               static_cast<const double*>(x.device_raw()), n, Raw(s)));
    } else {
      return UNIMPLEMENTED() << "gradient accumulation in " << ir::DTypeName(acc.dtype());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<bool> AllFinite(const ir::Tensor& t, backend::Stream* s) const override {
    RETURN_IF_ERROR(backend::CheckPlaced(t, placement(), "check for non-finite values"));
    if (t.dtype() != ir::DType::kF32 && t.dtype() != ir::DType::kF64 && t.dtype() != ir::DType::kBF16) return true;
    ASSIGN_OR_RETURN(ir::Tensor flag, Zeros(ir::DType::kI32, {}, s));
    int* f = static_cast<int*>(flag.device_raw());
    const int64_t n = t.num_elements();
    if (t.dtype() == ir::DType::kF32) {
      CUDA_RETURN_IF_ERROR(LaunchFlagNonFiniteF32(static_cast<const float*>(t.device_raw()), n, f, Raw(s)));
    } else if (t.dtype() == ir::DType::kF64) {
      CUDA_RETURN_IF_ERROR(LaunchFlagNonFiniteF64(static_cast<const double*>(t.device_raw()), n, f, Raw(s)));
    } else {
      CUDA_RETURN_IF_ERROR(LaunchFlagNonFiniteBF16(static_cast<const uint16_t*>(t.device_raw()), n, f, Raw(s)));
    }
    ASSIGN_OR_RETURN(ir::Tensor host, ToHost(flag, s));
    return host.data<int32_t>()[0] == 0;
  }
  // A node whose kernel is host-bound, or that so far ran on the host or read device data there,
  // runs between graphs.
  bool Capturable(const ir::Node& node) const override {
    auto it = table_.find(node.op);
    if (it == table_.end() || it->second.host_bound) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return !host_run_.count(&node);
  }
  bool CanCapture() const override { return true; }
  bool ReadsOnHost(const ir::Node& node, int index) const override {
    auto it = table_.find(node.op);
    return it != table_.end() && index < 32 && (it->second.host_inputs >> index & 1u) != 0;
  }
  std::unique_ptr<backend::Stream> CreateStream() const override {
    absl::StatusOr<std::unique_ptr<CudaStream>> s = NewStream(device_);
    if (!s.ok()) return nullptr;
    return *std::move(s);
  }

  MemoryStats Memory() const override {
    MemoryStats m;
    m.allocated = counters_->allocated;
    m.peak_allocated = counters_->peak;
    size_t free = 0, total = 0;
    if (cudaSetDevice(device_) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) {
      m.device_used = static_cast<int64_t>(total - free);
      m.device_total = static_cast<int64_t>(total);
    }
    return m;
  }

  std::map<std::string, int64_t> HostFallbacks() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return fallbacks_;
  }
  std::map<std::string, int64_t> AttentionRuns() const override {
    return {{"cudnn", attention_runs_->cudnn.load()}, {"flash", attention_runs_->flash.load()}};
  }

 private:
  cudaStream_t Raw(backend::Stream* s) const {
    auto* cs = dynamic_cast<CudaStream*>(s);
    return cs != nullptr ? cs->get() : default_stream_->get();
  }
  // Every input with data is on this device, except those `host_inputs` allows on the host.
  bool Placed(const std::vector<ir::Tensor>& inputs, uint32_t host_inputs) const {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ir::Tensor& t = inputs[i];
      if (!t.has_data() || t.placement() == placement()) continue;
      if (i < 32 && (host_inputs >> i & 1u) != 0 && t.on_host()) continue;
      return false;
    }
    return true;
  }

  // f(kernel context of ctx): a kernel function's result (nullopt: no kernel for these inputs);
  // its temporaries are freed stream-ordered after it, and a launch error is the result.
  template <typename R, typename F>
  std::optional<absl::StatusOr<R>> WithKernelContext(const backend::ExecContext& ctx, ir::OutputAllocator* outputs,
                                                     F&& f) const {
    std::vector<void*> temporaries;
    const KernelContext kc{this, Raw(ctx.stream), ctx, outputs, options_.allow_tf32, &temporaries};
    std::optional<absl::StatusOr<R>> r = f(kc);
    // Stream-ordered frees: the memory returns to the pool once the kernel's work has finished.
    for (void* p : temporaries) CUDA_RETURN_IF_ERROR(cudaFreeAsync(p, kc.stream));
    if (r.has_value() && r->ok()) CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return r;
  }
  absl::StatusOr<std::vector<ir::Tensor>> HostFallback(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                                       const backend::ExecContext& ctx,
                                                       ir::OutputAllocator* outputs) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++fallbacks_[std::string(ir::OpName(node.op))];
    }
    MarkHostBound({&node});
    std::vector<ir::Tensor> host_in;
    host_in.reserve(inputs.size());
    for (const ir::Tensor& t : inputs) {
      if (!t.has_data() || t.on_host()) {
        host_in.push_back(t);
      } else {
        ASSIGN_OR_RETURN(ir::Tensor h, ToHost(t, ctx.stream));
        host_in.push_back(std::move(h));
      }
    }
    backend::ExecContext host_ctx = ctx;
    host_ctx.stream = nullptr;
    if (ctx.device_offset != nullptr) {  // the step in device memory (graphs): the host kernel takes its value
      ++host_reads;
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host_ctx.offset, ctx.device_offset, sizeof(host_ctx.offset),
                                           cudaMemcpyDeviceToHost, Raw(ctx.stream)));
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(Raw(ctx.stream)));
      host_ctx.device_offset = nullptr;
    }
    ASSIGN_OR_RETURN(std::vector<ir::Tensor> host_out, cpu_->Run(node, host_in, host_ctx, nullptr));
    std::vector<ir::Tensor> out(host_out.size());
    for (size_t k = 0; k < host_out.size() && k < node.outputs.size(); ++k) {
      const ir::Tensor& h = host_out[k];
      if (!h.has_data()) {
        out[k] = h;
        continue;
      }
      if (outputs != nullptr && outputs->SharesInputBuffer(node, static_cast<int>(k)) && inputs[0].has_data() &&
          !inputs[0].on_host()) {
        out[k] = inputs[0].Reshaped(h.dims());  // a view of the device input, as planned
        continue;
      }
      ir::Tensor slot;
      if (outputs != nullptr) {
        ASSIGN_OR_RETURN(slot, outputs->Allocate(node, static_cast<int>(k), h.dtype(), h.dims()));
      } else {
        ASSIGN_OR_RETURN(std::shared_ptr<uint8_t> b, Allocate(h.num_bytes()));
        slot = ir::Tensor::View(h.dtype(), h.dims(), std::move(b), 0, placement());
      }
      RETURN_IF_ERROR(FromHost(h, slot, ctx.stream));
      out[k] = std::move(slot);
    }
    // The host tensors go when this returns: the copies must have left them.
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(Raw(ctx.stream)));
    return out;
  }

  // Bytes held in Allocate's buffers (they may outlive the backend, hence shared).
  struct Counters {
    std::atomic<int64_t> allocated{0}, peak{0};
  };

  const int device_;
  const CudaOptions options_;
  const std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();
  // Before table_, whose attention entries count into it.
  const std::shared_ptr<AttentionRunCounts> attention_runs_ = std::make_shared<AttentionRunCounts>();
  std::unique_ptr<CudaStream> default_stream_;
  const KernelTable table_;
  std::shared_ptr<const backend::Backend> cpu_ = backend::MakeCpuBackend();
  mutable std::mutex mu_;
  mutable std::map<std::string, int64_t> fallbacks_;
  mutable std::set<const ir::Node*> host_run_;  // nodes that ran on the host or read device data there
  void MarkHostBound(const std::vector<const ir::Node*>& nodes) const {
    std::lock_guard<std::mutex> lock(mu_);
    host_run_.insert(nodes.begin(), nodes.end());
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<CudaBackend>> CudaBackend::Create(int device, CudaOptions options) {
  const int n = DeviceCount();
  if (n == 0) return FAILED_PRECONDITION() << "--backend cuda: no usable CUDA GPU (no device or no driver)";
  if (device < 0 || device >= n) {
    return INVALID_ARGUMENT() << "--device " << device << ": this machine has " << n << " CUDA GPU(s), 0 to " << n - 1;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaStream> s, NewStream(device));
  return std::make_shared<CudaBackendImpl>(device, options, std::move(s));
}

CUstream_st* NativeStream(backend::Stream* stream) {
  const auto* s = dynamic_cast<const CudaStream*>(stream);
  return s ? s->get() : nullptr;
}

}  // namespace onnxpipe::cuda
