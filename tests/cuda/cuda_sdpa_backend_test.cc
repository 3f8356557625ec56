// cuDNN's SDPA through the CUDA backend's Attention and AttentionGrad kernels
// (attention_kernels.cc, CudaOptions::attention = kCudnn): bf16 O, dQ, dK, dV against the CPU
// backend's fp32 kernels on the same values widened, by normalised error (max |gpu - cpu| over
// max |cpu|), unplanned and planned (a workspace of exactly what WorkspaceBytes reported), with no
// mask, causal, a right-padded bool key-padding mask, a full additive bias and one K/V head.
// Dropout (cuDNN's own Philox mask, not the CPU's stream) is checked on its own: with V = I the
// forward's O is the dropped probability matrix, so its zeros are the mask; the same ExecContext
// gives the same O bit for bit, another micro-batch or step another mask, and the backward's dQ,
// dK, dV equal a double-precision reference written here with that mask. Also: auto picks cuDNN
// for bf16 and flash for fp32, and --cuda-attention cudnn names a node it cannot run.
// Skips without a GPU; built only where cuDNN and its frontend were found.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "frontend/ir/status.h"
#include "gmock/gmock.h"
#include "tests/cpu/test_util.h"
#include "tests/cuda/device_tensor.h"
#include "tests/cuda/planned_outputs.h"

namespace onnxpipe::cuda::testing {
namespace {

using cpu::testing::Rand;
using ir::DType;
using ir::Tensor;

constexpr double kBf16Tolerance = 1e-2;

// max |got - want| <= tol * max |want|, no NaN.
::testing::AssertionResult Close(const Tensor& got, const Tensor& want, double tol) {
  if (got.dims() != want.dims()) return ::testing::AssertionFailure() << "dims differ";
  double max_err = 0, max_ref = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    const double g = got.GetAsDouble(i), w = want.GetAsDouble(i);
    if (std::isnan(g)) return ::testing::AssertionFailure() << "NaN at element " << i;
    if (std::abs(g - w) > max_err) max_err = std::abs(g - w), worst = i;
    max_ref = std::max(max_ref, std::abs(w));
  }
  if (max_err <= tol * max_ref) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |gpu - ref| " << max_err << " at element " << worst << " (gpu "
                                       << got.GetAsDouble(worst) << ", ref " << want.GetAsDouble(worst)
                                       << "), max |ref| " << max_ref << ", normalised " << max_err / max_ref;
}

std::vector<Tensor> Cast(const std::vector<Tensor>& in, DType from, DType to) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.defined() && t.dtype() == from ? t.CastTo(to) : t);
  return out;
}

class SdpaBackendTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {.attention = AttentionImpl::kCudnn});
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
  }

  // `op` on the GPU, on the device and through cuDNN (one more cuDNN run, no host fallback):
  // outputs as fp32 host tensors (undefined where absent). Planned: a workspace of exactly what
  // WorkspaceBytes reports.
  std::vector<Tensor> RunOnDevice(ir::OpKind op, const std::string& name, const std::vector<Tensor>& inputs,
                                  const ir::Attrs& attrs, int num_outputs, const backend::ExecContext& ctx,
                                  bool planned, const std::vector<int>& absent = {}) {
    ir::Graph g;
    const ir::Node& node = AddTypedNode(g, op, name, inputs, attrs, num_outputs, absent);
    std::vector<Tensor> dev_in;
    for (const Tensor& t : inputs) {
      if (!t.defined()) {
        dev_in.push_back(t);
        continue;
      }
      absl::StatusOr<Tensor> d = be_->Upload(t);
      EXPECT_TRUE(d.ok()) << d.status();
      if (!d.ok()) return {};
      dev_in.push_back(*d);
    }
    PlannedOutputs plan(*be_, be_->WorkspaceBytes(g, node), /*share=*/false, /*poison_outputs=*/true);
    const int64_t before = be_->AttentionRuns().at("cudnn");
    const std::map<std::string, int64_t> fallbacks = be_->HostFallbacks();
    absl::StatusOr<std::vector<Tensor>> got = be_->Run(node, dev_in, ctx, planned ? &plan : nullptr);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok()) return {};
    EXPECT_EQ(be_->AttentionRuns().at("cudnn"), before + 1) << "not through cuDNN";
    EXPECT_EQ(be_->HostFallbacks(), fallbacks) << "ran on the host";
    std::vector<Tensor> out;
    for (const Tensor& t : *got) {
      if (!t.defined()) {
        out.push_back(t);
        continue;
      }
      // Attention's Stats (output 1) are f32; the rest has the operands' dtype.
      const bool stats = op == ir::OpKind::kAttention && out.size() == 1;
      EXPECT_EQ(t.dtype(), stats ? DType::kF32 : inputs[1].dtype());
      absl::StatusOr<Tensor> h = be_->ToHost(t);
      EXPECT_TRUE(h.ok()) << h.status();
      if (!h.ok()) return {};
      out.push_back(h->CastTo(DType::kF32));
    }
    return out;
  }

  std::shared_ptr<CudaBackend> be_;
};

