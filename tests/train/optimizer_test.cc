// Optimizer ops (SumSquares, ClipScale, SGDUpdate, AdamWUpdate) and the graph AddOptimizer builds:
// single steps against hand-computed values, and several steps against torch.optim run by
// tests/train/torch_optim_reference.py.
#include "frontend/autodiff/optimizer.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "executor/runtime/interpreter.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace onnxpipe {
namespace {

using autodiff::OptimizerKind;
using autodiff::OptimizerOptions;
using ::testing::HasSubstr;

// Runs a command and returns its stdout; fails the test on a non-zero exit.
std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  const int rc = pclose(f);
  EXPECT_EQ(rc, 0) << cmd;
  return out;
}

// A graph with parameters given as constants and their gradients as graph inputs, plus the
// optimizer: exactly what the trainer appends after the backward pass.
struct OptGraph {
  ir::Graph g;
  std::vector<ir::ValueId> params, grads;
  autodiff::OptimizerGraphInfo info;
};

template <typename T>
OptGraph MakeOptGraph(const std::vector<std::vector<int64_t>>& shapes,
                      const std::vector<std::vector<double>>& init, const OptimizerOptions& o) {
  OptGraph og;
  std::vector<autodiff::ParamGrad> pgs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<T> vals(init[i].begin(), init[i].end());
    const std::string name = "param" + std::to_string(i);
    const ir::ValueId p = og.g.AddConstant(name, ir::Tensor::FromVector<T>(shapes[i], vals), true);
    const ir::ValueId gr = og.g.AddValue("grad/" + name, ir::DTypeOf<T>::value, ir::FromInts(shapes[i]));
    og.g.inputs().push_back(gr);
    og.params.push_back(p);
    og.grads.push_back(gr);
    pgs.push_back({p, gr});
  }
  absl::StatusOr<autodiff::OptimizerGraphInfo> info = autodiff::AddOptimizer(&og.g, pgs, o);
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) og.info = *info;
  return og;
}

// Feeds the gradients, lr and the 1-based step, runs the graph and applies the updates. Returns
// the grad_norm output.
template <typename T>
double Step(OptGraph& og, const std::vector<std::vector<double>>& grads, double lr, int64_t step) {
  std::vector<ir::Tensor> feeds;
  for (ir::ValueId in : og.g.inputs()) {
    if (in == og.info.lr) {
      feeds.push_back(ir::Tensor::Scalar<double>(lr));
    } else if (in == og.info.step) {
      feeds.push_back(ir::Tensor::Scalar<int64_t>(step));
    } else {
      const size_t k = std::find(og.grads.begin(), og.grads.end(), in) - og.grads.begin();
      std::vector<T> vals(grads[k].begin(), grads[k].end());
      feeds.push_back(ir::Tensor::FromVector<T>(og.g.value(og.params[k]).constant->dims(), vals));
    }
  }
  cpu::CpuEvaluator ev;
  absl::StatusOr<runtime::StepResult> r = runtime::InterpretStep(og.g, ev, feeds);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return NAN;
  EXPECT_TRUE(runtime::ApplyStateUpdates(og.g, r->state).ok());
  const size_t norm_index =
      std::find(og.g.outputs().begin(), og.g.outputs().end(), og.info.grad_norm) -
      og.g.outputs().begin();
  return r->outputs.at(norm_index).GetAsDouble(0);
}

std::vector<double> Values(const ir::Graph& g, ir::ValueId v) {
  const ir::Tensor& t = *g.value(v).constant;
  std::vector<double> out;
  for (int64_t i = 0; i < t.num_elements(); ++i) out.push_back(t.GetAsDouble(i));
  return out;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double rel,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1.0, std::abs(want[i]))) << what << " [" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Hand-computed single steps.

