// The backend interface (ggml-backend is the model): everything a driver (the pipeline's stage
// executor, training, evaluation) needs from the memory and compute of one device.
//
// - Memory: buffers come from Allocate and are placed on the backend's device (ir::Placement);
//   tensors over them are views (ir::Tensor::View with that placement). The driver never reads or
//   writes device memory itself: values reach the host by ToHost (an explicit copy, which waits
//   for the stream), host data reaches the device by FromHost/Upload, and device values are copied
//   or filled by Copy/Fill.
// - Compute: Run evaluates one node with the backend's kernel table (keyed by op, one table per
//   backend); WorkspaceBytes is the scratch the memory planner reserves for it; Accumulate and
//   AllFinite are the gradient accumulation and the non-finite check of the driver.
// - Order: work is issued on a Stream (a CUDA stream, a queue); an Event recorded on one stream
//   can be waited for by another (a stage waiting for a received value). A null stream is the
//   backend's default stream. The CPU backend is synchronous: its streams and events are no-ops.
// - Graphs: the work a thread issues on a stream between BeginCapture and EndCapture is recorded
//   as a Graph (a CUDA graph) that Launch replays with the same arguments: the same buffers and
//   the same host-side values. A kernel that must see a value that changes from replay to replay
//   reads it from device memory (ExecContext::device_offset; a device lr). While capturing, the
//   calls that would wait for the device or stage host memory fail (ToHost, FromHost,
//   Synchronize, AllFinite, Allocate and so Zeros/Upload/Clone); Capturable says which nodes'
//   kernels can be recorded at all.
//
// Implementations are shared by every stage thread: their methods are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/evaluator.h"
#include "frontend/ir/graph.h"

namespace onnxpipe::backend {

class Event {
 public:
  virtual ~Event() = default;
};

class Stream;

// Recorded work (Stream::EndCapture).
class Graph {
 public:
  virtual ~Graph() = default;
  // Issues the recorded work again on `stream` (of the backend that recorded it).
  virtual absl::Status Launch(Stream* stream) = 0;
};

class Stream {
 public:
  virtual ~Stream() = default;
  // The host waits until everything issued on the stream has finished.
  virtual absl::Status Synchronize() = 0;
  // Marks the work issued so far; another stream can Wait for it.
  virtual absl::StatusOr<std::shared_ptr<Event>> Record() = 0;
  // Work issued after this call starts after `event`'s work has finished.
  virtual absl::Status Wait(const Event& event) = 0;
  // As Record, with the time the marked work finished (a timing event costs more than Record's):
  // for SecondsBetween. A stream without timing events answers UNIMPLEMENTED.
  virtual absl::StatusOr<std::shared_ptr<Event>> RecordTimed();
  // Seconds between two RecordTimed events of this backend (`start` recorded first); waits for `end`.
  virtual absl::StatusOr<double> SecondsBetween(const Event& start, const Event& end);

  // Starts recording the work this thread issues on the stream. UNIMPLEMENTED where the backend has
  // no graphs.
  virtual absl::Status BeginCapture();
  // Ends the recording: the recorded work as a graph, and that work has been issued once (a CUDA
  // stream launches the new graph; a recording test backend ran it while recording). After an
  // error the stream is not capturing any more and the recorded work is dropped.
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture();
  // Ends the recording and drops it: none of the recorded work runs (after a kernel failed while
  // recording, the work recorded before it must not run either). OK on an invalidated capture.
  virtual absl::Status AbortCapture();
};

// One node evaluation's context: the random stream of a micro-batch (cpu::EvalContext's fields; a
// node evaluated twice with the same context, i.e. recomputed, draws the same dropout mask, and a
// micro-batch of rows [row_offset, row_offset + rows) draws those rows of the full batch's masks)
// and the stream to issue on.
struct ExecContext {
  bool training = false;
  uint64_t seed = 0;
  uint64_t offset = 0;
  int64_t row_offset = 0;
  int64_t rows = 0;
  Stream* stream = nullptr;
  // When set, kernels read `offset` from this backend memory (one uint64) when they run: a captured
  // graph's kernels then draw each replay's step (the driver updates it before launching).
  const uint64_t* device_offset = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual ir::Placement placement() const = 0;

  // --- Memory ---
  // Bytes a new allocation can still get on the device (CUDA: cudaMemGetInfo's free; the host: /proc/meminfo's
  // MemAvailable), so that a plan that cannot fit is refused before anything is allocated. UNIMPLEMENTED where
  // the backend cannot tell.
  virtual absl::StatusOr<int64_t> FreeMemoryBytes() const;
  // `bytes` of device memory (at least one byte, 64-byte aligned), contents undefined; freed when
  // the last tensor over it goes.
  virtual absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(int64_t bytes) const = 0;
  // Every byte of `dst` (a tensor on this backend) set to `byte`.
  virtual absl::Status Fill(const ir::Tensor& dst, uint8_t byte, Stream* stream = nullptr) const = 0;
  // dst = src, both on this backend, same dtype and dims.
  virtual absl::Status Copy(const ir::Tensor& src, const ir::Tensor& dst, Stream* stream = nullptr) const = 0;
  // dst (on this backend) = host (on the host), same dtype and dims.
  virtual absl::Status FromHost(const ir::Tensor& host, const ir::Tensor& dst, Stream* stream = nullptr) const = 0;
  // A host copy of `src` (on this backend), after the stream's earlier work.
  virtual absl::StatusOr<ir::Tensor> ToHost(const ir::Tensor& src, Stream* stream = nullptr) const = 0;