struct Case {
  std::string name;
  std::vector<int64_t> q, k, v;
  bool causal = false;
  std::vector<int64_t> key_lengths = {};  // a bool (B, 1, 1, Sk) mask, true for j < length
  std::vector<int64_t> bias = {};         // dims of an additive bf16 mask
  std::vector<int> absent_grads = {};
};

class SdpaMatchesTheCpuTest : public SdpaBackendTest, public ::testing::WithParamInterface<Case> {};

TEST_P(SdpaMatchesTheCpuTest, ForwardAndBackwardInBf16MatchTheCpuInFp32) {
  const Case& c = GetParam();
  std::vector<Tensor> in = {Rand(DType::kF32, c.q, 1, -1, 1), Rand(DType::kF32, c.k, 2, -1, 1),
                            Rand(DType::kF32, c.v, 3, -1, 1)};
  ir::Attrs attrs;
  if (c.causal) attrs.Set("causal", int64_t{1});
  if (!c.key_lengths.empty()) {
    const int64_t b = c.q[0], sk = c.k[2];
    Tensor m(DType::kBool, {b, 1, 1, sk});
    for (int64_t i = 0; i < b; ++i)
      for (int64_t j = 0; j < sk; ++j) m.mutable_data<bool>()[i * sk + j] = j < c.key_lengths[i];
    in.push_back(m);
    attrs.Set("mask_kind", std::string("bool"));
  } else if (!c.bias.empty()) {
    in.push_back(Rand(DType::kF32, c.bias, 4, -3, 0));
  }
  in = Cast(in, DType::kF32, DType::kBF16);
  const std::vector<Tensor> ref = Cast(in, DType::kBF16, DType::kF32);
  const backend::ExecContext ctx = {.training = true, .seed = 7, .offset = 2};
  ir::Graph ref_fwd;
  absl::StatusOr<std::vector<Tensor>> want_o =
      backend::MakeCpuBackend()->Run(AddTypedNode(ref_fwd, ir::OpKind::kAttention, "attn", ref, attrs, 2), ref, ctx);
  ASSERT_TRUE(want_o.ok()) << want_o.status();

  ir::Attrs grad_attrs = attrs;
  grad_attrs.Set("rng_key", std::string("attn"));
  std::vector<Tensor> grad_in = {Rand(DType::kF32, (*want_o)[0].dims(), 5, -1, 1).CastTo(DType::kBF16)};
  grad_in.insert(grad_in.end(), in.begin(), in.end());
  const std::vector<Tensor> grad_ref = Cast(grad_in, DType::kBF16, DType::kF32);
  ir::Graph ref_g;
  absl::StatusOr<std::vector<Tensor>> want_grads = backend::MakeCpuBackend()->Run(
      AddTypedNode(ref_g, ir::OpKind::kAttentionGrad, "attn_grad", grad_ref, grad_attrs, 3, c.absent_grads), grad_ref,
      ctx);
  ASSERT_TRUE(want_grads.ok()) << want_grads.status();

  for (bool planned : {false, true}) {
    SCOPED_TRACE(planned ? "planned" : "unplanned");
    const std::vector<Tensor> o = RunOnDevice(ir::OpKind::kAttention, "attn", in, attrs, 2, ctx, planned);
    ASSERT_EQ(o.size(), 2u);
    EXPECT_TRUE(Close(o[0], (*want_o)[0], kBf16Tolerance)) << "O";
    EXPECT_TRUE(Close(o[1], (*want_o)[1], kBf16Tolerance)) << "Stats";
    // The backward re-running the forward, and from the forward's O and Stats (inputs 5, 6).
    for (bool saved : {false, true}) {
      SCOPED_TRACE(saved ? "from the forward's O and Stats" : "re-running the forward");
      std::vector<Tensor> in_b = grad_in;
      if (saved) {
        in_b.resize(5);  // the mask, or absent
        in_b.push_back(o[0].CastTo(DType::kBF16));
        in_b.push_back(o[1]);
      }
      const std::vector<Tensor> grads =
          RunOnDevice(ir::OpKind::kAttentionGrad, "attn_grad", in_b, grad_attrs, 3, ctx, planned, c.absent_grads);
      ASSERT_EQ(grads.size(), 3u);
      for (int i = 0; i < 3; ++i) {
        const bool absent = std::find(c.absent_grads.begin(), c.absent_grads.end(), i) != c.absent_grads.end();
        EXPECT_EQ(grads[i].defined(), !absent) << "gradient " << i;
        if (grads[i].defined()) {
          EXPECT_TRUE(Close(grads[i], (*want_grads)[i], kBf16Tolerance)) << "gradient " << i;
        }
      }
    }
  }
}

