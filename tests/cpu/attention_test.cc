// Fused Attention against the same computation decomposed into primitive kernels
// (MatMul, Transpose, Mul, Add, Softmax, MatMul), and its dropout against an explicit mask;
// grouped-query attention (fewer K/V heads), forward and backward, against numpy.
#include <cmath>
#include <limits>

#include "executor/cpu/dropout.h"
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

// softmax(scale * Q K^T + additive) V via primitive nodes; `additive` may be undefined.
Tensor Decomposed(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& additive,
                  const Tensor& keep_scaled = Tensor()) {
  std::vector<int64_t> perm(k.rank());
  for (int64_t i = 0; i < k.rank(); ++i) perm[i] = i;
  std::swap(perm[k.rank() - 1], perm[k.rank() - 2]);
  ir::Attrs tp;
  tp.Set("perm", perm);
  Tensor kt = Eval1(MakeNode(OpKind::kTranspose, 1, 1, tp), {k});
  Tensor s = Eval1(MakeNode(OpKind::kMatMul, 2), {q, kt});
  s = Eval1(MakeNode(OpKind::kMul, 2), {s, Tensor::Scalar<double>(scale).CastTo(q.dtype())});
  if (additive.defined()) s = Eval1(MakeNode(OpKind::kAdd, 2), {s, additive});
  Tensor p = Eval1(MakeNode(OpKind::kSoftmax, 1), {s});
  if (keep_scaled.defined()) p = Eval1(MakeNode(OpKind::kMul, 2), {p, keep_scaled});
  return Eval1(MakeNode(OpKind::kMatMul, 2), {p, v});
}

ir::Node AttentionNode(int n_in, double scale, int64_t causal, const std::string& mask_kind = "additive",
                       double dropout = 0.0) {
  ir::Attrs a;
  a.Set("scale", scale);
  a.Set("causal", causal);
  a.Set("mask_kind", mask_kind);
  a.Set("dropout", dropout);
  return MakeNode(OpKind::kAttention, n_in, 1, a, "/layers.0/self_attn/Attention");
}

TEST(Attention, MatchesDecompositionWithBroadcastBatchAndAdditiveMask) {
  for (DType dt : FloatDTypes()) {
    Tensor q = Rand(dt, {2, 3, 4, 8}, 1), k = Rand(dt, {1, 3, 6, 8}, 2), v = Rand(dt, {2, 1, 6, 5}, 3);
    Tensor mask = Rand(dt, {2, 1, 1, 6}, 4, -3, 0);
    const double scale = 0.37;
    Tensor got = Eval1(AttentionNode(4, scale, 0), {q, k, v, mask});
    Tensor want = Decomposed(q, k, v, scale, mask);
    EXPECT_EQ(got.dims(), (std::vector<int64_t>{2, 3, 4, 5}));
    EXPECT_TRUE(AllClose(got, want, RelTol(dt) * 10, RelTol(dt) * 10)) << ir::DTypeName(dt);
    // No mask, default scale 1/sqrt(Dh).
    ir::Node plain = MakeNode(OpKind::kAttention, 3, 1, {}, "attn");
    EXPECT_TRUE(AllClose(Eval1(plain, {q, k, v}), Decomposed(q, k, v, 1 / std::sqrt(8.0), Tensor()), RelTol(dt) * 10,
                         RelTol(dt) * 10));
  }
}

TEST(Attention, CausalIsTopLeftAlignedAndBoolMaskMarksVisibleKeys) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : FloatDTypes()) {
    Tensor q = Rand(dt, {2, 5, 4}, 5), k = Rand(dt, {2, 7, 4}, 6), v = Rand(dt, {2, 7, 3}, 7);
    // Causal: key j visible from query i iff j <= i.
    Tensor causal(DType::kF64, {5, 7});
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 7; ++j) causal.mutable_data<double>()[i * 7 + j] = j <= i ? 0 : -inf;
    EXPECT_TRUE(AllClose(Eval1(AttentionNode(3, 0.5, 1), {q, k, v}), Decomposed(q, k, v, 0.5, causal.CastTo(dt)),
                         RelTol(dt) * 10, RelTol(dt) * 10));
    // Bool mask (true = attend), broadcast over the batch, combined with causal.
    Tensor bmask = Tensor::FromVector<bool>({1, 7}, {true, false, true, true, false, true, true});
    Tensor additive(DType::kF64, {5, 7});
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 7; ++j)
        additive.mutable_data<double>()[i * 7 + j] = (j <= i && bmask.data<bool>()[j]) ? 0 : -inf;
    EXPECT_TRUE(AllClose(Eval1(AttentionNode(4, 0.5, 1, "bool"), {q, k, v, bmask}),
                         Decomposed(q, k, v, 0.5, additive.CastTo(dt)), RelTol(dt) * 10, RelTol(dt) * 10));
  }
}

