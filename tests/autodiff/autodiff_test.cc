// Structure of the training graph: tied weights accumulate through one Sum, frozen and unreachable
// parameters are reported, no gradient flows into integer/shape operands, a missing rule is an
// error naming the node and op, and AddCrossEntropyLoss builds (or reuses) the loss.
#include <algorithm>
#include <cmath>

#include "frontend/autodiff/autodiff.h"
#include "frontend/autodiff/loss.h"
#include "frontend/ir/verifier.h"
#include "frontend/passes/gathers_to_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;
using ::testing::HasSubstr;
using testing::MakeAttrs;
using testing::TestGraph;

std::vector<std::string> Names(const ir::Graph& g, const std::vector<ValueId>& ids) {
  std::vector<std::string> out;
  for (ValueId v : ids) out.push_back(g.value(v).name);
  return out;
}

// Max relative difference between the analytic gradients (outputs 1.. of the training graph) and
// central differences of the forward graph.
double MaxGradError(const ir::Graph& forward, ir::Graph& train, const TrainingGraphInfo& info,
                    const std::vector<ir::Tensor>& inputs = {}) {
  auto out = testing::Run(train, inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return 1e9;
  double worst = 0;
  for (size_t k = 0; k < info.param_grads.size(); ++k) {
    // Graph outputs: the original ones (loss first), then the gradients in param_grads order.
    const size_t pos = train.outputs().size() - info.param_grads.size() + k;
    const ir::Tensor& a = (*out)[pos];
    auto n = testing::NumericGradient(forward, info.param_grads[k].param, 1e-6, inputs);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok()) return 1e9;
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      worst = std::max(worst, std::abs(a.data<double>()[i] - (*n)[i]) / std::max(1.0, std::abs((*n)[i])));
    }
  }
  return worst;
}

// A packed projection taken apart by scalar Gathers (torch's MultiheadAttention export), rewritten into
// one Split: its gradient is one Concat of the pieces' gradients (no scattered tables and their Sum),
// and equals finite differences.
TEST(AutodiffTest, GathersRewrittenToSplitBackpropagateThroughOneConcat) {
  TestGraph t;
  ValueId w = t.Param("w", {5, 6});
  ValueId x = t.ConstF("x", {4, 5});
  ValueId packed = t.Op1(OpKind::kReshape, {t.Op1(OpKind::kMatMul, {x, w}), t.ConstI("shape", {3}, {4, 3, 2})});
  std::vector<ValueId> parts;
  for (int64_t i : {1, 0, 2}) {
    parts.push_back(t.Op1(OpKind::kGather, {packed, t.ConstI("i" + std::to_string(i), {}, {i})},
                          MakeAttrs({{"axis", int64_t{1}}})));
  }
  ValueId y = t.Op1(OpKind::kAdd, {t.Op1(OpKind::kMul, {parts[0], parts[1]}), t.Op1(OpKind::kTanh, {parts[2]})});
  auto loss = t.AddWeightedSumLoss({y});
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  absl::StatusOr<bool> changed = passes::GathersToSplit().Run(&t.g());
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_TRUE(*changed);
  const ir::Graph forward = t.g();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  int concats = 0;
  for (ir::NodeId n : t.g().LiveNodes()) {
    EXPECT_NE(t.g().node(n).op, OpKind::kGatherGrad);
    EXPECT_NE(t.g().node(n).op, OpKind::kSum);
    concats += t.g().node(n).op == OpKind::kConcat;
  }
  EXPECT_EQ(concats, 1);
  ASSERT_TRUE(ir::Verify(t.g()).ok());
  EXPECT_LE(MaxGradError(forward, t.g(), *info), 1e-6);
}