Case Shape(std::string name, std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v) {
  Case c;
  c.name = std::move(name);
  c.q = std::move(q), c.k = std::move(k), c.v = std::move(v);
  return c;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaMatchesTheCpuTest,
                         ::testing::Values(
                             Shape("plain", {2, 2, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64}),
                             Shape("d128", {2, 2, 64, 128}, {2, 2, 80, 128}, {2, 2, 80, 128}),
                             [] {
                               Case c = Shape("causal", {2, 3, 128, 64}, {2, 3, 128, 64}, {2, 3, 128, 64});
                               c.causal = true;
                               return c;
                             }(),
                             [] {
                               Case c = Shape("key_padding", {3, 2, 70, 64}, {3, 2, 90, 64}, {3, 2, 90, 64});
                               c.key_lengths = {90, 57, 9};
                               return c;
                             }(),
                             [] {
                               Case c = Shape("causal_key_padding", {3, 2, 100, 64}, {3, 2, 100, 64}, {3, 2, 100, 64});
                               c.causal = true;
                               c.key_lengths = {100, 64, 31};
                               return c;
                             }(),
                             [] {
                               Case c = Shape("full_bias", {2, 2, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64});
                               c.bias = {2, 2, 70, 90};
                               return c;
                             }(),
                             [] {
                               Case c = Shape("bias_shared_over_batch", {2, 2, 64, 64}, {2, 2, 64, 64}, {2, 2, 64, 64});
                               c.bias = {1, 2, 64, 64};
                               return c;
                             }(),
                             Shape("kv_head1", {2, 4, 70, 64}, {2, 1, 90, 64}, {2, 1, 90, 64}),
                             // Grouped-query attention: cuDNN's h_k = h_v < h_q, dK and dV per K/V head.
                             Shape("gqa_8_over_2", {2, 8, 70, 64}, {2, 2, 90, 64}, {2, 2, 90, 64}),
                             [] {
                               Case c = Shape("gqa_causal", {2, 6, 128, 64}, {2, 3, 128, 64}, {2, 3, 128, 64});
                               c.causal = true;
                               return c;
                             }(),
                             [] {
                               Case c = Shape("only_dkdv", {2, 2, 64, 64}, {2, 2, 64, 64}, {2, 2, 64, 64});
                               c.absent_grads = {0};
                               return c;
                             }()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// --- Dropout --------------------------------------------------------------------------------------
// B 2, H 2, Sq = Sk = Dh = Dv = 64, ratio 0.1: with V = I, O = dropout(P) (one row per query).

constexpr int64_t kB = 2, kH = 2, kS = 64, kDh = 64;
constexpr double kRatio = 0.1;

ir::Attrs DropoutAttrs() {
  ir::Attrs a;
  a.Set("dropout", kRatio);
  return a;
}

Tensor Identity() {  // (B, H, S, S) bf16
  Tensor t = Tensor::FromVector<float>({kB, kH, kS, kS}, std::vector<float>(kB * kH * kS * kS, 0.f));
  for (int64_t m = 0; m < kB * kH; ++m)
    for (int64_t i = 0; i < kS; ++i) t.mutable_data<float>()[(m * kS + i) * kS + i] = 1.f;
  return t.CastTo(DType::kBF16);
}

// Kept elements (nonzero) of O = dropout(P) I.
std::vector<bool> KeptOf(const Tensor& o) {
  std::vector<bool> kept(o.num_elements());
  for (int64_t i = 0; i < o.num_elements(); ++i) kept[i] = o.GetAsDouble(i) != 0.0;
  return kept;
}

class SdpaDropoutTest : public SdpaBackendTest {
 protected:
  std::vector<Tensor> Forward(const Tensor& v, const backend::ExecContext& ctx) {
    return RunOnDevice(ir::OpKind::kAttention, "attn", {q_, k_, v}, DropoutAttrs(), 1, ctx, /*planned=*/true);
  }
  const Tensor q_ = Rand(DType::kF32, {kB, kH, kS, kDh}, 1, -1, 1).CastTo(DType::kBF16);
  const Tensor k_ = Rand(DType::kF32, {kB, kH, kS, kDh}, 2, -1, 1).CastTo(DType::kBF16);
  const backend::ExecContext ctx_ = {.training = true, .seed = 5, .offset = 9};
};

TEST_F(SdpaDropoutTest, TheMaskIsAFunctionOfSeedStepAndMicroBatch) {
  const Tensor eye = Identity();
  const std::vector<Tensor> a = Forward(eye, ctx_), b = Forward(eye, ctx_);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  // Same ExecContext (a recompute, a resumed run): bit for bit.
  EXPECT_EQ(std::memcmp(a[0].raw(), b[0].raw(), a[0].num_bytes()), 0);
  const std::vector<bool> kept = KeptOf(a[0]);
  const double dropped = static_cast<double>(std::count(kept.begin(), kept.end(), false)) / kept.size();
  EXPECT_NEAR(dropped, kRatio, 0.02) << "fraction dropped";
  // Kept elements are P / (1 - ratio): every row of P sums to 1.
  double total = 0;
  for (int64_t i = 0; i < a[0].num_elements(); ++i) total += a[0].GetAsDouble(i);
  EXPECT_NEAR(total / (kB * kH * kS), 1.0, 0.05);

  backend::ExecContext other_microbatch = ctx_, other_step = ctx_, other_seed = ctx_, eval = ctx_;
  other_microbatch.row_offset = kB, other_microbatch.rows = kB;
  other_step.offset += 1;
  other_seed.seed += 1;
  eval.training = false;
  for (const auto& [name, ctx] : std::vector<std::pair<std::string, backend::ExecContext>>{
           {"micro-batch", other_microbatch}, {"step", other_step}, {"seed", other_seed}}) {
    const std::vector<Tensor> o = Forward(eye, ctx);
    ASSERT_EQ(o.size(), 1u);
    const std::vector<bool> other = KeptOf(o[0]);
    int64_t differ = 0;
    for (size_t i = 0; i < kept.size(); ++i) differ += kept[i] != other[i];
    // Independent masks differ in ~2 * 0.1 * 0.9 of the elements.
    EXPECT_GT(differ, static_cast<int64_t>(kept.size() / 10)) << "another " << name << ", the same mask";
  }
  const std::vector<Tensor> o = Forward(eye, eval);
  ASSERT_EQ(o.size(), 1u);
  const std::vector<bool> none = KeptOf(o[0]);
  EXPECT_EQ(std::count(none.begin(), none.end(), false), 0) << "dropout outside training";
  // Under graphs the step is read from device memory when the kernels run (ExecContext::device_offset),
  // not from ctx.offset: a replay draws its own step's mask.
  uint64_t* step = nullptr;
  ASSERT_EQ(cudaMalloc(&step, sizeof(uint64_t)), cudaSuccess);
  const uint64_t next = other_step.offset;
  ASSERT_EQ(cudaMemcpy(step, &next, sizeof(next), cudaMemcpyHostToDevice), cudaSuccess);
  backend::ExecContext from_device = ctx_;
  from_device.device_offset = step;
  const std::vector<Tensor> replayed = Forward(eye, from_device), eager = Forward(eye, other_step);
  cudaFree(step);
  ASSERT_EQ(replayed.size(), 1u);
  ASSERT_EQ(eager.size(), 1u);
  EXPECT_EQ(KeptOf(replayed[0]), KeptOf(eager[0]));
}

// The backward regenerates the forward's mask: dQ, dK, dV against a double-precision reference
// that applies the mask read from the forward (the mask depends on the seed and the positions,
// not on the values).
TEST_F(SdpaDropoutTest, TheBackwardReplaysTheForwardsMask) {
  const std::vector<Tensor> p = Forward(Identity(), ctx_);
  ASSERT_EQ(p.size(), 1u);
  const std::vector<bool> kept = KeptOf(p[0]);
  const Tensor v = Rand(DType::kF32, {kB, kH, kS, kS}, 3, -1, 1).CastTo(DType::kBF16);
  const Tensor d_o = Rand(DType::kF32, {kB, kH, kS, kS}, 4, -1, 1).CastTo(DType::kBF16);
  const std::vector<Tensor> o = Forward(v, ctx_);
  ir::Attrs grad_attrs = DropoutAttrs();
  grad_attrs.Set("rng_key", std::string("attn"));
  const std::vector<Tensor> grads =
      RunOnDevice(ir::OpKind::kAttentionGrad, "attn_grad", {d_o, q_, k_, v}, grad_attrs, 3, ctx_, /*planned=*/true);
  ASSERT_EQ(o.size(), 1u);
  ASSERT_EQ(grads.size(), 3u);

  // Reference, per (b, h): s = scale q k^T, P = softmax(s), Pd = keep * P / (1 - r), O = Pd V,
  // dPd = dO V^T, dP = keep * dPd / (1 - r), dS = P * (dP - rowsum(dP * P)),
  // dQ = scale dS K, dK = scale dS^T Q, dV = Pd^T dO.
  auto at = [](const Tensor& t, int64_t m, int64_t i, int64_t j, int64_t cols) {
    return t.GetAsDouble((m * kS + i) * cols + j);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDh)), keep_scale = 1.0 / (1.0 - kRatio);
  Tensor want_o(DType::kF32, {kB, kH, kS, kS}), want_dq(DType::kF32, {kB, kH, kS, kDh}),
      want_dk(DType::kF32, {kB, kH, kS, kDh}), want_dv(DType::kF32, {kB, kH, kS, kS});
  for (int64_t m = 0; m < kB * kH; ++m) {
    std::vector<double> prob(kS * kS), pd(kS * kS), ds(kS * kS);
    for (int64_t i = 0; i < kS; ++i) {
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < kS; ++j) {
        double s = 0;
        for (int64_t d = 0; d < kDh; ++d) s += at(q_, m, i, d, kDh) * at(k_, m, j, d, kDh);
        prob[i * kS + j] = s * scale;
        mx = std::max(mx, s * scale);
      }
      for (int64_t j = 0; j < kS; ++j) sum += prob[i * kS + j] = std::exp(prob[i * kS + j] - mx);
      for (int64_t j = 0; j < kS; ++j) {
        prob[i * kS + j] /= sum;
        pd[i * kS + j] = kept[(m * kS + i) * kS + j] ? prob[i * kS + j] * keep_scale : 0.0;
      }
    }
    for (int64_t i = 0; i < kS; ++i) {
      std::vector<double> dp(kS);
      double dot = 0;
      for (int64_t j = 0; j < kS; ++j) {
        double dpd = 0;
        for (int64_t c = 0; c < kS; ++c) dpd += at(d_o, m, i, c, kS) * at(v, m, j, c, kS);
        dp[j] = kept[(m * kS + i) * kS + j] ? dpd * keep_scale : 0.0;
        dot += dp[j] * prob[i * kS + j];
      }
      for (int64_t j = 0; j < kS; ++j) ds[i * kS + j] = prob[i * kS + j] * (dp[j] - dot);
    }
    for (int64_t i = 0; i < kS; ++i) {
      for (int64_t c = 0; c < kS; ++c) {
        double acc_o = 0, acc_dv = 0;
        for (int64_t j = 0; j < kS; ++j) {
          acc_o += pd[i * kS + j] * at(v, m, j, c, kS);
          acc_dv += pd[j * kS + i] * at(d_o, m, j, c, kS);  // dV[i] = sum_j Pd[j, i] dO[j]
        }
        want_o.mutable_data<float>()[(m * kS + i) * kS + c] = static_cast<float>(acc_o);
        want_dv.mutable_data<float>()[(m * kS + i) * kS + c] = static_cast<float>(acc_dv);
      }
      for (int64_t d = 0; d < kDh; ++d) {
        double acc_dq = 0, acc_dk = 0;
        for (int64_t j = 0; j < kS; ++j) {
          acc_dq += ds[i * kS + j] * at(k_, m, j, d, kDh);
          acc_dk += ds[j * kS + i] * at(q_, m, j, d, kDh);
        }
        want_dq.mutable_data<float>()[(m * kS + i) * kDh + d] = static_cast<float>(scale * acc_dq);
        want_dk.mutable_data<float>()[(m * kS + i) * kDh + d] = static_cast<float>(scale * acc_dk);
      }
    }
  }
  EXPECT_TRUE(Close(o[0], want_o, kBf16Tolerance)) << "O";
  EXPECT_TRUE(Close(grads[0], want_dq, 2 * kBf16Tolerance)) << "dQ";
  EXPECT_TRUE(Close(grads[1], want_dk, 2 * kBf16Tolerance)) << "dK";
  EXPECT_TRUE(Close(grads[2], want_dv, kBf16Tolerance)) << "dV";
}

