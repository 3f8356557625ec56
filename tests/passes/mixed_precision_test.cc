#include "frontend/passes/mixed_precision.h"

#include <cmath>
#include <limits>

#include "frontend/autodiff/training_graph.h"
#include "frontend/ir/infer.h"
#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/passes/test_util.h"

namespace onnxpipe::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::OpKind;
using ir::Tensor;
using ir::ValueId;
using testing::GraphBuilder;
using testing::MakeAttrs;

// The consumers of v (one entry per operand use).
std::vector<const ir::Node*> Uses(const ir::Graph& g, ValueId v) {
  std::vector<const ir::Node*> out;
  for (ir::NodeId id : g.LiveNodes())
    for (ValueId in : g.node(id).inputs)
      if (in == v) out.push_back(&g.node(id));
  return out;
}

MixedPrecision Bf16(std::string freeze_regex = "") {
  return MixedPrecision({.compute = DType::kBF16, .freeze_regex = std::move(freeze_regex)});
}

// bf16's largest finite value, (2 - 2^-7) * 2^127, from its definition.
const double kBf16Max = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);

// y = LayerNorm((x w + mask) w + x, scale) * pos, with w a tied weight (read twice), mask a
// frozen constant holding the sentinels a mask has, pos = Cast(ids, f32), and a buffer frozen by
// the rule and one frozen by the regex.
struct Model {
  GraphBuilder b;
  ValueId x, ids, w, scale, mask, rule_frozen, regex_frozen, h, pos, y, mean, inv;
  Model() {
    ir::Graph& g = b.graph();
    x = b.Input("x", {Dim(2), Dim(4)});
    ids = b.Input("ids", {Dim(2), Dim(4)}, DType::kI64);
    w = b.Param("w", {4, 4});
    scale = b.Param("scale", {4});
    const float f32_min = std::numeric_limits<float>::lowest();
    mask = b.Const("mask", Tensor::FromVector<float>({4}, {0.0f, -INFINITY, f32_min, 3.39e38f}));
    rule_frozen = b.Param("rotary.inv_freq", {4});
    g.value(rule_frozen).param_state = ir::ParamState::kFrozen;
    regex_frozen = b.Param("pos_table", {4});
    ValueId a = b.Op(OpKind::kMatMul, {x, w}, {Dim(2), Dim(4)});
    a = b.Op(OpKind::kAdd, {a, mask}, {Dim(2), Dim(4)});
    a = b.Op(OpKind::kAdd, {a, rule_frozen}, {Dim(2), Dim(4)});
    a = b.Op(OpKind::kMul, {a, regex_frozen}, {Dim(2), Dim(4)});
    h = b.Op(OpKind::kMatMul, {a, w}, {Dim(2), Dim(4)});
    h = b.Op(OpKind::kAdd, {h, x}, {Dim(2), Dim(4)});
    ValueId ln = g.AddValue("ln", DType::kF32, {Dim(2), Dim(4)});
    mean = g.AddValue("ln_mean", DType::kF32, {Dim(2), Dim(1)});
    inv = g.AddValue("ln_inv", DType::kF32, {Dim(2), Dim(1)});
    g.AddNode(OpKind::kLayerNorm, "/l/LayerNorm", {h, scale}, {ln, mean, inv},
              MakeAttrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}}));
    pos = b.Op(OpKind::kCast, {ids}, {Dim(2), Dim(4)}, MakeAttrs({{"to", std::string("f32")}}));
    y = b.Op(OpKind::kMul, {ln, pos}, {Dim(2), Dim(4)});
    b.Output(y);
  }
};

TEST(MixedPrecisionTest, MastersStayF32AndEachUseCastsThem) {
  Model m;
  ir::Graph& g = m.b.graph();
  absl::StatusOr<bool> changed = Bf16("^pos_").Run(&g);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_TRUE(*changed);
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  for (ValueId p : {m.w, m.scale}) {
    EXPECT_EQ(g.value(p).dtype, DType::kF32) << g.value(p).name;
    EXPECT_EQ(g.value(p).constant->dtype(), DType::kF32) << g.value(p).name;
    for (const ir::Node* use : Uses(g, p)) {
      EXPECT_EQ(use->op, OpKind::kCast) << g.value(p).name << " read by " << use->name;
      EXPECT_EQ(use->attrs.Get<std::string>("to"), "bf16");
      EXPECT_EQ(Uses(g, use->outputs[0]).size(), 1u) << "a Cast of " << g.value(p).name << " has several uses";
    }
  }
  EXPECT_EQ(Uses(g, m.w).size(), 2u);  // the tied weight: one Cast per use
  EXPECT_EQ(Uses(g, m.scale).size(), 1u);
}