TEST(AutodiffTest, TiedWeightsAccumulateThroughOneSum) {
  // GPT-style: the embedding table feeds Gather (token embedding) and the output projection.
  TestGraph t;
  ValueId table = t.Param("wte", {7, 4});
  ValueId ids = t.ConstI("ids", {2, 3}, {1, 4, 1, 6, 0, 4});
  ValueId h = t.Op1(OpKind::kGather, {table, ids});
  ValueId h2 = t.Op1(OpKind::kTanh, {h});
  ValueId logits = t.Op1(OpKind::kLinear, {h2, table}, MakeAttrs({{"trans_b", int64_t{1}}}));
  auto loss = t.AddWeightedSumLoss({logits});
  ASSERT_TRUE(loss.ok()) << loss.status();
  const ir::Graph forward = t.g();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->param_grads.size(), 1u);
  const ValueId grad = info->param_grads[0].grad;
  EXPECT_EQ(t.g().value(grad).name, "grad/wte");
  const ir::Node& acc = t.g().node(t.g().value(grad).producer);
  EXPECT_EQ(acc.op, OpKind::kSum);
  EXPECT_EQ(acc.inputs.size(), 2u);
  EXPECT_EQ(acc.phase, ir::Phase::kBackward);
  EXPECT_EQ(acc.origin, "wte");
  ASSERT_TRUE(ir::Verify(t.g()).ok());
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  EXPECT_LE(MaxGradError(forward, t.g(), *info), 1e-6);
}

TEST(AutodiffTest, LinearBiasGradientComesFromTheWeightGradientGemm) {
  // Both weight layouts: the bias gradient is the dW GEMM's KSum output (dY's column sums), no ReduceToShapeOf;
  // with the weight frozen there is no dW GEMM, and the bias gradient is a reduction of dY.
  for (const bool freeze_w : {false, true}) {
    for (const int64_t tb : {int64_t{0}, int64_t{1}}) {
      TestGraph t;
      ValueId x = t.Param("x", {2, 3, 4});
      ValueId w = t.Param("w", tb ? std::vector<int64_t>{5, 4} : std::vector<int64_t>{4, 5});
      ValueId y = t.Op1(OpKind::kLinear, {x, w, t.Param("bias", {5})}, MakeAttrs({{"trans_b", tb}}));
      auto loss = t.AddWeightedSumLoss({t.Op1(OpKind::kTanh, {y})});
      ASSERT_TRUE(loss.ok()) << loss.status();
      const ir::Graph forward = t.g();
      GradOptions opt;
      if (freeze_w) opt.freeze_regex = "^w$";
      auto info = BuildGradients(&t.g(), *loss, opt);
      ASSERT_TRUE(info.ok()) << info.status();
      int ksums = 0, reductions = 0;
      for (ir::NodeId id : t.g().LiveNodes()) {
        const ir::Node& n = t.g().node(id);
        reductions += n.op == OpKind::kReduceToShapeOf;
        if (n.op == OpKind::kFusedMatMul && n.outputs.size() > 1 && n.outputs[1] != ir::kNoValue) {
          ++ksums;
          EXPECT_EQ(n.attrs.Get<std::string>("k_sum", ""), tb ? "a" : "b");
        }
      }
      EXPECT_EQ(ksums, freeze_w ? 0 : 1) << "trans_b " << tb;
      EXPECT_EQ(reductions, freeze_w ? 1 : 0) << "trans_b " << tb;
      ASSERT_TRUE(ir::Verify(t.g()).ok());
      ASSERT_TRUE(ir::InferShapes(t.g()).ok());
      EXPECT_LE(MaxGradError(forward, t.g(), *info), 1e-6) << "trans_b " << tb << " frozen w " << freeze_w;
    }
  }
}

