// Device calibration from measured op times (see calibrate.h). Sums, not per-node fits: the
// partitioner needs stage totals right, and a sum weights each class by the time it really takes.
#include "partitioner/calibrate.h"

#include <algorithm>

#include "partitioner/cost_model.h"

namespace onnxpipe::partitioner {

Calibration CalibrateDevice(const ir::Graph& g, const std::vector<double>& seconds, const DeviceProfile& base) {
  Calibration c;
  c.device = base;
  struct Sample {
    OpCost cost;
    double s;
  };
  std::vector<Sample> samples;
  std::vector<double> kernel_times;
  for (ir::NodeId id : g.LiveNodes()) {
    const OpCost cost = EstimateOpCost(g, g.node(id));
    c.measured_s += seconds[id];
    if (cost.free) continue;
    samples.push_back({cost, seconds[id]});
    kernel_times.push_back(seconds[id]);
  }
  DeviceProfile& d = c.device;
  d.compute_efficiency = d.memory_efficiency = 1.0;
  if (!kernel_times.empty()) {
    std::sort(kernel_times.begin(), kernel_times.end());
    d.op_overhead_s = kernel_times[kernel_times.size() / 10];
  }
  double gemm_flops = 0, gemm_s = 0, mem_bytes = 0, mem_s = 0, vec_flops = 0, vec_s = 0;
  for (const Sample& x : samples) {
    const double busy = std::max(x.s - d.op_overhead_s, 1e-9);
    if (x.cost.gemm) {
      gemm_flops += x.cost.flops;
      gemm_s += busy;
      ++c.gemm_nodes;
    } else if (x.cost.flops < x.cost.bytes) {
      mem_bytes += x.cost.bytes;
      mem_s += busy;
      ++c.memory_nodes;
    } else {
      vec_flops += x.cost.flops;
      vec_s += busy;
      ++c.vector_nodes;
    }
  }
  if (gemm_s > 0 && gemm_flops > 0) d.gemm_flops_fp32 = d.gemm_flops_bf16 = gemm_flops / gemm_s;
  if (mem_s > 0 && mem_bytes > 0) d.memory_bandwidth = mem_bytes / mem_s;
  d.vector_flops = vec_s > 0 && vec_flops > 0 ? vec_flops / vec_s : d.gemm_flops_fp32 / 8;
  for (const Sample& x : samples) c.predicted_s += RooflineSeconds(x.cost, d, Precision::kFP32);
  return c;
}

}  // namespace onnxpipe::partitioner
