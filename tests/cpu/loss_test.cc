// SoftmaxCrossEntropyLoss against a numpy port of the ONNX reference implementation.
#include <cmath>
#include <cstring>
#include <optional>

#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

// numpy: the ONNX reference (onnx/backend/test/case/node/softmaxcrossentropy.py), in float64.
const char kReference[] = R"(
def sce(x, target, weight=None, reduction='mean', ignore_index=None):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    N, C = x.shape[0], x.shape[1]
    lp3 = lp.reshape(N, C, -1)
    t = target.reshape(N, -1)
    loss = np.zeros(t.shape)
    w = np.zeros(t.shape)
    for n in range(N):
        for d in range(t.shape[1]):
            if ignore_index is not None and t[n, d] == ignore_index:
                continue
            wt = 1.0 if weight is None else float(weight[t[n, d]])
            loss[n, d] = -wt * lp3[n, t[n, d], d]
            w[n, d] = wt
    loss = loss.reshape(target.shape)
    if reduction == 'none':
        return loss, lp
    if reduction == 'sum':
        return loss.sum(), lp
    return loss.sum() / w.sum(), lp
)";

TEST(SoftmaxCrossEntropyLoss, MatchesReferenceForReductionsWeightsAndIgnoreIndex) {
  struct Case {
    std::vector<int64_t> scores;
    std::string reduction;
    bool weights;
    std::optional<int64_t> ignore;
  };
  const std::vector<Case> cases = {
      {{6, 5}, "mean", false, std::nullopt}, {{6, 5}, "sum", true, std::nullopt}, {{6, 5}, "none", false, 2},
      {{3, 4, 7}, "mean", true, 1},          {{3, 4, 7}, "mean", false, -1},     {{2, 3, 2, 4}, "none", true, -100},
      {{2, 3, 2, 4}, "sum", false, 0},       {{4, 6}, "mean", true, 3},
  };
  for (DType dt : FloatDTypes()) {
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      Tensor x = Rand(dt, cs.scores, 70 + c, -4, 4);
      std::vector<int64_t> ldims = cs.scores;
      ldims.erase(ldims.begin() + 1);
      const int64_t classes = cs.scores[1];
      Tensor labels = RandInt(DType::kI64, ldims, 80 + c, 0, classes - 1);
      if (cs.ignore && *cs.ignore < 0) {  // plant some ignored positions outside [0, C)
        labels.mutable_data<int64_t>()[0] = *cs.ignore;
        labels.mutable_data<int64_t>()[labels.num_elements() - 1] = *cs.ignore;
      }
      Tensor w = Rand(dt, {classes}, 90 + c, 0.2, 2);
      ir::Attrs attrs;
      attrs.Set("reduction", cs.reduction);
      if (cs.ignore) attrs.Set("ignore_index", *cs.ignore);
      std::vector<Tensor> inputs = {x, labels.CastTo(c % 2 ? DType::kI32 : DType::kI64)};
      if (cs.weights) inputs.push_back(w);
      auto r = Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, static_cast<int>(inputs.size()), 2, attrs), inputs);
      ASSERT_TRUE(r.ok()) << r.status();
      std::string call = "l, lp = sce(a['x'], a['t'], " + std::string(cs.weights ? "a['w']" : "None") + ", '" +
                         cs.reduction + "', " + (cs.ignore ? std::to_string(*cs.ignore) : "None") + ")\n";
      auto ref = Numpy({{"x", x}, {"t", labels}, {"w", w}}, std::string(kReference) + call + "out['l'] = l\nout['lp'] = lp\n");
      EXPECT_TRUE(AllClose((*r)[0], ref["l"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5)) << c << " " << ir::DTypeName(dt);
      EXPECT_TRUE(AllClose((*r)[1], ref["lp"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5)) << c << " " << ir::DTypeName(dt);
    }
  }
}

TEST(SoftmaxCrossEntropyLoss, HandComputedTwoClassValue) {
  // scores [0, ln 3]: p = [1/4, 3/4]; label 1 -> -ln(3/4); label 0 -> -ln(1/4).
  Tensor x = Tensor::FromVector<double>({2, 2}, {0.0, std::log(3.0), 0.0, std::log(3.0)});
  Tensor y = I64Vec({1, 0});
  Tensor l = Eval1(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2), {x, y});
  EXPECT_EQ(l.dims(), std::vector<int64_t>{});
  EXPECT_NEAR(l.data<double>()[0], (-std::log(0.75) - std::log(0.25)) / 2, 1e-15);
}