TEST(AutodiffTest, FrozenAndUnreachableParametersAreReported) {
  TestGraph t;
  ValueId x = t.Param("enc/x", {3, 4});
  ValueId pos = t.Param("enc/pos_table", {3, 4});
  ValueId unused = t.Param("head/unused", {4});
  ValueId dead = t.Param("head/dead_branch", {3, 4});
  ValueId y = t.Op1(OpKind::kAdd, {x, pos});
  t.Op1(OpKind::kExp, {dead});  // computed but never reaches the loss
  (void)unused;
  auto loss = t.AddWeightedSumLoss({t.Op1(OpKind::kTanh, {y})});
  ASSERT_TRUE(loss.ok()) << loss.status();
  GradOptions opt;
  opt.freeze_regex = "pos_table$";
  auto info = BuildGradients(&t.g(), *loss, opt);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->param_grads.size(), 1u);
  EXPECT_EQ(t.g().value(info->param_grads[0].param).name, "enc/x");
  EXPECT_THAT(Names(t.g(), info->frozen_params), ::testing::ElementsAre("enc/pos_table"));
  EXPECT_THAT(Names(t.g(), info->unreachable_params),
              ::testing::UnorderedElementsAre("head/unused", "head/dead_branch"));
  EXPECT_EQ(t.g().FindValue("grad/enc/pos_table"), ir::kNoValue);
  EXPECT_EQ(t.g().FindValue("grad/head/dead_branch"), ir::kNoValue);
  // No backward node differentiates the dead branch.
  for (ir::NodeId id : t.g().LiveNodes()) {
    const ir::Node& n = t.g().node(id);
    if (n.phase == ir::Phase::kBackward) {
      EXPECT_THAT(n.origin, ::testing::Not(HasSubstr("Exp"))) << n.name;
    }
  }
}

TEST(AutodiffTest, InvalidFreezeRegexIsAnError) {
  TestGraph t;
  auto loss = t.AddWeightedSumLoss({t.Op1(OpKind::kNeg, {t.Param("x", {2})})});
  ASSERT_TRUE(loss.ok());
  GradOptions opt;
  opt.freeze_regex = "([";
  auto info = BuildGradients(&t.g(), *loss, opt);
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("freeze"));
}

TEST(AutodiffTest, NoGradientFlowsIntoIntegerOrShapeOperands) {
  // p reaches the loss only as integer data: Gather indices (Cast to int64) and a Reshape shape
  // (through Shape). q reaches it as data. Only q gets a gradient; nothing differentiates the
  // Cast/Shape/ConstantOfShape chain and no backward value is an integer.
  TestGraph t;
  ValueId p = t.Param("p", {2}, 0.0, 2.9);
  ValueId q = t.Param("q", {3, 4});
  ValueId idx = t.Op1(OpKind::kCast, {p}, MakeAttrs({{"to", std::string("i64")}}));
  ValueId rows = t.Op1(OpKind::kGather, {q, idx});  // (2, 4)
  ValueId shape = t.Op1(OpKind::kShape, {rows});
  ValueId flat = t.Op1(OpKind::kReshape, {rows, shape});
  auto loss = t.AddWeightedSumLoss({flat});
  ASSERT_TRUE(loss.ok()) << loss.status();
  const ir::Graph forward = t.g();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->param_grads.size(), 1u);
  EXPECT_EQ(t.g().value(info->param_grads[0].param).name, "q");
  EXPECT_THAT(Names(t.g(), info->unreachable_params), ::testing::ElementsAre("p"));
  for (ir::NodeId id : t.g().LiveNodes()) {
    const ir::Node& n = t.g().node(id);
    if (n.phase != ir::Phase::kBackward) continue;
    EXPECT_NE(n.origin, t.g().node(t.g().value(idx).producer).name);
    EXPECT_NE(n.origin, t.g().node(t.g().value(shape).producer).name);
    for (ValueId o : n.outputs) {
      if (o != ir::kNoValue) {
        EXPECT_FALSE(ir::IsInteger(t.g().value(o).dtype)) << n.name;
      }
    }
  }
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  EXPECT_LE(MaxGradError(forward, t.g(), *info), 1e-6);
}