// --- Selection ------------------------------------------------------------------------------------

TEST(SdpaSelectionTest, AutoTakesCudnnForBf16AndFlashForFp32) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0);
  ASSERT_TRUE(be.ok()) << be.status();
  const backend::ExecContext ctx = {.training = true};
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    std::vector<Tensor> in;
    for (uint32_t s = 1; s <= 3; ++s) in.push_back(Rand(DType::kF32, {2, 2, 64, 64}, s, -1, 1).CastTo(dtype));
    ir::Graph g;
    const ir::Node& node = AddTypedNode(g, ir::OpKind::kAttention, "attn", in, {}, 1);
    std::vector<Tensor> dev;
    for (const Tensor& t : in) dev.push_back(*(*be)->Upload(t));
    const std::map<std::string, int64_t> before = (*be)->AttentionRuns();
    absl::StatusOr<std::vector<Tensor>> o = (*be)->Run(node, dev, ctx, nullptr);
    ASSERT_TRUE(o.ok()) << o.status();
    const std::map<std::string, int64_t> after = (*be)->AttentionRuns();
    const std::string want = dtype == DType::kBF16 ? "cudnn" : "flash";
    EXPECT_EQ(after.at(want), before.at(want) + 1) << ir::DTypeName(dtype);
  }
}

TEST_F(SdpaBackendTest, CudnnNamesANodeItCannotRun) {
  // fp32 has no cuDNN SDPA path.
  std::vector<Tensor> in;
  for (uint32_t s = 1; s <= 3; ++s) in.push_back(Rand(DType::kF32, {1, 2, 16, 16}, s, -1, 1));
  ir::Graph g;
  const ir::Node& node = AddTypedNode(g, ir::OpKind::kAttention, "layer3_attn", in, {}, 1);
  std::vector<Tensor> dev;
  for (const Tensor& t : in) dev.push_back(*be_->Upload(t));
  absl::StatusOr<std::vector<Tensor>> o = be_->Run(node, dev, {.training = true}, nullptr);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), ::testing::HasSubstr("'layer3_attn'"));
  EXPECT_THAT(std::string(o.status().message()), ::testing::HasSubstr("--cuda-attention cudnn"));
}

}  // namespace
}  // namespace onnxpipe::cuda::testing