TEST(SoftmaxCrossEntropyLoss, BadLabelsAndShapes) {
  Tensor x = Rand(DType::kF32, {3, 4}, 1);
  auto r = Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2, 1, {}, "/loss"), {x, I64Vec({0, 4, 1})});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("label 4 at position 1"), std::string::npos) << r.status();
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2), {x, I64Vec({0, -1, 1})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2), {x, I64Vec({0, 1})}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 2), {x, Rand(DType::kF32, {3}, 2)}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, 3), {x, I64Vec({0, 1, 2}), Rand(DType::kF32, {3}, 2)}).ok());
}

// numpy, float64: PyTorch's CrossEntropyLoss(weight, ignore_index, label_smoothing, reduction) for scores
// (N, C, d...) and its gradient with respect to the scores for the incoming gradient dl.
const char kSmoothedReference[] = R"(
def sce_grad(x, t, w, reduction, ignore, e, dl):
    x = x.astype(np.float64)
    N, C = x.shape[0], x.shape[1]
    x3 = x.reshape(N, C, -1)
    t2 = t.reshape(N, -1)
    w = np.ones(C) if w is None else w.astype(np.float64)
    m = x3.max(axis=1, keepdims=True)
    lp = x3 - m - np.log(np.exp(x3 - m).sum(axis=1, keepdims=True))
    p = np.exp(lp)
    loss = np.zeros(t2.shape); wl = np.zeros(t2.shape); g = np.zeros(x3.shape)
    stats = np.zeros(t2.shape + (2,))
    stats[..., 0] = m[:, 0, :]
    stats[..., 1] = np.log(np.exp(x3 - m).sum(axis=1))
    for n in range(N):
        for d in range(t2.shape[1]):
            l = int(t2[n, d])
            if ignore is not None and l == ignore:
                continue
            loss[n, d] = (1 - e) * w[l] * -lp[n, l, d] + e / C * (w * -lp[n, :, d]).sum()
            wl[n, d] = w[l]
            oh = np.zeros(C); oh[l] = 1
            g[n, :, d] = (1 - e) * w[l] * (p[n, :, d] - oh) + e / C * (w.sum() * p[n, :, d] - w)
    if reduction == 'none':
        out['loss'] = loss.reshape(t.shape)
        g = g * dl.reshape(N, 1, -1)
    elif reduction == 'sum':
        out['loss'] = np.array(loss.sum())
        g = g * float(dl)
    else:
        out['loss'] = np.array(loss.sum() / wl.sum())
        g = g * float(dl) / wl.sum()
    out['grad'] = g.reshape(x.shape)
    out['stats'] = stats.reshape(t.shape + (2,))
)";

struct SmoothCase {
  std::vector<int64_t> scores;
  std::string reduction;
  bool weights;
  std::optional<int64_t> ignore;
  double smoothing;
};
const std::vector<SmoothCase>& SmoothCases() {
  static const std::vector<SmoothCase> cases = {
      {{6, 5}, "mean", false, -100, 0.0},   {{6, 5}, "mean", true, -100, 0.1}, {{5, 7}, "sum", true, 3, 0.2},
      {{6, 5}, "none", false, 2, 0.05},     {{3, 4, 7}, "mean", true, 1, 0.1}, {{2, 3, 2, 4}, "none", true, -100, 0.0},
      {{8, 1000}, "mean", false, -100, 0.0}, {{8, 1000}, "mean", true, 0, 0.1},
  };
  return cases;
}

// A loss node writing loss and Stats (no log_prob), as autodiff builds it.
ir::Node LossWithStats(int num_inputs, const ir::Attrs& attrs) {
  ir::Node n = MakeNode(OpKind::kSoftmaxCrossEntropyLoss, num_inputs, 3, attrs);
  n.outputs[1] = ir::kNoValue;
  return n;
}
// SoftmaxCrossEntropyLossGrad(dLoss, X, labels, weights?, Stats?).
ir::Node LossGrad(bool weights, bool stats, const ir::Attrs& attrs) {
  ir::Node n = MakeNode(OpKind::kSoftmaxCrossEntropyLossGrad, stats ? 5 : (weights ? 4 : 3), 1, attrs);
  if (stats && !weights) n.inputs[3] = ir::kNoValue;
  return n;
}