TEST(MixedPrecisionTest, ActivationsBf16StatisticsF32InterfaceF32) {
  Model m;
  ir::Graph& g = m.b.graph();
  ASSERT_TRUE(Bf16().Run(&g).ok());
  EXPECT_EQ(g.value(m.h).dtype, DType::kBF16);
  EXPECT_EQ(g.value(m.mean).dtype, DType::kF32);
  EXPECT_EQ(g.value(m.inv).dtype, DType::kF32);
  // Cast(ids, f32) now casts to bf16.
  EXPECT_EQ(g.value(m.pos).dtype, DType::kBF16);
  EXPECT_EQ(g.node(g.value(m.pos).producer).attrs.Get<std::string>("to"), "bf16");
  // x stays f32, read through one Cast shared by its two uses.
  EXPECT_EQ(g.value(m.x).dtype, DType::kF32);
  const std::vector<const ir::Node*> x_uses = Uses(g, m.x);
  ASSERT_EQ(x_uses.size(), 1u);
  EXPECT_EQ(x_uses[0]->op, OpKind::kCast);
  EXPECT_EQ(Uses(g, x_uses[0]->outputs[0]).size(), 2u);
  // The output keeps its name and f32, cast from the bf16 product.
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.outputs()[0], m.y);
  EXPECT_EQ(g.value(m.y).dtype, DType::kF32);
  const ir::Node& exit = g.node(g.value(m.y).producer);
  EXPECT_EQ(exit.op, OpKind::kCast);
  EXPECT_EQ(g.value(exit.inputs[0]).dtype, DType::kBF16);
  EXPECT_EQ(g.node(g.value(exit.inputs[0]).producer).op, OpKind::kMul);
  // Every float value a non-Cast node reads is bf16 or a statistic.
  for (ir::NodeId id : g.LiveNodes()) {
    const ir::Node& n = g.node(id);
    if (n.op == OpKind::kCast) continue;
    for (ValueId v : n.inputs) {
      if (!ir::IsFloat(g.value(v).dtype)) continue;
      EXPECT_EQ(g.value(v).dtype, DType::kBF16) << n.name << " reads " << g.value(v).name;
    }
  }
}

TEST(MixedPrecisionTest, FrozenConstantsBecomeBf16Saturating) {
  Model m;
  ir::Graph& g = m.b.graph();
  const Tensor rule_before = *g.value(m.rule_frozen).constant;
  ASSERT_TRUE(Bf16("^pos_").Run(&g).ok());
  for (ValueId c : {m.mask, m.rule_frozen, m.regex_frozen}) {
    EXPECT_EQ(g.value(c).dtype, DType::kBF16) << g.value(c).name;
    EXPECT_EQ(g.value(c).constant->dtype(), DType::kBF16) << g.value(c).name;
  }
  const Tensor& mask = *g.value(m.mask).constant;
  EXPECT_EQ(mask.GetAsDouble(0), 0.0);
  EXPECT_EQ(mask.GetAsDouble(1), -INFINITY);       // -inf stays -inf
  EXPECT_EQ(mask.GetAsDouble(2), -kBf16Max);       // finfo(f32).min: finite, not -inf
  EXPECT_EQ(mask.GetAsDouble(3), kBf16Max);        // beyond bf16's range: clamped
  // An ordinary value rounds to the nearest bf16: within half a bf16 ulp (2^-8 relative).
  for (int64_t i = 0; i < 4; ++i) {
    const double v = rule_before.GetAsDouble(i), r = g.value(m.rule_frozen).constant->GetAsDouble(i);
    EXPECT_LE(std::abs(r - v), std::abs(v) * std::ldexp(1.0, -8)) << i;
  }
}

