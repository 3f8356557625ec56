#include "frontend/passes/dropout_fusion.h"

#include "frontend/passes/pattern.h"

namespace onnxpipe::passes {
namespace {

using ir::NodeId;
using ir::OpKind;
using ir::ValueId;

bool MaskIsRead(const UseInfo& uses, const ir::Node& drop) {
  return drop.outputs.size() > 1 && drop.outputs[1] != ir::kNoValue && uses.NumUses(drop.outputs[1]) > 0;
}

// Fuses Dropout `id` into the Gelu it reads; false where the pattern does not hold.
bool Fuse(ir::Graph* g, const UseInfo& uses, NodeId id) {
  const ir::Node& drop = g->node(id);
  if (drop.op != OpKind::kDropout || drop.inputs.size() != 1 || MaskIsRead(uses, drop)) return false;
  const NodeId gelu_id = PatternProducer(*g, uses, drop.inputs[0]);
  if (gelu_id == ir::kNoNode || g->node(gelu_id).op != OpKind::kGelu ||
      g->node(gelu_id).attrs.Get<double>("dropout", 0.0) != 0.0) {
    return false;
  }
  const double ratio = drop.attrs.Get<double>("ratio", 0.5);
  const std::string key = drop.attrs.Get<std::string>("rng_key", drop.name);
  const ValueId y = drop.outputs[0];
  g->RemoveNode(id);
  g->node(gelu_id).attrs.Set("dropout", ratio);
  g->node(gelu_id).attrs.Set("rng_key", key);
  SetOutput(g, gelu_id, 0, y);
  return true;
}

}  // namespace

absl::StatusOr<bool> DropoutFusion::Run(ir::Graph* g) { return RewriteEachNode(g, Fuse); }

}  // namespace onnxpipe::passes
