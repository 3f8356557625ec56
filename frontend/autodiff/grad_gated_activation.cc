// Gradient rule of the fused GatedActivation: one GatedActivationGrad node reading dY and the
// forward's inputs (the derivative is recomputed from gate, so the forward saves nothing), with an
// output for each of gate and up that needs a gradient. gate and up may be one value (act(x) * x);
// the driver then adds the two contributions.
#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/gated_activation.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;

absl::Status GatedActivationGrad(GradBuilder& b) {
  const std::optional<ir::GatedAct> act = ir::GatedActOf(b.node().attrs);
  if (!act) return b.Error("attributes " + b.node().attrs.ToString() + " name no gated activation");
  b.SetInputGrads(b.EmitMulti(OpKind::kGatedActivationGrad, {b.GO(0), b.I(0), b.I(1)}, b.InputGradTypes(2),
                              ir::GatedActAttrs(*act)));
  return absl::OkStatus();
}

}  // namespace

void RegisterGatedActivationGradients(GradRegistry& r) { r.Register(OpKind::kGatedActivation, GatedActivationGrad); }

}  // namespace onnxpipe::autodiff