struct SmoothInputs {
  Tensor x, labels, w, dloss;
  ir::Attrs attrs;
};
// Inputs of case `c` with scores of dtype `dt` (bf16 scores hold bf16 values; the weights are f32 for them).
SmoothInputs MakeSmoothInputs(const SmoothCase& cs, size_t c, DType dt) {
  SmoothInputs in;
  const DType wdt = dt == DType::kBF16 ? DType::kF32 : dt;
  in.x = Rand(DType::kF32, cs.scores, 170 + c, -6, 6).CastTo(dt);
  std::vector<int64_t> ldims = cs.scores;
  ldims.erase(ldims.begin() + 1);
  in.labels = RandInt(DType::kI64, ldims, 180 + c, 0, cs.scores[1] - 1);
  if (cs.ignore && *cs.ignore < 0) in.labels.mutable_data<int64_t>()[1] = *cs.ignore;
  in.w = Rand(wdt, {cs.scores[1]}, 190 + c, 0.2, 2);
  in.dloss = cs.reduction == "none" ? Rand(wdt, ldims, 200 + c, -1, 1) : Tensor::FromVector<double>({}, {0.75}).CastTo(wdt);
  in.attrs.Set("reduction", cs.reduction);
  if (cs.ignore) in.attrs.Set("ignore_index", *cs.ignore);
  if (cs.smoothing != 0) in.attrs.Set("label_smoothing", cs.smoothing);
  return in;
}

::testing::AssertionResult BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.dims() != b.dims()) return ::testing::AssertionFailure() << "dtype or dims differ";
  if (std::memcmp(a.raw(), b.raw(), a.num_bytes()) != 0) return ::testing::AssertionFailure() << "bits differ";
  return ::testing::AssertionSuccess();
}

// The forward keeping Stats instead of log_prob, and the gradient recomputing log_prob from the scores and
// Stats, give exactly the bits of the log_prob path (f32 and f64): the loss, and dScores.
TEST(SoftmaxCrossEntropyLoss, StatsPathIsBitwiseTheLogProbPath) {
  for (DType dt : FloatDTypes()) {
    for (size_t c = 0; c < SmoothCases().size(); ++c) {
      SCOPED_TRACE(std::to_string(c) + " " + std::string(ir::DTypeName(dt)));
      const SmoothCase& cs = SmoothCases()[c];
      const SmoothInputs in = MakeSmoothInputs(cs, c, dt);
      std::vector<Tensor> ins = {in.x, in.labels};
      if (cs.weights) ins.push_back(in.w);
      const int ni = static_cast<int>(ins.size());
      auto with_lp = Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, ni, 2, in.attrs), ins);
      auto loss_only = Eval(MakeNode(OpKind::kSoftmaxCrossEntropyLoss, ni, 1, in.attrs), ins);
      auto with_stats = Eval(LossWithStats(ni, in.attrs), ins);
      ASSERT_TRUE(with_lp.ok() && loss_only.ok() && with_stats.ok()) << with_stats.status();
      EXPECT_TRUE(BitwiseEqual((*loss_only)[0], (*with_lp)[0]));
      EXPECT_TRUE(BitwiseEqual((*with_stats)[0], (*with_lp)[0]));
      const Tensor& stats = (*with_stats)[2];
      std::vector<Tensor> old_in = {in.dloss, (*with_lp)[1], in.labels};
      std::vector<Tensor> new_in = {in.dloss, in.x, in.labels, cs.weights ? in.w : Tensor(), stats};
      if (cs.weights) old_in.push_back(in.w);
      auto old_grad = Eval(LossGrad(cs.weights, false, in.attrs), old_in);
      auto new_grad = Eval(LossGrad(cs.weights, true, in.attrs), new_in);
      ASSERT_TRUE(old_grad.ok() && new_grad.ok()) << new_grad.status();
      EXPECT_TRUE(BitwiseEqual((*new_grad)[0], (*old_grad)[0]));
    }
  }
}

