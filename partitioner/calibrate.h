// Calibrating a device profile from measured per-op times (`onnxpipe profile --device-out`): the
// roofline's peaks become what the measured kernels actually achieved, so that the roofline
// predicts this machine's step time and plans made on it (or for devices like it) are honest.
//
// Over the nodes of one measured training graph (forward, backward, optimizer), with the cost
// model's FLOPs and bytes (cost_model.h):
//   op_overhead     the 10th percentile of the measured times of nodes that run a kernel (the
//                   smallest kernels are all overhead);
//   GEMM peak       sum of FLOPs / sum of (time - overhead) over the GEMM-class nodes;
//   memory bandwidth  sum of bytes / sum of (time - overhead) over the other nodes whose
//                   arithmetic intensity is below 1 FLOP/byte (elementwise, copies, updates);
//   vector peak     sum of FLOPs / sum of (time - overhead) over the other nodes at or above it
//                   (softmax, GELU, LayerNorm), or the GEMM peak / 8 when there are none.
// Efficiencies are 1 (the peaks are achieved numbers); memory, reserve and links are the base's.
#pragma once

#include <vector>

#include "frontend/ir/graph.h"
#include "partitioner/device.h"

namespace onnxpipe::partitioner {

struct Calibration {
  DeviceProfile device;
  int64_t gemm_nodes = 0, memory_nodes = 0, vector_nodes = 0;
  double measured_s = 0;   // sum of the measured times
  double predicted_s = 0;  // the calibrated roofline's sum over the same nodes
};

// `seconds` per node id of `g` (measured; removed nodes ignored), at fp32.
Calibration CalibrateDevice(const ir::Graph& g, const std::vector<double>& seconds, const DeviceProfile& base);

}  // namespace onnxpipe::partitioner
