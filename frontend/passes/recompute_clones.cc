#include "frontend/passes/recompute_clones.h"

#include <algorithm>
#include <string>

namespace onnxpipe::passes {

ClonedBackward CloneRecomputeRegions(ir::Graph& g, const std::vector<BackwardStep>& steps) {
  ClonedBackward out;
  const int32_t num_values = g.num_values();
  // clone_of: the latest clone of a forward value (what backward nodes read); region_clone: the
  // clones of the current region only (what the region's own nodes read).
  std::vector<ir::ValueId> clone_of(num_values, ir::kNoValue), region_clone(num_values, ir::kNoValue);
  int32_t region = -1;
  for (const BackwardStep& step : steps) {
    if (step.region < 0) {
      for (ir::ValueId& v : g.node(step.node).inputs)
        if (v != ir::kNoValue && v < num_values && clone_of[v] != ir::kNoValue) v = clone_of[v];
      out.order.push_back(step.node);
      continue;
    }
    if (step.region != region) {
      region = step.region;
      std::fill(region_clone.begin(), region_clone.end(), ir::kNoValue);
    }
    const ir::Node src = g.node(step.node);  // a copy: AddValue/AddNode grow the tables
    std::vector<ir::ValueId> inputs = src.inputs;
    for (ir::ValueId& v : inputs)
      if (v != ir::kNoValue && v < num_values && region_clone[v] != ir::kNoValue) v = region_clone[v];
    std::vector<ir::ValueId> outputs;
    for (ir::ValueId v : src.outputs) {
      if (v == ir::kNoValue) {
        outputs.push_back(ir::kNoValue);
        continue;
      }
      const ir::Value val = g.value(v);
      const ir::ValueId c = g.AddValue(g.UniqueName(RecomputeCloneName(val.name)), val.dtype, val.shape, val.shape_known);
      clone_of[v] = region_clone[v] = c;
      outputs.push_back(c);
    }
    ir::Attrs attrs = src.attrs;
    if ((src.op == ir::OpKind::kDropout || attrs.Has("dropout")) && !attrs.Has("rng_key")) {
      attrs.Set("rng_key", src.name);  // replay the forward's random stream
    }
    const ir::NodeId c =
        g.AddNode(src.op, RecomputeCloneName(src.name), std::move(inputs), std::move(outputs), std::move(attrs));
    g.node(c).phase = ir::Phase::kBackward;
    g.node(c).origin = src.name;
    g.node(c).scope = src.scope;
    out.order.push_back(c);
    out.clones.push_back(c);
    out.cloned_from.push_back(step.node);
  }
  return out;
}

}  // namespace onnxpipe::passes