// The loss op computes in f32 from the bf16 logits it reads as they are (no f32 copy of them); its
// other float operand, the class weights, is cast up, and its outputs stay f32.
TEST(MixedPrecisionTest, LossReadsBf16LogitsAndStaysF32) {
  GraphBuilder b;
  ir::Graph& g = b.graph();
  ValueId x = b.Input("x", {Dim(2), Dim(3)});
  ValueId labels = b.Input("labels", {Dim(2)}, DType::kI64);
  ValueId z = b.Op(OpKind::kMatMul, {x, b.Param("w", {3, 3})}, {Dim(2), Dim(3)});
  ValueId weights = b.Const("class_weights", Tensor::FromVector<float>({3}, {0.5f, 1.0f, 2.0f}));
  ValueId loss = b.Op(OpKind::kSoftmaxCrossEntropyLoss, {z, labels, weights}, {},
                      MakeAttrs({{"reduction", std::string("mean")}}));
  b.Output(loss);
  ASSERT_TRUE(Bf16().Run(&g).ok());
  EXPECT_EQ(g.value(z).dtype, DType::kBF16);
  const ir::Node& sce = *testing::NodesOf(g, OpKind::kSoftmaxCrossEntropyLoss)[0];
  EXPECT_EQ(sce.inputs[0], z);  // no Cast
  EXPECT_EQ(g.value(sce.inputs[2]).dtype, DType::kF32);
  EXPECT_EQ(g.node(g.value(sce.inputs[2]).producer).op, OpKind::kCast);
  EXPECT_EQ(g.value(sce.outputs[0]).dtype, DType::kF32);
  EXPECT_EQ(g.outputs()[0], loss);
  EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  EXPECT_TRUE(ir::InferShapes(g).ok());  // the shape rules agree: bf16 scores, f32 weights and loss
  EXPECT_EQ(g.value(loss).dtype, DType::kF32);
}

// A per-token language-model head trained in bf16 (autodiff::BuildTrainingGraph, the trainer's graph):
// the loss reads the bf16 logits, keeps (m, s) per token for the backward, and the backward writes the
// logits' gradient in bf16; no f32 tensor of (tokens x vocabulary) elements is left anywhere in the
// training graph (today's was three: the logits cast up, log_prob and its gradient).
TEST(MixedPrecisionTest, TrainingGraphHasNoF32LogitsSizedTensor) {
  constexpr int64_t kBatch = 2, kSeq = 8, kHidden = 12, kVocab = 50, kTokens = kBatch * kSeq;
  for (double smoothing : {0.0, 0.1}) {
    GraphBuilder b;
    ValueId x = b.Input("x", {Dim(kBatch), Dim(kSeq), Dim(kHidden)});
    ValueId h = b.Op(OpKind::kRelu, {x}, {Dim(kBatch), Dim(kSeq), Dim(kHidden)});
    ValueId logits = b.Op(OpKind::kMatMul, {h, b.Param("head", {kHidden, kVocab})}, {Dim(kBatch), Dim(kSeq), Dim(kVocab)});
    b.Output(logits);
    autodiff::TrainingGraphSpec spec;
    spec.logits = b.graph().value(logits).name;
    spec.dtype = DType::kBF16;
    spec.label_smoothing = smoothing;
    spec.optimizer.kind = autodiff::OptimizerKind::kAdamW;
    absl::StatusOr<autodiff::TrainingGraph> t = autodiff::BuildTrainingGraph(b.graph(), spec);
    ASSERT_TRUE(t.ok()) << t.status();
    const ir::Graph& g = t->graph;
    EXPECT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
    const std::vector<const ir::Node*> loss = testing::NodesOf(g, OpKind::kSoftmaxCrossEntropyLoss);
    const std::vector<const ir::Node*> grad = testing::NodesOf(g, OpKind::kSoftmaxCrossEntropyLossGrad);
    ASSERT_EQ(loss.size(), 1u);
    ASSERT_EQ(grad.size(), 1u);
    EXPECT_EQ(g.value(loss[0]->inputs[0]).dtype, DType::kBF16);
    EXPECT_EQ(g.value(loss[0]->outputs[0]).dtype, DType::kF32);
    ASSERT_EQ(loss[0]->outputs.size(), 3u);
    EXPECT_EQ(loss[0]->outputs[1], ir::kNoValue);  // no log_prob
    const ir::Value& stats = g.value(loss[0]->outputs[2]);
    EXPECT_EQ(stats.dtype, DType::kF32);
    EXPECT_EQ(stats.shape, (ir::Shape{Dim(kTokens), Dim(2)}));
    ASSERT_EQ(grad[0]->inputs.size(), 5u);
    EXPECT_EQ(grad[0]->inputs[1], loss[0]->inputs[0]);  // the bf16 scores
    EXPECT_EQ(grad[0]->inputs[4], loss[0]->outputs[2]);
    EXPECT_EQ(g.value(grad[0]->outputs[0]).dtype, DType::kBF16);
    for (ir::NodeId id : g.LiveNodes()) {
      for (ValueId v : g.node(id).outputs) {
        if (v == ir::kNoValue || g.value(v).dtype != DType::kF32 || !g.value(v).shape_known) continue;
        int64_t numel = 1;
        for (const Dim& d : g.value(v).shape) numel *= d.is_concrete() ? d.value() : 1;
        EXPECT_LT(numel, kTokens * kVocab) << g.value(v).name << " " << ir::ShapeToString(g.value(v).shape)
                                           << " from " << ir::OpName(g.node(id).op);
      }
    }
  }
}

