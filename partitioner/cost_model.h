// Phase 1 of the partitioner: the cost of every node of a shape-bound training graph.
//
// Roofline: time = op_overhead + max(FLOPs / (peak * compute_efficiency),
//                                    bytes / (bandwidth * memory_efficiency)),
// with the GEMM peak of the precision for GEMM-class ops (MatMul, Gemm, Linear, FusedMatMul,
// Attention, AttentionGrad) and the vector peak for everything else. Bytes are the non-shape-only
// operands read plus the outputs written, at their dtypes' sizes (a bf16 training graph's
// activations and weight copies: 2 bytes; masters, gradients and optimizer state: 4). Views (Reshape,
// Flatten, (Un)Squeeze, Identity, ReshapeLike) and Shape cost nothing: no kernel runs.
// Attention is costed as a fused (flash-style) kernel: its FLOPs are the two GEMMs plus the
// softmax, its bytes Q, K, V, mask and O only (no S x S matrix), causal masks halve the work.
//
// Measured times (`--profile times.json`, written by `onnxpipe profile`) replace the roofline for
// the nodes they name. Format "onnxpipe-op-times/1":
//   {
//     "format": "onnxpipe-op-times/1",
//     "model": "m.onnx", "backend": "cpu", "dtype": "fp32", "optimizer": "sgd",
//     "device": "h100-80gb",     optional: the built-in device measured on ("" or absent: unknown)
//     "microbatch": 4,           the batch the training graph was bound to when measuring
//     "seq": 64,                 0 when the model has no sequence dim
//     "repeats": 5,              each node's time is the median over this many runs
//     "created": "2026-12-02T16:00:00Z",
//     "ops": [ {"node": "<training-graph node name>", "op": "Linear", "phase": "forward",
//               "ms": 0.123,
//               "scratch_bytes": 4194304}, ... ]   optional: the kernel scratch the backend's
//                                                   WorkspaceBytes gave for the node at this
//                                                   micro-batch (an integer >= 0)
//   }
// Node names are those of the training graph onnxpipe builds (forward names come from the ONNX
// file, backward and optimizer names from autodiff), so a profile fits every plan of the same
// model, optimizer and sequence length. Forward and backward times are scaled linearly from the
// profile's micro-batch to the plan's; optimizer times are per step and not scaled. Nodes the
// profile does not name fall back to the roofline (the plan reports how many).
// Kernel scratch: a profile measured on the backend of the plan's device kind (cuda for a GPU)
// supplies PartitionOptions::workspace (ProfileScratch): a GPU's cuBLASLt and cuDNN scratch sizes
// are only known on the device. The sizes are used as measured, whatever the plan's micro-batch;
// nodes without "scratch_bytes" (profiles written before the field, or not named) count as 0.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "frontend/ir/graph.h"
#include "nlohmann/json.hpp"
#include "partitioner/device.h"

namespace onnxpipe::partitioner {

struct OpCost {
  double flops = 0;
  double bytes = 0;
  bool gemm = false;  // uses the GEMM peak
  bool free = false;  // a view or metadata op: no kernel
};

// FLOPs and bytes of one node. Shapes must be concrete (unknown dims count as 1).
OpCost EstimateOpCost(const ir::Graph& g, const ir::Node& n);
double RooflineSeconds(const OpCost& c, const DeviceProfile& d, Precision precision);

// One ring all-reduce of a `bytes` tensor over `ranks` ranks (reduce-scatter, then all-gather):
// 2 (n - 1) steps of one `latency_s` each, through which every link carries 2 (n - 1) / n of the
// bytes at `bandwidth` (bytes/s). 0 for one rank.
double RingAllReduceSeconds(int64_t bytes, int64_t ranks, double bandwidth, double latency_s);

// Data parallelism's gradient all-reduce as the executor runs it (ExecutorOptions::dp_bucket_bytes): `tensors`
// (bytes each, in the order the last micro-batch's backward completes them, spread evenly over its
// `backward_s`) join buckets of at least `bucket_bytes`; a full bucket's all-reduces (one ring per tensor) start
// when its last tensor is complete and the previous bucket's are done (one comm stream), the last partial bucket's
// when the backward ends. `exposed_s`: how long they run past the backward's end.
struct BucketedAllReduce {
  int64_t buckets = 0;  // all-reduced during the backward (the last, partial one not counted)
  double seconds = 0, exposed_s = 0;
};
BucketedAllReduce BucketedAllReduceSeconds(const std::vector<int64_t>& tensors, int64_t bucket_bytes,
                                           double backward_s, int64_t ranks, double bandwidth, double latency_s);

inline constexpr char kOpTimesFormat[] = "onnxpipe-op-times/1";

struct OpTimes {
  std::string model, backend = "cpu", dtype = "fp32", optimizer, created;
  // The built-in device profile (device.h) of what the times were measured on: "cpu" for the CPU backends, e.g.
  // "h100-80gb" for an H100; "" when unknown (a GPU without a built-in profile, or a file from before the field).
  // `partition --profile` partitions for it when --device is not given.
  std::string device;
  int64_t microbatch = 0;
  int64_t seq = 0;
  int64_t repeats = 0;
  struct Entry {
    std::string node, op, phase;
    double ms = 0;
    std::optional<int64_t> scratch_bytes = std::nullopt;  // absent: not measured
  };
  std::vector<Entry> ops;
  // True when some entry has scratch_bytes.
  bool has_scratch() const;
};

// Strict parse: every error names `what` and the offending field or entry.
absl::StatusOr<OpTimes> OpTimesFromJson(const nlohmann::json& j, const std::string& what);
absl::StatusOr<OpTimes> LoadOpTimes(const std::string& path);
nlohmann::ordered_json OpTimesToJson(const OpTimes& t);

// The profile's kernel scratch per node, as PartitionOptions::workspace: a node by its name, a
// recompute clone ("recompute/<name>" with origin <name>) by the node it clones; 0 for the nodes
// the profile gives no scratch_bytes.
std::function<int64_t(const ir::Graph&, const ir::Node&)> ProfileScratch(std::shared_ptr<const OpTimes> t);
// How many live nodes of `g` the profile gives no scratch_bytes (ProfileScratch's 0s).
int64_t NodesWithoutScratch(const ir::Graph& g, const OpTimes& t);

struct CostSummary {
  std::string source;  // "roofline" | "profile"
  int64_t measured_nodes = 0, roofline_nodes = 0;
  int64_t profile_nodes_unmatched = 0;  // profile entries naming no node of the graph
};

// Seconds per node id (0 for removed nodes), one micro-batch of the graph's bound batch for
// forward/backward nodes, one step for optimizer nodes. `measured` may be null. `microbatch` is
// the graph's bound batch (for scaling measured times).
std::vector<double> NodeSeconds(const ir::Graph& g, const DeviceProfile& device, Precision precision,
                                const OpTimes* measured, int64_t microbatch, CostSummary* summary);

}  // namespace onnxpipe::partitioner
