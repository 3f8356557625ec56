// Gradient-rule coverage generated from the op list (frontend/ir/op.h's ONNXPIPE_OP_LIST): every op
// the importers and passes can put in a forward graph is in the gradient registry, with a rule or
// registered as non-differentiable on purpose, so the autodiff never meets an op it knows nothing
// of. The ops autodiff itself emits (gradients, optimizer steps) are the exception, and only those:
// a rule-less op must be one that a gradient rule or the optimizer produces.
#include <set>
#include <string>
#include <vector>

#include "frontend/autodiff/grad_builder.h"
#include "frontend/ir/op.h"
#include "gtest/gtest.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;

// What autodiff, the losses and the optimizer build (frontend/autodiff): never in a forward graph.
const std::set<OpKind>& EmittedByTraining() {
  static const std::set<OpKind> ops = {
      OpKind::kReduceToShapeOf, OpKind::kExpandLike,    OpKind::kReshapeLike,
      OpKind::kZerosLike,       OpKind::kGatherGrad,    OpKind::kGatherElementsGrad,
      OpKind::kGatherNDGrad,    OpKind::kSliceGrad,     OpKind::kConcatGrad,
      OpKind::kReluGrad,        OpKind::kSoftmaxGrad,   OpKind::kLogSoftmaxGrad,
      OpKind::kGeluGrad,        OpKind::kLayerNormGrad, OpKind::kRMSNormGrad,
      OpKind::kDropoutGrad,     OpKind::kAttentionGrad, OpKind::kSoftmaxCrossEntropyLossGrad,
      OpKind::kSumSquares,      OpKind::kSumScalars,    OpKind::kClipScale,     OpKind::kSGDUpdate,
      OpKind::kAdamWUpdate,     OpKind::kRotaryGrad,    OpKind::kGatedActivationGrad};
  return ops;
}

TEST(GradCoverage, EveryForwardOpHasARuleOrIsDeclaredNonDifferentiable) {
  const GradRegistry& reg = GradRegistry::Get();
  std::vector<std::string> missing;
  for (int i = 0; i < static_cast<int>(OpKind::kNumOps); ++i) {
    const OpKind op = static_cast<OpKind>(i);
    if (EmittedByTraining().count(op) == 0 && reg.Find(op) == nullptr) missing.push_back(std::string(ir::OpName(op)));
  }
  EXPECT_TRUE(missing.empty()) << "forward ops the gradient registry does not know: "
                               << ::testing::PrintToString(missing);
}

TEST(GradCoverage, EveryOpWithARuleIsAForwardOp) {
  // A training op with a registry entry would be differentiated twice over; the set above is exact.
  const GradRegistry& reg = GradRegistry::Get();
  for (OpKind op : EmittedByTraining()) {
    const GradRuleInfo* info = reg.Find(op);
    EXPECT_TRUE(info == nullptr || info->rule == nullptr) << ir::OpName(op) << " is emitted by training";
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