TEST(SgdUpdate, MomentumWeightDecayTwoStepsByHand) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSGD;
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  OptGraph og = MakeOptGraph<double>({{1}}, {{1.0}}, o);
  ASSERT_EQ(og.info.state.size(), 1u);
  ASSERT_EQ(og.info.step, ir::kNoValue);  // SGD needs no step input
  // Step 1: d = 0.5 + 0.1*1 = 0.6; buf = d (PyTorch's first step); p = 1 - 0.1*0.6.
  EXPECT_DOUBLE_EQ(Step<double>(og, {{0.5}}, 0.1, 1), 0.5);
  EXPECT_NEAR(Values(og.g, og.params[0])[0], 0.94, 1e-15);
  EXPECT_NEAR(Values(og.g, og.info.state[0])[0], 0.6, 1e-15);
  // Step 2: d = 0.5 + 0.094 = 0.594; buf = 0.9*0.6 + 0.594 = 1.134; p = 0.94 - 0.1134.
  Step<double>(og, {{0.5}}, 0.1, 2);
  EXPECT_NEAR(Values(og.g, og.params[0])[0], 0.8266, 1e-15);
  EXPECT_NEAR(Values(og.g, og.info.state[0])[0], 1.134, 1e-15);
}

TEST(SgdUpdate, NesterovByHand) {
  OptimizerOptions o;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.1;
  OptGraph og = MakeOptGraph<float>({{2}}, {{1.0, -2.0}}, o);
  Step<float>(og, {{0.5, 1.0}}, 0.1, 1);
  // d = g + 0.1 p = (0.6, 0.8); buf = d; d += 0.9 buf = (1.14, 1.52); p -= 0.1 d.
  ExpectNear(Values(og.g, og.params[0]), {0.886, -2.152}, 1e-6, "param");
}

TEST(SgdUpdate, PlainSgdHasNoState) {
  OptimizerOptions o;
  OptGraph og = MakeOptGraph<double>({{3}}, {{1, 2, 3}}, o);
  EXPECT_TRUE(og.info.state.empty());
  EXPECT_EQ(og.g.state_updates().size(), 1u);
  Step<double>(og, {{1, -1, 0.5}}, 0.5, 1);
  ExpectNear(Values(og.g, og.params[0]), {0.5, 2.5, 2.75}, 1e-15, "param");
}

TEST(AdamWUpdate, FirstStepByHand) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.weight_decay = 0.1;
  OptGraph og = MakeOptGraph<double>({{1}}, {{1.0}}, o);
  ASSERT_NE(og.info.step, ir::kNoValue);
  ASSERT_EQ(og.info.state.size(), 2u);
  Step<double>(og, {{0.5}}, 0.1, 1);
  // p = 1*(1 - 0.01) = 0.99; m = 0.05; v = 0.00025; m_hat = 0.5; v_hat = 0.25;
  // p -= 0.1 * 0.5 / (0.5 + 1e-8).
  EXPECT_NEAR(Values(og.g, og.params[0])[0], 0.99 - 0.05 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(Values(og.g, og.info.state[0])[0], 0.05, 1e-16);
  EXPECT_NEAR(Values(og.g, og.info.state[1])[0], 0.00025, 1e-18);
}

TEST(ClipScale, ScalesByMaxNormOverGlobalNorm) {
  OptimizerOptions o;
  o.clip_norm = 1.0;
  OptGraph og = MakeOptGraph<double>({{2}, {1}}, {{0, 0}, {0}}, o);
  ASSERT_NE(og.info.clip_scale, ir::kNoValue);
  // Global norm of (3, 4) and (12): 13. Scale 1/(13 + 1e-6); p = -lr * scale * g.
  const double norm = Step<double>(og, {{3, 4}, {12}}, 1.0, 1);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const double s = 1.0 / (13.0 + 1e-6);
  ExpectNear(Values(og.g, og.params[0]), {-3 * s, -4 * s}, 1e-15, "param0");
  ExpectNear(Values(og.g, og.params[1]), {-12 * s}, 1e-15, "param1");
}

TEST(ClipScale, LeavesSmallGradientsAlone) {
  OptimizerOptions o;
  o.clip_norm = 100.0;
  OptGraph og = MakeOptGraph<float>({{2}}, {{0, 0}}, o);
  EXPECT_FLOAT_EQ(static_cast<float>(Step<float>(og, {{3, 4}}, 1.0, 1)), 5.0f);
  ExpectNear(Values(og.g, og.params[0]), {-3, -4}, 0, "param");
}