  // --- Compute ---
  // One tensor per node output (undefined for outputs not computed); inputs[i] undefined for an
  // absent optional input. Inputs are on this backend (or, for constants, on the host where the
  // backend's kernels read them as attributes). With `outputs` (a planned executor's slots) every
  // output and the kernel's scratch come from it; without, from fresh allocations.
  virtual absl::StatusOr<std::vector<ir::Tensor>> Run(const ir::Node& node, const std::vector<ir::Tensor>& inputs,
                                                      const ExecContext& ctx,
                                                      ir::OutputAllocator* outputs = nullptr) const = 0;
  // Runs independent nodes (none reads another's output), node i with inputs[i], as Run would one
  // after the other, and returns each node's outputs; a backend with a kernel covering several
  // such nodes at once (the multi-tensor optimizer updates) issues them together. An error names
  // the node it concerns (or the first node of a fused group).
  virtual absl::StatusOr<std::vector<std::vector<ir::Tensor>>> RunGroup(
      const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<ir::Tensor>>& inputs,
      const ExecContext& ctx, ir::OutputAllocator* outputs = nullptr) const;
  // Scratch bytes the kernel of `node` takes from OutputAllocator::Workspace (the memory plan's
  // workspace function).
  virtual int64_t WorkspaceBytes(const ir::Graph& g, const ir::Node& node) const = 0;
  // True when this backend's kernel for `node` reads input `index` on the host (a shape operand, a
  // scalar hyper-parameter such as lr): a constant all of whose readers say so stays on the host
  // instead of being uploaded, so reading it costs no synchronising copy.
  virtual bool ReadsOnHost(const ir::Node& node, int index) const { return false; }
  // True when `node`'s kernel can be recorded into a Graph (Stream::BeginCapture): it issues
  // stream work only, without waiting for the device or staging host memory. Asked after the node
  // has run once (a kernel choosing its path at the first run); false where there are no graphs.
  virtual bool Capturable(const ir::Node& node) const { return false; }
  // True when this backend's streams record graphs (Stream::BeginCapture).
  virtual bool CanCapture() const { return false; }
  // acc += x elementwise (the addition of the graph's gradient Sums); the caller owns acc's storage
  // exclusively.
  virtual absl::Status Accumulate(const ir::Tensor& acc, const ir::Tensor& x, Stream* stream = nullptr) const = 0;
  // False when a float tensor holds a NaN or an Inf (computed on the device; only the flag comes
  // back).
  virtual absl::StatusOr<bool> AllFinite(const ir::Tensor& t, Stream* stream = nullptr) const = 0;

  // --- Order ---
  virtual std::unique_ptr<Stream> CreateStream() const = 0;

  // --- Helpers over the calls above ---
  // A zero-filled tensor of its own on this backend.
  absl::StatusOr<ir::Tensor> Zeros(ir::DType dtype, std::vector<int64_t> dims, Stream* stream = nullptr) const;
  // A copy of `t` (on this backend, or on the host: then uploaded) in storage of its own.
  absl::StatusOr<ir::Tensor> Clone(const ir::Tensor& t, Stream* stream = nullptr) const;
  // `host` uploaded into storage of its own (a host tensor stays as it is on a host backend).
  absl::StatusOr<ir::Tensor> Upload(const ir::Tensor& host, Stream* stream = nullptr) const;
};

// `t`'s bytes without a share in their ownership (what a recorded graph holds: raw addresses, valid
// while their owner keeps them); t itself when it has no data.
ir::Tensor Unowned(const ir::Tensor& t);

// True when `v` has readers in `g` (`uses`: ir::Graph::ComputeUses) and `be` reads it on the host at
// every one of them (Backend::ReadsOnHost): a constant to keep on the host rather than upload.
bool ReadOnlyOnHost(const Backend& be, const ir::Graph& g, const std::vector<std::vector<ir::NodeId>>& uses,
                    ir::ValueId v);

// What the host can give this process without swapping, in bytes: /proc/meminfo's MemAvailable, lowered to the
// room left under the process's cgroup (v2) memory.max and its address-space limit (ulimit -v) when it has them.
absl::StatusOr<int64_t> HostAvailableBytes();

// The CPU backend: host memory, kernels of executor/cpu (cpu::CpuEvaluator), synchronous.
std::shared_ptr<const Backend> MakeCpuBackend();

}  // namespace onnxpipe::backend