TEST(AutodiffTest, MissingRuleNamesNodeAndOp) {
  // Every forward op has a rule (grad_coverage_test.cc); the optimizer's ops have none.
  TestGraph t;
  ValueId a = t.Param("a", {3});
  ValueId m = t.Op1(OpKind::kSumSquares, {a});
  auto loss = t.AddWeightedSumLoss({m});
  ASSERT_TRUE(loss.ok()) << loss.status();
  const std::string node_name = t.g().node(t.g().value(m).producer).name;
  const int64_t nodes_before = t.g().num_live_nodes();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(info.status().message(), HasSubstr("'" + node_name + "'"));
  EXPECT_THAT(info.status().message(), HasSubstr("SumSquares"));
  EXPECT_EQ(t.g().num_live_nodes(), nodes_before);  // checked before anything is emitted
}

TEST(AutodiffTest, ModOutsideTheLossPathIsFine) {
  // The same op off the parameter-to-loss path (integer operands) needs no rule.
  TestGraph t;
  ValueId a = t.Param("a", {4});
  ValueId i = t.Op1(OpKind::kMod, {t.ConstI("i", {1}, {7}), t.ConstI("n", {1}, {4})});
  ValueId g = t.Op1(OpKind::kGather, {a, i});
  auto loss = t.AddWeightedSumLoss({g});
  ASSERT_TRUE(loss.ok()) << loss.status();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->param_grads.size(), 1u);
}

TEST(AutodiffTest, LossMustBeAFloatScalar) {
  TestGraph t;
  ValueId y = t.Op1(OpKind::kNeg, {t.Param("x", {2, 3})});
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  auto info = BuildGradients(&t.g(), y, {});
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("scalar"));
}

TEST(AutodiffTest, LossThatNoParameterReachesBuildsNothing) {
  TestGraph t;
  ValueId p = t.Param("p", {3});
  (void)p;
  auto loss = t.AddWeightedSumLoss({t.Op1(OpKind::kExp, {t.ConstF("c", {3})})});
  ASSERT_TRUE(loss.ok());
  const int64_t before = t.g().num_live_nodes();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->param_grads.empty());
  EXPECT_THAT(Names(t.g(), info->unreachable_params), ::testing::ElementsAre("p"));
  EXPECT_EQ(t.g().num_live_nodes(), before);
}

TEST(AutodiffTest, BackwardNodesCarryPhaseOriginAndScope) {
  TestGraph t;
  ValueId x = t.Param("x", {2, 3});
  ValueId w = t.Param("w", {3, 4});
  ValueId y = t.Op1(OpKind::kMatMul, {x, w});
  auto loss = t.AddWeightedSumLoss({t.Op1(OpKind::kSoftmax, {y})});
  ASSERT_TRUE(loss.ok());
  const int32_t forward_slots = t.g().num_node_slots();
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  std::set<std::string> forward_names;
  for (ir::NodeId id = 0; id < forward_slots; ++id) forward_names.insert(t.g().node(id).name);
  int backward = 0;
  const std::vector<ir::NodeId> live = t.g().LiveNodes();
  for (ir::NodeId id : live) {
    const ir::Node& n = t.g().node(id);
    if (id < forward_slots) {
      EXPECT_EQ(n.phase, ir::Phase::kForward);
      continue;
    }
    ++backward;
    EXPECT_EQ(n.phase, ir::Phase::kBackward);
    EXPECT_TRUE(forward_names.count(n.origin) || n.origin == "x" || n.origin == "w") << n.origin;
    if (forward_names.count(n.origin)) {
      const ir::NodeId fwd = *std::find_if(live.begin(), live.end(),
                                           [&](ir::NodeId k) { return t.g().node(k).name == n.origin; });
      EXPECT_EQ(n.scope, t.g().node(fwd).scope);
    }
  }
  EXPECT_GT(backward, 0);
  // The loss and both gradients are graph outputs, in that order.
  ASSERT_EQ(t.g().outputs().size(), 3u);
  EXPECT_EQ(t.g().outputs()[0], *loss);
  EXPECT_EQ(t.g().value(t.g().outputs()[1]).name, "grad/x");
  EXPECT_EQ(t.g().value(t.g().outputs()[2]).name, "grad/w");
}