// Without clipping no SumSquares node is made: each update outputs its gradient's sum of squares (op.h:
// UpdateSumSquaresOutput), and the norm, the parameters and the state equal those of the graph whose SumSquares
// nodes feed a clipping that never clips, bit for bit.
TEST(AddOptimizer, UnclippedUpdatesFormTheNormTerms) {
  const int64_t n = 100003;  // several reduction chunks
  std::vector<double> init(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    init[i] = std::sin(0.1 * static_cast<double>(i));
    grad[i] = std::cos(0.37 * static_cast<double>(i)) * 1e-3;
  }
  double want_sq = 9 + 16 + 144;
  for (double x : grad) want_sq += static_cast<double>(static_cast<float>(x)) * static_cast<float>(x);
  for (const OptimizerKind kind : {OptimizerKind::kSGD, OptimizerKind::kAdamW}) {
    for (const double momentum : {0.0, 0.9}) {
      if (kind == OptimizerKind::kAdamW && momentum != 0) continue;
      OptimizerOptions o;
      o.kind = kind;
      o.momentum = momentum;
      o.weight_decay = 0.01;
      OptGraph fused = MakeOptGraph<float>({{2}, {1}, {n}}, {{1, 2}, {3}, init}, o);
      o.clip_norm = 1e30;
      OptGraph clipped = MakeOptGraph<float>({{2}, {1}, {n}}, {{1, 2}, {3}, init}, o);
      const std::string what = std::string(kind == OptimizerKind::kSGD ? "sgd" : "adamw") + " momentum " +
                               std::to_string(momentum);
      int updates = 0;
      for (ir::NodeId id : fused.g.LiveNodes()) {
        const ir::Node& node = fused.g.node(id);
        EXPECT_NE(node.op, ir::OpKind::kSumSquares) << what;
        if (node.op != ir::OpKind::kSGDUpdate && node.op != ir::OpKind::kAdamWUpdate) continue;
        ++updates;
        const int k = ir::UpdateSumSquaresOutput(node.op);
        ASSERT_EQ(static_cast<int>(node.outputs.size()), k + 1) << what;
        EXPECT_EQ(fused.g.value(node.outputs[k]).dtype, ir::DType::kF64) << what;
        EXPECT_EQ(node.outputs[1] == ir::kNoValue, kind == OptimizerKind::kSGD && momentum == 0) << what;
      }
      EXPECT_EQ(updates, 3) << what;
      const double norm = Step<float>(fused, {{3, 4}, {12}, grad}, 0.1, 1);
      EXPECT_FLOAT_EQ(static_cast<float>(norm), static_cast<float>(std::sqrt(want_sq))) << what;
      EXPECT_EQ(norm, Step<float>(clipped, {{3, 4}, {12}, grad}, 0.1, 1)) << what;
      for (size_t i = 0; i < fused.params.size(); ++i) {
        EXPECT_EQ(Values(fused.g, fused.params[i]), Values(clipped.g, clipped.params[i])) << what << " param " << i;
      }
      for (size_t i = 0; i < fused.info.state.size(); ++i) {
        EXPECT_EQ(Values(fused.g, fused.info.state[i]), Values(clipped.g, clipped.info.state[i])) << what;
      }
    }
  }
}

TEST(SumSquares, LargeTensorMatchesDoubleReference) {
  // Several reduction chunks; the f32 result is the double sum rounded once.
  const int64_t n = 100003;
  std::vector<float> x(n);
  double want = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(std::sin(0.001 * i) * 3.0);
    want += static_cast<double>(x[i]) * x[i];
  }
  ir::Node node;
  node.op = ir::OpKind::kSumSquares;
  node.name = "ss";
  node.outputs = {0};
  cpu::CpuEvaluator ev;
  absl::StatusOr<std::vector<ir::Tensor>> r = ev.Evaluate(node, {ir::Tensor::FromVector<float>({n}, x)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].data<float>()[0], static_cast<float>(want));
}

ir::Node ReductionNode(ir::OpKind op, const std::string& to) {
  ir::Node node;
  node.op = op;
  node.name = "optimizer/sum";
  node.outputs = {0};
  if (!to.empty()) node.attrs.Set("to", to);
  return node;
}

