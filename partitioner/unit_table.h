// Inputs of the phase 3 search: per-unit times and memory, per-cut transfer sizes. The memory
// numbers are lower bounds of what the static memory planner reports for any stage made of these
// units (shared constants are counted once, at the first unit that reads them; saved activations
// once, at the first unit whose backward keeps them; boundary buffers and workspace only where
// they are certain), so a stage the table rejects can never fit. The search then checks its
// choice with the planner (stage_program.h) and learns the exact numbers of stages that did not.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "partitioner/analysis.h"
#include "partitioner/device.h"
#include "partitioner/recompute.h"

namespace onnxpipe::partitioner {

struct UnitTable {
  int32_t num_units = 0;
  // Per unit: seconds per micro-batch (forward, backward), per step (optimizer).
  std::vector<double> forward_s, backward_s, optimizer_s;
  // Per unit and UnitRecompute choice: recompute seconds, activation bytes kept per micro-batch,
  // bytes re-materialised at the unit's backward.
  std::array<std::vector<double>, 3> recompute_s;
  std::array<std::vector<int64_t>, 3> saved, rematerialised;
  std::vector<double> full_recompute_s;  // forward nodes a whole-stage recompute reruns
  std::vector<int64_t> parameters, gradients, optimizer_state, constants;  // aligned bytes
  // Per unit boundary c in [0, U] (0 and U: none): bytes certain to be a boundary buffer of a stage
  // starting (in_forward, out_backward) or ending (out_forward, in_backward) there.
  std::vector<int64_t> in_forward, out_backward, out_forward, in_backward;
  std::vector<int64_t> cross_forward_bytes, cross_backward_bytes;  // everything crossing
  std::vector<double> send_forward_s, send_backward_s;              // transfer times
};

UnitTable BuildUnitTable(const GraphAnalysis& a, const std::vector<double>& node_seconds,
                         const DeviceProfile& device, int64_t alignment);

}  // namespace onnxpipe::partitioner