TEST(AutodiffTest, DropoutBackwardIsIdentityOutsideTraining) {
  // Evaluated with EvalContext::training == false the forward Dropout is the identity; its
  // gradient must be too (no 1 / (1 - ratio) scale), so d sum(dropout(x) * w) / dx = w.
  TestGraph t;
  ValueId x = t.Param("x", {4, 8});
  ValueId y = t.Op1(OpKind::kDropout, {x}, MakeAttrs({{"ratio", 0.5}}));
  auto loss = t.AddWeightedSumLoss({y});
  ASSERT_TRUE(loss.ok());
  const ValueId w = t.g().node(t.g().value(t.g().node(t.g().value(*loss).producer).inputs[0]).producer).inputs[1];
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  cpu::CpuEvaluator ev(cpu::EvalContext{});
  auto out = runtime::Interpret(t.g(), ev, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE((*out)[1].BitwiseEquals(*t.g().value(w).constant));
}

TEST(LossTest, PerTokenCrossEntropyAddsLabelsAndDifferentiates) {
  TestGraph t;
  ValueId x = t.ConstF("x", {2, 3, 4});
  ValueId w = t.Param("w", {4, 5});
  ValueId logits = t.Op1(OpKind::kMatMul, {x, w});
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  CrossEntropyOptions opt;
  opt.label_smoothing = 0.1;
  auto li = AddCrossEntropyLoss(&t.g(), t.g().value(logits).name, "labels", opt);
  ASSERT_TRUE(li.ok()) << li.status();
  EXPECT_FALSE(li->existing);
  ASSERT_EQ(t.g().inputs().size(), 1u);
  EXPECT_EQ(t.g().value(li->labels).name, "labels");
  EXPECT_EQ(t.g().value(li->labels).dtype, ir::DType::kI64);
  EXPECT_EQ(t.g().value(li->labels).shape, (ir::Shape{2, 3}));
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  EXPECT_EQ(t.g().value(li->loss).shape, ir::Shape{});
  const ir::Graph forward = t.g();
  auto info = BuildGradients(&t.g(), li->loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(ir::Verify(t.g()).ok());
  std::vector<ir::Tensor> inputs = {ir::Tensor::FromVector<int64_t>({2, 3}, {4, -100, 0, 2, 2, -100})};
  EXPECT_LE(MaxGradError(forward, t.g(), *info, inputs), 1e-6);
}

TEST(LossTest, SymbolicBatchAndSequence) {
  ir::Graph g;
  ValueId logits = g.AddValue("logits", ir::DType::kF32, {ir::Dim::Symbol("B"), ir::Dim::Symbol("S"), 11});
  g.inputs().push_back(logits);
  auto li = AddCrossEntropyLoss(&g, "logits", "y", {});
  ASSERT_TRUE(li.ok()) << li.status();
  EXPECT_EQ(g.value(li->labels).shape, (ir::Shape{ir::Dim::Symbol("B"), ir::Dim::Symbol("S")}));
  ASSERT_TRUE(ir::InferShapes(g).ok());
  EXPECT_EQ(g.value(li->loss).shape, ir::Shape{});
}

TEST(LossTest, ExistingSoftmaxCrossEntropyLossIsUsedAsIs) {
  TestGraph t;
  ValueId s = t.Param("scores", {3, 4});
  ValueId labels = t.g().AddValue("target", ir::DType::kI64, {3});
  t.g().inputs().push_back(labels);
  ValueId loss = t.Op1(OpKind::kSoftmaxCrossEntropyLoss, {s, labels});
  auto li = AddCrossEntropyLoss(&t.g(), "does_not_matter", "labels", {});
  ASSERT_TRUE(li.ok()) << li.status();
  EXPECT_TRUE(li->existing);
  EXPECT_EQ(li->loss, loss);
  EXPECT_EQ(li->labels, labels);
  EXPECT_EQ(t.g().inputs().size(), 1u);
}

TEST(LossTest, BadLogitsAreErrorsNamingThem) {
  TestGraph t;
  ValueId y = t.Op1(OpKind::kNeg, {t.Param("x", {2, 3, 4, 5})});
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  auto missing = AddCrossEntropyLoss(&t.g(), "nope", "labels", {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'nope'"));
  auto rank = AddCrossEntropyLoss(&t.g(), t.g().value(y).name, "labels", {});
  ASSERT_FALSE(rank.ok());
  EXPECT_THAT(rank.status().message(), HasSubstr("(B, C)"));
  CrossEntropyOptions bad;
  bad.label_smoothing = 1.5;
  EXPECT_FALSE(AddCrossEntropyLoss(&t.g(), t.g().value(y).name, "labels", bad).ok());
}

// Rotary's tables get no gradient: one that depends on a trainable parameter is an error naming
// the node, never a silently dropped gradient (the rotary fusion fuses only constant tables).
TEST(AutodiffTest, RotaryTableThatNeedsAGradientIsAnError) {
  TestGraph t;
  ValueId y = t.Op1(OpKind::kRotary,
                    {t.Param("x", {2, 3, 8}, -1, 1), t.Param("cos", {3, 8}, -1, 1), t.ConstF("sin", {3, 8}, -1, 1)},
                    MakeAttrs({{"rotary_dim", int64_t{8}}}));
  auto loss = t.AddWeightedSumLoss({y});
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(ir::InferShapes(t.g()).ok());
  auto info = BuildGradients(&t.g(), *loss, {});
  ASSERT_FALSE(info.ok());
  EXPECT_NE(std::string(info.status().message()).find("rotary tables"), std::string::npos) << info.status();
}

// GatedActivation's backward is one GatedActivationGrad reading dY, gate and up (nothing the forward
// saves), with an output only for the operands that need a gradient.
TEST(AutodiffTest, GatedActivationGradIsOneNodeOnTheForwardsInputs) {
  for (bool gate_trained : {true, false}) {
    TestGraph t;
    const ValueId gate = gate_trained ? t.Param("gate", {2, 8}, -3, 3) : t.ConstF("gate", {2, 8}, -3, 3);
    const ValueId up = t.Param("up", {2, 8});
    ValueId y = t.Op1(OpKind::kGatedActivation, {gate, up}, MakeAttrs({{"activation", std::string("silu")}}));
    auto loss = t.AddWeightedSumLoss({y});
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(ir::InferShapes(t.g()).ok());
    auto info = BuildGradients(&t.g(), *loss, {});
    ASSERT_TRUE(info.ok()) << info.status();
    std::vector<const ir::Node*> grads;
    for (ir::NodeId id : t.g().LiveNodes()) {
      const ir::Node& n = t.g().node(id);
      if (n.op == OpKind::kGatedActivationGrad) grads.push_back(&n);
      if (n.op == OpKind::kGatedActivation) {
        EXPECT_EQ(n.outputs.size(), 1u);  // nothing saved
      }
    }
    ASSERT_EQ(grads.size(), 1u);
    EXPECT_EQ(grads[0]->inputs[1], gate);
    EXPECT_EQ(grads[0]->inputs[2], up);
    ASSERT_EQ(grads[0]->outputs.size(), 2u);
    EXPECT_EQ(grads[0]->outputs[0] != ir::kNoValue, gate_trained);
    EXPECT_NE(grads[0]->outputs[1], ir::kNoValue);
  }
}

}  // namespace
}  // namespace onnxpipe::autodiff