// bf16 and f32 scores with class weights, ignore_index and label smoothing against numpy (float64 on the
// same values): the loss and Stats are f32 for bf16 scores (computed in f32), dScores are bf16 (f32's
// result rounded once: within half a bf16 ulp of the exact value, plus f32's error).
TEST(SoftmaxCrossEntropyLoss, HalfAndF32ScoresAgainstNumpyWithSmoothingWeightsAndIgnoreIndex) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    const DType compute = DType::kF32;
    for (size_t c = 0; c < SmoothCases().size(); ++c) {
      SCOPED_TRACE(std::to_string(c) + " " + std::string(ir::DTypeName(dt)));
      const SmoothCase& cs = SmoothCases()[c];
      const SmoothInputs in = MakeSmoothInputs(cs, c, dt);
      std::vector<Tensor> ins = {in.x, in.labels};
      if (cs.weights) ins.push_back(in.w);
      auto fwd = Eval(LossWithStats(static_cast<int>(ins.size()), in.attrs), ins);
      ASSERT_TRUE(fwd.ok()) << fwd.status();
      ASSERT_EQ((*fwd)[0].dtype(), compute);
      ASSERT_EQ((*fwd)[2].dtype(), compute);
      auto grad = Eval(LossGrad(cs.weights, true, in.attrs),
                       {in.dloss, in.x, in.labels, cs.weights ? in.w : Tensor(), (*fwd)[2]});
      ASSERT_TRUE(grad.ok()) << grad.status();
      ASSERT_EQ((*grad)[0].dtype(), dt);
      ASSERT_EQ((*grad)[0].dims(), in.x.dims());
      const std::string call = "sce_grad(a['x'], a['t'], " + std::string(cs.weights ? "a['w']" : "None") + ", '" +
                               cs.reduction + "', " + (cs.ignore ? std::to_string(*cs.ignore) : "None") + ", " +
                               std::to_string(cs.smoothing) + ", a['dl'])\n";
      auto ref = Numpy({{"x", in.x.CastTo(DType::kF64)}, {"t", in.labels}, {"w", in.w.CastTo(DType::kF64)},
                        {"dl", in.dloss.CastTo(DType::kF64)}},
                       std::string(kSmoothedReference) + call);
      EXPECT_TRUE(AllClose((*fwd)[0], ref["loss"].CastTo(compute), 2e-5, 1e-6));
      EXPECT_TRUE(AllClose((*fwd)[2], ref["stats"].CastTo(compute), 1e-5, 1e-6));
      const double rtol = dt == DType::kBF16 ? std::ldexp(1.0, -8) : 1e-5;
      EXPECT_TRUE(AllClose((*grad)[0].CastTo(DType::kF64), ref["grad"], rtol, 1e-7, /*check_dtype=*/false));
    }
  }
}

// Hand-computed: scores [0, ln 3] (p = [1/4, 3/4]), label 1, smoothing 0.2, sum: the loss is
// 0.8 (-ln 3/4) + 0.1 (-ln 1/4 - ln 3/4), the gradient 0.8 (p - [0, 1]) + 0.1 (2 p - 1) = [0.15, -0.15];
// in bf16 (ln 3 rounded to 1.09375) and f32, Stats = (max, log-sum-exp of x - max).
TEST(SoftmaxCrossEntropyLoss, HandComputedSmoothedValueFromBf16Scores) {
  for (DType dt : {DType::kBF16, DType::kF32}) {
    SCOPED_TRACE(ir::DTypeName(dt));
    const Tensor x = Tensor::FromVector<float>({1, 2}, {0.0f, static_cast<float>(std::log(3.0))}).CastTo(dt);
    const double l3 = x.CastTo(DType::kF64).data<double>()[1];  // ln 3 as the dtype holds it
    const double p0 = 1.0 / (1.0 + std::exp(l3)), p1 = 1.0 - p0;
    ir::Attrs attrs;
    attrs.Set("reduction", std::string("sum"));
    attrs.Set("label_smoothing", 0.2);
    auto fwd = Eval(LossWithStats(2, attrs), {x, I64Vec({1})});
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    EXPECT_NEAR((*fwd)[0].data<float>()[0], 0.8 * -std::log(p1) + 0.1 * (-std::log(p0) - std::log(p1)), 1e-6);
    EXPECT_EQ((*fwd)[2].data<float>()[0], static_cast<float>(l3));
    EXPECT_NEAR((*fwd)[2].data<float>()[1], std::log(1.0 + std::exp(-l3)), 1e-7);
    auto grad = Eval(LossGrad(false, true, attrs), {Tensor::FromVector<float>({}, {1.0f}), x, I64Vec({1}), Tensor(), (*fwd)[2]});
    ASSERT_TRUE(grad.ok()) << grad.status();
    const Tensor g = (*grad)[0].CastTo(DType::kF64);
    EXPECT_NEAR(g.data<double>()[0], 0.8 * p0 + 0.1 * (2 * p0 - 1), 2e-3);
    EXPECT_NEAR(g.data<double>()[1], 0.8 * (p1 - 1) + 0.1 * (2 * p1 - 1), 2e-3);
  }
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