TEST(Attention, StatsAreEachRowsLogSumExpOfItsVisibleScores) {
  // Q (2, 3, 2), K (2, 4, 2), causal with a bool key mask: lse_i = log sum_j exp(scale q_i . k_j)
  // over the visible j, computed here in double; a row with no visible key gets -inf.
  const Tensor q = Rand(DType::kF32, {2, 3, 2}, 21), k = Rand(DType::kF32, {2, 4, 2}, 22);
  const Tensor v = Rand(DType::kF32, {2, 4, 3}, 23);
  const Tensor mask = Tensor::FromVector<bool>({2, 1, 4}, {false, true, true, true, true, true, false, true});
  ir::Node node = AttentionNode(4, 0.7, 1, "bool");
  node.outputs.push_back(node.outputs[0] + 1);
  absl::StatusOr<std::vector<Tensor>> out = Eval(node, {q, k, v, mask});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  const Tensor& stats = (*out)[1];
  ASSERT_EQ(stats.dtype(), DType::kF32);
  ASSERT_EQ(stats.dims(), (std::vector<int64_t>{2, 3}));
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 3; ++i) {
      double sum = 0;
      for (int j = 0; j <= i; ++j) {
        if (!mask.data<bool>()[b * 4 + j]) continue;
        double dot = 0;
        for (int d = 0; d < 2; ++d) dot += q.data<float>()[(b * 3 + i) * 2 + d] * k.data<float>()[(b * 4 + j) * 2 + d];
        sum += std::exp(0.7 * dot);
      }
      const float got = stats.data<float>()[b * 3 + i];
      if (sum == 0) {
        EXPECT_EQ(got, -std::numeric_limits<float>::infinity()) << b << " " << i;
      } else {
        EXPECT_NEAR(got, std::log(sum), 1e-5) << b << " " << i;
      }
    }
  }
}

TEST(Attention, FullyMaskedRowsGiveZeros) {
  Tensor q = Rand(DType::kF32, {2, 3}, 8), k = Rand(DType::kF32, {4, 3}, 9), v = Rand(DType::kF32, {4, 2}, 10);
  Tensor mask = Tensor::FromVector<bool>({2, 4}, {false, false, false, false, true, true, false, true});
  Tensor o = Eval1(AttentionNode(4, 1.0, 0, "bool"), {q, k, v, mask});
  EXPECT_EQ(o.data<float>()[0], 0.f);
  EXPECT_EQ(o.data<float>()[1], 0.f);
  EXPECT_FALSE(std::isnan(o.data<float>()[2]));
}

TEST(Attention, DropoutAppliesTheNodesPhiloxMaskOnlyWhileTraining) {
  for (DType dt : FloatDTypes()) {
    Tensor q = Rand(dt, {2, 2, 6, 4}, 11), k = Rand(dt, {2, 2, 6, 4}, 12), v = Rand(dt, {2, 2, 6, 4}, 13);
    const double ratio = 0.25;
    ir::Node node = AttentionNode(3, 0.5, 0, "additive", ratio);
    const EvalContext train{true, 1234, 7};
    Tensor o = Eval1(node, {q, k, v}, train);
    // The mask is indexed by the flat position in (B, H, Sq, Sk).
    const int64_t n = 2 * 2 * 6 * 6;
    std::vector<uint8_t> keep(n);
    FillDropoutKeepMask(MakeDropoutStream(node, train, ratio), 0, n, keep.data());
    Tensor ks(DType::kF64, {2, 2, 6, 6});
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      ks.mutable_data<double>()[i] = keep[i] ? 1.0 / (1.0 - ratio) : 0.0;
      kept += keep[i];
    }
    EXPECT_GT(kept, n / 2);
    EXPECT_LT(kept, n);
    EXPECT_TRUE(AllClose(o, Decomposed(q, k, v, 0.5, Tensor(), ks.CastTo(dt)), RelTol(dt) * 10, RelTol(dt) * 10));
    // Same context: bit-identical; another offset: different; inference: no dropout.
    EXPECT_TRUE(Eval1(node, {q, k, v}, train).BitwiseEquals(o));
    EXPECT_FALSE(Eval1(node, {q, k, v}, EvalContext{true, 1234, 8}).BitwiseEquals(o));
    EXPECT_TRUE(AllClose(Eval1(node, {q, k, v}), Decomposed(q, k, v, 0.5, Tensor()), RelTol(dt) * 10, RelTol(dt) * 10));
  }
}

