// SoftmaxCrossEntropyLoss against a numpy port of the ONNX reference implementation.
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

}  // namespace
}  // namespace onnxpipe::cpu::testing