// A post-LN MLP block trained in bf16: the bias gradients come from the kernels that write the Linears'
// incoming gradients (passes/ksum_from_producer.h), in f32 as the weight-gradient GEMMs' were: b1's from
// GeluGrad's dXSums, b2's from LayerNormGrad's dXDroppedSums (b2's output goes through the norm's fused
// dropout); no GEMM keeps a KSum output.
TEST(MixedPrecisionTest, BiasGradientsComeFromTheGradientKernels) {
  const ir::Shape xs = {Dim(2), Dim(8), Dim(16)}, hs = {Dim(2), Dim(8), Dim(32)};
  GraphBuilder b;
  const ValueId x = b.Input("x", xs);
  const ValueId h = b.Op(OpKind::kLinear, {x, b.Param("w1", {16, 32}), b.Param("b1", {32})}, hs);
  const ValueId a = b.Op(OpKind::kGelu, {h}, hs);
  const ValueId o = b.Op(OpKind::kLinear, {a, b.Param("w2", {32, 16}), b.Param("b2", {16})}, xs);
  const ValueId n = b.Op(OpKind::kLayerNorm, {o, b.Param("gamma", {16}), b.Param("beta", {16}), x}, xs,
                         MakeAttrs({{"dropout", 0.1}, {"rng_key", std::string("drop")}}));
  const ValueId logits = b.Op(OpKind::kMatMul, {n, b.Param("head", {16, 5})}, {Dim(2), Dim(8), Dim(5)});
  b.Output(logits);
  autodiff::TrainingGraphSpec spec;
  spec.logits = b.graph().value(logits).name;
  spec.dtype = DType::kBF16;
  spec.dropout = true;
  absl::StatusOr<autodiff::TrainingGraph> t = autodiff::BuildTrainingGraph(b.graph(), spec);
  ASSERT_TRUE(t.ok()) << t.status();
  const ir::Graph& g = t->graph;
  ASSERT_TRUE(ir::Verify(g).ok()) << ir::Verify(g);
  for (const ir::Node* m : testing::NodesOf(g, OpKind::kFusedMatMul)) {
    EXPECT_TRUE(m->outputs.size() < 2 || m->outputs[1] == ir::kNoValue) << m->name << " keeps its KSum";
  }
  // Each bias's gradient, by the parameter's name, and the node output it is.
  auto grad_of = [&](const std::string& param) -> std::pair<const ir::Node*, int> {
    for (size_t i = 0; i < t->params.size(); ++i) {
      if (g.value(t->params[i]).name != param) continue;
      const ir::Value& v = g.value(t->grads[i]);
      return {v.producer == ir::kNoNode ? nullptr : &g.node(v.producer), v.producer_output};
    }
    return {nullptr, -1};
  };
  const auto [gelu_grad, k1] = grad_of("b1");
  ASSERT_NE(gelu_grad, nullptr);
  EXPECT_EQ(gelu_grad->op, OpKind::kGeluGrad);
  EXPECT_EQ(k1, 1);
  const auto [norm_grad, k2] = grad_of("b2");
  ASSERT_NE(norm_grad, nullptr);
  EXPECT_EQ(norm_grad->op, OpKind::kLayerNormGrad);
  EXPECT_EQ(k2, 5);
  EXPECT_EQ(g.value(gelu_grad->outputs[1]).dtype, DType::kF32);
  EXPECT_EQ(g.value(norm_grad->outputs[5]).dtype, DType::kF32);
  EXPECT_EQ(g.value(norm_grad->outputs[5]).shape, ir::Shape{Dim(16)});
}

TEST(MixedPrecisionTest, RejectsANonHalfComputeDtype) {
  Model m;
  absl::StatusOr<bool> r = MixedPrecision({.compute = DType::kF32, .freeze_regex = ""}).Run(&m.b.graph());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bf16 or f16"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace onnxpipe::passes