TEST(SumSquares, ToF64KeepsTheDoubleSum) {
  // 1 + (2^-30)^2 is exact in double and rounds to 1 in f32.
  const float tiny = std::ldexp(1.0f, -30);
  cpu::CpuEvaluator ev;
  const std::vector<ir::Tensor> in = {ir::Tensor::FromVector<float>({2}, {1.0f, tiny})};
  absl::StatusOr<std::vector<ir::Tensor>> wide = ev.Evaluate(ReductionNode(ir::OpKind::kSumSquares, "f64"), in);
  ASSERT_TRUE(wide.ok()) << wide.status();
  ASSERT_EQ((*wide)[0].dtype(), ir::DType::kF64);
  EXPECT_EQ((*wide)[0].data<double>()[0], 1.0 + std::ldexp(1.0, -60));
  absl::StatusOr<std::vector<ir::Tensor>> narrow = ev.Evaluate(ReductionNode(ir::OpKind::kSumSquares, ""), in);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ((*narrow)[0].data<float>()[0], 1.0f);
}

TEST(SumScalars, AddsInInputOrderInDouble) {
  // ((0 + 2^53) + 1) + 1 = 2^53 in double (each +1 rounds away); (1 + 1) + 2^53 = 2^53 + 2.
  const double big = std::ldexp(1.0, 53);
  auto sum = [](std::vector<double> terms, const std::string& to) {
    std::vector<ir::Tensor> in;
    for (double t : terms) in.push_back(ir::Tensor::Scalar<double>(t));
    return cpu::CpuEvaluator().Evaluate(ReductionNode(ir::OpKind::kSumScalars, to), in);
  };
  absl::StatusOr<std::vector<ir::Tensor>> a = sum({big, 1, 1}, "");
  absl::StatusOr<std::vector<ir::Tensor>> b = sum({1, 1, big}, "");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)[0].data<double>()[0], big);
  EXPECT_EQ((*b)[0].data<double>()[0], big + 2);
  absl::StatusOr<std::vector<ir::Tensor>> f = sum({0.1, 0.2}, "f32");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)[0].data<float>()[0], static_cast<float>(0.1 + 0.2));
}

