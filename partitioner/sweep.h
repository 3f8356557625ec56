// --sweep: the IDRIS benchmark table predicted before any run. For every (batch, micro-batches,
// stages, data-parallel replicas) point: the partition's predicted step time, throughput, bubble and memory per stage,
// or OOM (with the memory the time-optimal split would need), or invalid (D x M > B, B % (D x M) != 0, more stages than
// cut candidates allow). batch is the global batch (as --batch).
//   spec:       "batch=32,64,128,256 microbatches=1,2,4,8,16 stages=2,4 [data_parallel=1,2]" (any
//               order, each key once; data_parallel defaults to 1)
//   sweep.csv:  batch,microbatches,stages,data_parallel,microbatch_size,status,step_ms,samples_per_s,
//               bubble_fraction,max_stage_memory_bytes,capacity_bytes,stage_memory_bytes,note
//               (stage_memory_bytes: per stage, separated by ';')
//   sweep.html: per stage count (and replica count), throughput and peak stage memory against the batch, one line per
//               micro-batch count, OOM points marked; the full table. Self-contained.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "partitioner/partitioner.h"

namespace onnxpipe::partitioner {

struct SweepSpec {
  std::vector<int64_t> batches, microbatches, stages, data_parallel = {1};
};
absl::StatusOr<SweepSpec> ParseSweepSpec(const std::string& spec);

struct SweepRow {
  int64_t batch = 0, microbatches = 0, stages = 0, data_parallel = 1, microbatch_size = 0;
  std::string status;  // ok | oom | invalid
  double step_ms = 0, samples_per_s = 0, bubble_fraction = 0;
  int64_t max_stage_memory = 0;
  std::vector<int64_t> stage_memory;
  std::string note;
};

// One point on a context built for micro-batch size batch / (data_parallel x microbatches). `base`
// supplies the schedule, recompute, precision, memory and profile options.
SweepRow SweepPoint(const PartitionContext& ctx, const PartitionOptions& base, int64_t batch, int64_t microbatches,
                    int64_t stages, int64_t data_parallel = 1);
// A row for a point that is invalid before any graph is built (nullopt: the point is valid): more
// micro-batches than samples, or a batch not divisible by them.
std::optional<SweepRow> InvalidSweepRow(int64_t batch, int64_t microbatches, int64_t stages, int64_t data_parallel);

std::string SweepCsv(const std::vector<SweepRow>& rows, int64_t capacity_bytes);
std::string SweepHtml(const std::vector<SweepRow>& rows, const std::string& model, const DeviceProfile& device,
                      int64_t capacity_bytes, const std::string& config);

}  // namespace onnxpipe::partitioner