TEST(Attention, ShapeAndKindErrors) {
  Tensor q = Rand(DType::kF32, {2, 3}, 1), k = Rand(DType::kF32, {4, 3}, 2), v = Rand(DType::kF32, {4, 2}, 3);
  EXPECT_FALSE(Eval(AttentionNode(3, 1, 0), {q, Rand(DType::kF32, {4, 2}, 2), v}).ok());
  EXPECT_FALSE(Eval(AttentionNode(3, 1, 0), {q, k, Rand(DType::kF32, {5, 2}, 2)}).ok());
  EXPECT_FALSE(Eval(AttentionNode(4, 1, 0), {q, k, v, Rand(DType::kF32, {3, 4}, 2)}).ok());
  EXPECT_FALSE(Eval(AttentionNode(4, 1, 0, "bool"), {q, k, v, Rand(DType::kF32, {2, 4}, 2)}).ok());
  EXPECT_FALSE(Eval(AttentionNode(3, 1, 0), {q.CastTo(DType::kF64), k, v}).ok());
}

// Grouped-query attention (K and V with fewer heads than Q) against numpy: K and V repeated over the
// query heads as transformers' repeat_kv does (np.repeat on the head axis: K/V head j serves query
// heads [j n_rep, (j + 1) n_rep)), the forward, and the backward with dK, dV summed over each group.
TEST(Attention, GroupedKvHeadsMatchNumpyRepeatKvForwardAndBackward) {
  for (DType dt : FloatDTypes()) {
    for (int64_t causal : {0, 1}) {
      const double scale = 0.41;
      Tensor q = Rand(dt, {2, 6, 4, 8}, 11), k = Rand(dt, {2, 2, 5, 8}, 12), v = Rand(dt, {2, 2, 5, 3}, 13);
      Tensor d_o = Rand(dt, {2, 6, 4, 3}, 14);
      const std::string code = "scale = " + std::to_string(scale) + "\ncausal = " + std::to_string(causal) + R"(
q, k, v, do = (a[n].astype(np.float64) for n in ('q', 'k', 'v', 'do'))
n_rep = q.shape[1] // k.shape[1]
kr, vr = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
s = scale * q @ kr.swapaxes(-1, -2)
if causal:
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True))
p /= p.sum(-1, keepdims=True)
out['o'] = p @ vr
dp = do @ vr.swapaxes(-1, -2)
ds = p * (dp - (dp * p).sum(-1, keepdims=True))
out['dq'] = scale * ds @ kr
out['dk'] = (scale * ds.swapaxes(-1, -2) @ q).reshape(k.shape[0], k.shape[1], n_rep, *k.shape[2:]).sum(2)
out['dv'] = (p.swapaxes(-1, -2) @ do).reshape(v.shape[0], v.shape[1], n_rep, *v.shape[2:]).sum(2)
)";
      auto ref = Numpy({{"q", q}, {"k", k}, {"v", v}, {"do", d_o}}, code);
      const double tol = RelTol(dt) * 10;
      Tensor o = Eval1(AttentionNode(3, scale, causal), {q, k, v});
      EXPECT_EQ(o.dims(), (std::vector<int64_t>{2, 6, 4, 3}));
      EXPECT_TRUE(AllClose(o, ref["o"].CastTo(dt), tol, tol)) << ir::DTypeName(dt) << " causal " << causal;
      ir::Node grad = MakeNode(OpKind::kAttentionGrad, 4, 3, AttentionNode(3, scale, causal).attrs, "attn_grad");
      absl::StatusOr<std::vector<Tensor>> g = Eval(grad, {d_o, q, k, v});
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ((*g)[1].dims(), k.dims());
      EXPECT_EQ((*g)[2].dims(), v.dims());
      const char* names[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(AllClose((*g)[i], ref[names[i]].CastTo(dt), tol, tol))
            << names[i] << " " << ir::DTypeName(dt) << " causal " << causal;
      }
    }
  }
}

TEST(Attention, KvHeadsThatDoNotDivideTheQueryHeadsAreAnError) {
  Tensor q = Rand(DType::kF32, {1, 6, 4, 8}, 1), k = Rand(DType::kF32, {1, 4, 5, 8}, 2),
         v = Rand(DType::kF32, {1, 4, 5, 3}, 3);
  EXPECT_FALSE(Eval(AttentionNode(3, 0.5, 0), {q, k, v}).ok());
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