TEST(SumScalars, RejectsTensorsAndBadTypeNames) {
  cpu::CpuEvaluator ev;
  absl::StatusOr<std::vector<ir::Tensor>> r =
      ev.Evaluate(ReductionNode(ir::OpKind::kSumScalars, ""),
                  {ir::Tensor::Scalar<double>(1), ir::Tensor::FromVector<double>({2}, {1, 2})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("optimizer/sum"));
  EXPECT_THAT(r.status().message(), HasSubstr("1"));
  r = ev.Evaluate(ReductionNode(ir::OpKind::kSumSquares, "int8"), {ir::Tensor::FromVector<float>({1}, {1})});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'to'"));
}

TEST(OptimizerKernels, MismatchedGradientNamesNode) {
  ir::Node node;
  node.op = ir::OpKind::kSGDUpdate;
  node.name = "optimizer/w/SGDUpdate";
  node.outputs = {0};
  cpu::CpuEvaluator ev;
  absl::StatusOr<std::vector<ir::Tensor>> r =
      ev.Evaluate(node, {ir::Tensor(ir::DType::kF32, {2, 3}), ir::Tensor(ir::DType::kF32, {3, 2}),
                         ir::Tensor::Scalar<double>(0.1)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("optimizer/w/SGDUpdate"));
  EXPECT_THAT(r.status().message(), HasSubstr("input 1"));
}

TEST(OptimizerKernels, AdamWRejectsStepZero) {
  ir::Node node;
  node.op = ir::OpKind::kAdamWUpdate;
  node.name = "adam";
  node.outputs = {0, 1, 2};
  const ir::Tensor z(ir::DType::kF64, {2});
  cpu::CpuEvaluator ev;
  absl::StatusOr<std::vector<ir::Tensor>> r = ev.Evaluate(
      node, {z, z, z, z, ir::Tensor::Scalar<double>(0.1), ir::Tensor::Scalar<int64_t>(0)});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("step must be >= 1"));
}

TEST(AddOptimizer, RejectsBadOptionsAndParameters) {
  OptimizerOptions o;
  o.nesterov = true;  // without momentum
  ir::Graph g;
  const ir::ValueId p = g.AddConstant("w", ir::Tensor(ir::DType::kF32, {2}), true);
  const ir::ValueId gr = g.AddValue("grad/w", ir::DType::kF32, ir::FromInts({3}));
  EXPECT_THAT(autodiff::AddOptimizer(&g, {{p, gr}}, o).status().message(), HasSubstr("nesterov"));
  o.nesterov = false;
  EXPECT_THAT(autodiff::AddOptimizer(&g, {{p, gr}}, o).status().message(),
              HasSubstr("gradient 'grad/w'"));
  EXPECT_THAT(autodiff::AddOptimizer(&g, {}, o).status().message(), HasSubstr("no trainable"));
}

// ---------------------------------------------------------------------------------------------
// Several steps against torch.optim.

struct TorchCase {
  std::string name;
  std::string args;  // torch_optim_reference.py flags
  OptimizerOptions options;
  double lr;
};

class TorchOptimizerTest : public ::testing::TestWithParam<std::tuple<TorchCase, bool>> {};

template <typename T>
void RunTorchCase(const TorchCase& c, const std::string& dtype, double tol) {
  const std::string cmd = std::string(ONNXPIPE_PYTHON) + " " + ONNXPIPE_SOURCE_DIR +
                          "/tests/train/torch_optim_reference.py --steps 3 --dtype " + dtype +
                          " --lr " + std::to_string(c.lr) + " " + c.args;
  const nlohmann::json ref = nlohmann::json::parse(RunCommand(cmd));
  const auto init = ref["params0"].get<std::vector<std::vector<double>>>();
  OptGraph og = MakeOptGraph<T>({{3, 5}, {4}}, init, c.options);
  const auto& grads = ref["grads"];
  for (size_t k = 0; k < grads.size(); ++k) {
    const double norm =
        Step<T>(og, grads[k].get<std::vector<std::vector<double>>>(), c.lr, static_cast<int64_t>(k + 1));
    EXPECT_NEAR(norm, ref["norms"][k].get<double>(), tol * ref["norms"][k].get<double>())
        << "step " << k;
    const auto after = ref["after"][k].get<std::vector<std::vector<double>>>();
    ExpectNear(Values(og.g, og.params[0]), after[0], tol, c.name + " param0 step " + std::to_string(k));
    ExpectNear(Values(og.g, og.params[1]), after[1], tol, c.name + " param1 step " + std::to_string(k));
  }
}

TEST_P(TorchOptimizerTest, MatchesTorchOptim) {
  const auto& [c, fp64] = GetParam();
  if (fp64) {
    RunTorchCase<double>(c, "float64", 1e-12);
  } else {
    RunTorchCase<float>(c, "float32", 2e-6);
  }
}

std::vector<TorchCase> Cases() {
  std::vector<TorchCase> cases;
  OptimizerOptions sgd;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  cases.push_back({"sgd_momentum_wd", "--optimizer sgd --momentum 0.9 --weight-decay 0.01", sgd, 0.05});
  OptimizerOptions nest = sgd;
  nest.nesterov = true;
  nest.clip_norm = 2.0;
  cases.push_back({"sgd_nesterov_clip",
                   "--optimizer sgd --momentum 0.9 --nesterov --weight-decay 0.01 --clip-norm 2",
                   nest, 0.05});
  OptimizerOptions adamw;
  adamw.kind = OptimizerKind::kAdamW;
  adamw.weight_decay = 0.01;
  cases.push_back({"adamw", "--optimizer adamw --weight-decay 0.01", adamw, 1e-2});
  OptimizerOptions adamw2 = adamw;
  adamw2.beta1 = 0.8;
  adamw2.beta2 = 0.99;
  adamw2.eps = 1e-6;
  adamw2.clip_norm = 1.0;
  cases.push_back({"adamw_betas_clip",
                   "--optimizer adamw --weight-decay 0.01 --beta1 0.8 --beta2 0.99 --eps 1e-6 "
                   "--clip-norm 1",
                   adamw2, 1e-2});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Torch, TorchOptimizerTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param) ? "_fp64" : "_fp32");
                         });

}  // namespace
}  // namespace onnxpipe
