// cuDNN fused attention (executor/cuda/attention.h) against the CPU backend's Attention and
// AttentionGrad kernels run in fp64 on the same bf16/fp16-rounded inputs: output, dQ, dK, dV by
// normalised error, and the saved log-sum-exp stats against a double loop written here. Dropout
// is checked on its own: its mask is cuDNN's, not the CPU stream, so it is read back through a
// forward whose probabilities and values make O equal the dropped probability matrix.
#include "executor/cuda/attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "executor/cpu/cpu_evaluator.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"
#include "gtest/gtest.h"

namespace onnxpipe::cuda {
namespace {

using ir::DType;
using ir::Tensor;

// Host values rounded to the device dtype, kept as doubles for the reference.
double RoundTo(DType dt, double x) {
  if (dt == DType::kBF16) return __bfloat162float(__float2bfloat16_rn(static_cast<float>(x)));
  return __half2float(__float2half_rn(static_cast<float>(x)));
}

std::vector<uint16_t> ToDevice16(DType dt, const std::vector<double>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float f = static_cast<float>(x[i]);
    out[i] = dt == DType::kBF16 ? __nv_bfloat16_raw(__float2bfloat16_rn(f)).x : __half_raw(__float2half_rn(f)).x;
  }
  return out;
}

std::vector<double> FromDevice16(DType dt, const std::vector<uint16_t>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (dt == DType::kBF16) {
      __nv_bfloat16_raw r;
      r.x = x[i];
      out[i] = __bfloat162float(__nv_bfloat16(r));
    } else {
      __half_raw r;
      r.x = x[i];
      out[i] = __half2float(__half(r));
    }
  }
  return out;
}

std::vector<double> Random(DType dt, int64_t n, uint32_t seed, double lo, double hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = RoundTo(dt, dist(gen));
  return v;
}

// Device memory freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess);
    }
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(static_cast<int64_t>(host.size() * sizeof(T))) {
    if (!host.empty()) cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  std::vector<T> Read(int64_t n) const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  void* p_ = nullptr;
};

Tensor F64(std::vector<int64_t> dims, const std::vector<double>& v) {
  return Tensor::FromVector<double>(std::move(dims), v);
}
std::vector<double> Values(const Tensor& t) {
  const double* d = t.data<double>();
  return std::vector<double>(d, d + t.num_elements());
}

double NormalisedError(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

ir::Node MakeNode(ir::OpKind op, int inputs, int outputs, ir::Attrs attrs) {
  ir::Node n;
  n.op = op;
  n.name = "attention_test";
  for (int i = 0; i < inputs; ++i) n.inputs.push_back(i);
  for (int i = 0; i < outputs; ++i) n.outputs.push_back(inputs + i);
  n.attrs = std::move(attrs);
  return n;
}

struct Case {
  std::string name;
  int64_t batch, heads, kv_heads, seq_q, seq_kv, head_dim;
  bool causal = false;
  AttentionMask mask = AttentionMask::kNone;
  int64_t bias_batch = 1, bias_heads = 1;
  DType dtype = DType::kBF16;
};

// Inputs rounded to the case's dtype. Key lengths: the last batch keeps every key.
struct Inputs {
  std::vector<double> q, k, v, d_o, bias;
  std::vector<int32_t> lengths;
  std::vector<uint8_t> key_mask;  // (B, Sk), true for j < lengths[b]
};

Inputs MakeInputs(const Case& tc) {
  const DType dt = tc.dtype;
  const int64_t B = tc.batch, Sk = tc.seq_kv, D = tc.head_dim;
  Inputs in;
  in.q = Random(dt, B * tc.heads * tc.seq_q * D, 1, -2, 2);
  in.k = Random(dt, B * tc.kv_heads * Sk * D, 2, -2, 2);
  in.v = Random(dt, B * tc.kv_heads * Sk * D, 3, -1, 1);
  in.d_o = Random(dt, B * tc.heads * tc.seq_q * D, 4, -1, 1);
  if (tc.mask == AttentionMask::kBias) {
    in.bias = Random(dt, tc.bias_batch * tc.bias_heads * tc.seq_q * Sk, 5, -3, 1);
  }
  in.lengths.resize(B);
  in.key_mask.resize(B * Sk);
  for (int64_t b = 0; b < B; ++b) {
    in.lengths[b] = b + 1 == B ? Sk : static_cast<int32_t>(Sk * (b + 1) / (B + 1) + 3);
    for (int64_t j = 0; j < Sk; ++j) in.key_mask[b * Sk + j] = j < in.lengths[b];
  }
  return in;
}

bool KeyPadding(const Case& tc) { return tc.mask == AttentionMask::kKeyLengths || tc.mask == AttentionMask::kKeyMask; }

struct Reference {
  std::vector<double> o, stats, dq, dk, dv;
};

// O, dQ, dK, dV from the CPU backend's Attention/AttentionGrad in fp64 (key padding as the CPU op's
// (B, 1, 1, Sk) bool mask); stats from a double loop over the visible scaled+masked scores.
absl::StatusOr<Reference> CpuReference(const Case& tc, const Inputs& in) {
  const int64_t B = tc.batch, H = tc.heads, Hkv = tc.kv_heads, Sq = tc.seq_q, Sk = tc.seq_kv, D = tc.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  ir::Attrs attrs;
  attrs.Set("scale", scale);
  attrs.Set("causal", int64_t{tc.causal ? 1 : 0});
  std::vector<Tensor> inputs = {F64({B, H, Sq, D}, in.q), F64({B, Hkv, Sk, D}, in.k), F64({B, Hkv, Sk, D}, in.v)};
  if (KeyPadding(tc)) {
    attrs.Set("mask_kind", std::string("bool"));
    inputs.push_back(
        Tensor::FromVector<bool>({B, 1, 1, Sk}, std::vector<bool>(in.key_mask.begin(), in.key_mask.end())));
  } else if (tc.mask == AttentionMask::kBias) {
    attrs.Set("mask_kind", std::string("additive"));
    inputs.push_back(F64({tc.bias_batch, tc.bias_heads, Sq, Sk}, in.bias));
  }
  const int n_in = static_cast<int>(inputs.size());
  cpu::CpuEvaluator cpu;
  ASSIGN_OR_RETURN(std::vector<Tensor> fwd, cpu.Evaluate(MakeNode(ir::OpKind::kAttention, n_in, 1, attrs), inputs));
  std::vector<Tensor> grad_inputs = {F64({B, H, Sq, D}, in.d_o)};
  grad_inputs.insert(grad_inputs.end(), inputs.begin(), inputs.end());
  ASSIGN_OR_RETURN(std::vector<Tensor> grads,
                   cpu.Evaluate(MakeNode(ir::OpKind::kAttentionGrad, n_in + 1, 3, attrs), grad_inputs));
  Reference ref{Values(fwd[0]), std::vector<double>(B * H * Sq), Values(grads[0]), Values(grads[1]), Values(grads[2])};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t hk = h / (H / Hkv);
        std::vector<double> s;
        for (int64_t j = 0; j < Sk; ++j) {
          if ((tc.causal && j > i) || (KeyPadding(tc) && j >= in.lengths[b])) continue;
          double x = 0;
          for (int64_t d = 0; d < D; ++d) {
            x += in.q[((b * H + h) * Sq + i) * D + d] * in.k[((b * Hkv + hk) * Sk + j) * D + d];
          }
          x *= scale;
          if (!in.bias.empty()) {
            const int64_t bb = tc.bias_batch == 1 ? 0 : b, bh = tc.bias_heads == 1 ? 0 : h;
            x += in.bias[((bb * tc.bias_heads + bh) * Sq + i) * Sk + j];
          }
          s.push_back(x);
        }
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double x : s) sum += std::exp(x - mx);
        ref.stats[(b * H + h) * Sq + i] = mx + std::log(sum);
      }
  return ref;
}

class AttentionCudaTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(AttentionCudaTest, MatchesCpuForwardStatsAndGradients) {
  const Case& tc = GetParam();
  const DType dt = tc.dtype;
  AttentionConfig config;
  config.batch = tc.batch;
  config.heads = tc.heads;
  config.kv_heads = tc.kv_heads;
  config.seq_q = tc.seq_q;
  config.seq_kv = tc.seq_kv;
  config.head_dim = tc.head_dim;
  config.dtype = dt;
  config.causal = tc.causal;
  config.mask = tc.mask;
  config.bias_batch = tc.bias_batch;
  config.bias_heads = tc.bias_heads;
  const int64_t B = tc.batch, H = tc.heads, Hkv = tc.kv_heads, Sq = tc.seq_q, Sk = tc.seq_kv, D = tc.head_dim;
  const Inputs in = MakeInputs(tc);
  absl::StatusOr<Reference> ref = CpuReference(tc, in);
  ASSERT_TRUE(ref.ok()) << ref.status();

  // GPU.
  auto graphs = AttentionGraphs::Create();
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  auto fwd_ws = (*graphs)->ForwardWorkspaceBytes(config);
  ASSERT_TRUE(fwd_ws.ok()) << fwd_ws.status();
  auto bwd_ws = (*graphs)->BackwardWorkspaceBytes(config);
  ASSERT_TRUE(bwd_ws.ok()) << bwd_ws.status();
  DeviceBuffer q_d(ToDevice16(dt, in.q)), k_d(ToDevice16(dt, in.k)), v_d(ToDevice16(dt, in.v)),
      do_d(ToDevice16(dt, in.d_o));
  DeviceBuffer o_d(B * H * Sq * D * 2), stats_d(B * H * Sq * 4), dq_d(B * H * Sq * D * 2), dk_d(B * Hkv * Sk * D * 2),
      dv_d(B * Hkv * Sk * D * 2), ws_d(std::max(*fwd_ws, *bwd_ws));
  DeviceBuffer lengths_d(in.lengths), key_mask_d(in.key_mask), bias_d(ToDevice16(dt, in.bias));
  const void* mask = tc.mask == AttentionMask::kKeyLengths ? lengths_d.get()
                     : tc.mask == AttentionMask::kKeyMask  ? key_mask_d.get()
                     : tc.mask == AttentionMask::kBias     ? bias_d.get()
                                                           : nullptr;
  // Poison the gradients: rows cuDNN skips must still come out right.
  cudaMemset(dk_d.get(), 0x7f, B * Hkv * Sk * D * 2);
  cudaMemset(dv_d.get(), 0x7f, B * Hkv * Sk * D * 2);
  AttentionForwardArgs fa;
  fa.q = q_d.get();
  fa.k = k_d.get();
  fa.v = v_d.get();
  fa.mask = mask;
  fa.o = o_d.get();
  fa.stats = static_cast<float*>(stats_d.get());
  ASSERT_TRUE((*graphs)->Forward(config, fa, ws_d.get(), *fwd_ws, nullptr).ok());
  AttentionBackwardArgs ba;
  ba.q = q_d.get();
  ba.k = k_d.get();
  ba.v = v_d.get();
  ba.o = o_d.get();
  ba.stats = static_cast<const float*>(stats_d.get());
  ba.d_o = do_d.get();
  ba.mask = mask;
  ba.dq = dq_d.get();
  ba.dk = dk_d.get();
  ba.dv = dv_d.get();
  absl::Status bs = (*graphs)->Backward(config, ba, ws_d.get(), *bwd_ws, nullptr);
  ASSERT_TRUE(bs.ok()) << bs;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ((*graphs)->num_graphs(), 2);

  const double o_err = NormalisedError(FromDevice16(dt, o_d.Read<uint16_t>(B * H * Sq * D)), ref->o);
  std::vector<float> stats_f = stats_d.Read<float>(B * H * Sq);
  const double stats_err = NormalisedError(std::vector<double>(stats_f.begin(), stats_f.end()), ref->stats);
  const double dq_err = NormalisedError(FromDevice16(dt, dq_d.Read<uint16_t>(B * H * Sq * D)), ref->dq);
  const double dk_err = NormalisedError(FromDevice16(dt, dk_d.Read<uint16_t>(B * Hkv * Sk * D)), ref->dk);
  const double dv_err = NormalisedError(FromDevice16(dt, dv_d.Read<uint16_t>(B * Hkv * Sk * D)), ref->dv);
  std::printf("[ %s ] normalised error O %.2e stats %.2e dQ %.2e dK %.2e dV %.2e (workspace fwd %lld bwd %lld)\n",
              tc.name.c_str(), o_err, stats_err, dq_err, dk_err, dv_err, static_cast<long long>(*fwd_ws),
              static_cast<long long>(*bwd_ws));
  EXPECT_LT(o_err, 1e-2);
  EXPECT_LT(stats_err, 1e-3);
  EXPECT_LT(dq_err, 1e-2);
  EXPECT_LT(dk_err, 1e-2);
  EXPECT_LT(dv_err, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Masks, AttentionCudaTest,
    ::testing::Values(Case{"none_d64", 2, 3, 3, 100, 100, 64}, Case{"none_d128_sq77_sk130", 2, 2, 2, 77, 130, 128},
                      Case{"causal_d64", 2, 3, 3, 100, 100, 64, true},
                      Case{"causal_d128_sq70_sk150", 2, 2, 2, 70, 150, 128, true},
                      Case{"key_lengths_d64", 3, 2, 2, 100, 100, 64, false, AttentionMask::kKeyLengths},
                      Case{"key_mask_causal_d128", 2, 2, 2, 90, 90, 128, true, AttentionMask::kKeyMask},
                      Case{"bias_1h_d64", 2, 3, 3, 100, 100, 64, false, AttentionMask::kBias, 1, 3},
                      Case{"bias_b1_causal_d128", 2, 2, 2, 100, 120, 128, true, AttentionMask::kBias, 2, 1},
                      Case{"bias_bh_d64", 2, 2, 2, 65, 65, 64, false, AttentionMask::kBias, 2, 2},
                      Case{"mqa_kv1_d64", 2, 4, 1, 100, 100, 64},
                      Case{"fp16_causal_d64", 2, 2, 2, 100, 100, 64, true, AttentionMask::kNone, 1, 1, DType::kF16}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The dropout test's backward reference. With Q = 0 (P = 1/S) and V = identity (S = Dv), the
// forward output `o` (BH, S, S) is the dropped probability matrix, o_ij != 0 iff key j was kept:
//   dV = o^T dO,  dP_ij = dO_ij keep_ij / (1 - p),  dS = P (dP - rowsum(P dP)),  dQ = scale dS K.
struct DroppedGrads {
  std::vector<double> dq, dv;
};
DroppedGrads DroppedGradients(const std::vector<double>& o, const std::vector<double>& d_o,
                              const std::vector<double>& k, int64_t bh_count, int64_t S, double p, double scale) {
  const int64_t n = bh_count * S * S;
  DroppedGrads g{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  for (int64_t bh = 0; bh < bh_count; ++bh) {
    const double* dob = &d_o[bh * S * S];
    const double* ob = &o[bh * S * S];
    const double* kb = &k[bh * S * S];
    for (int64_t i = 0; i < S; ++i) {
      std::vector<double> ds(S);
      double dot = 0;
      for (int64_t j = 0; j < S; ++j) {
        ds[j] = ob[i * S + j] != 0 ? dob[i * S + j] / (1 - p) : 0.0;
        dot += ds[j] / S;
      }
      for (int64_t j = 0; j < S; ++j) ds[j] = (ds[j] - dot) / S;
      for (int64_t j = 0; j < S; ++j)
        for (int64_t d = 0; d < S; ++d) {
          g.dq[(bh * S + i) * S + d] += scale * ds[j] * kb[j * S + d];
          g.dv[(bh * S + j) * S + d] += ob[i * S + j] * dob[i * S + d];
        }
    }
  }
  return g;
}

// Checks DroppedGradients itself against the CPU's AttentionGrad where nothing is dropped (p = 0,
// o = 1/S everywhere), so the GPU dropout test below compares against a trusted formula.
TEST(AttentionCudaDropout, ReferenceFormulaMatchesCpuGradientWithoutDropout) {
  const int64_t BH = 3, S = 16;
  const double scale = 0.3;
  std::vector<double> q(BH * S * S, 0.0), v(BH * S * S, 0.0), o(BH * S * S, 1.0 / S);
  for (int64_t bh = 0; bh < BH; ++bh)
    for (int64_t j = 0; j < S; ++j) v[(bh * S + j) * S + j] = 1.0;
  const std::vector<double> k = Random(DType::kBF16, BH * S * S, 9, -1, 1);
  const std::vector<double> d_o = Random(DType::kBF16, BH * S * S, 10, -1, 1);
  ir::Attrs attrs;
  attrs.Set("scale", scale);
  auto grads =
      cpu::CpuEvaluator().Evaluate(MakeNode(ir::OpKind::kAttentionGrad, 4, 3, attrs),
                                   {F64({BH, S, S}, d_o), F64({BH, S, S}, q), F64({BH, S, S}, k), F64({BH, S, S}, v)});
  ASSERT_TRUE(grads.ok()) << grads.status();
  const DroppedGrads ref = DroppedGradients(o, d_o, k, BH, S, /*p=*/0.0, scale);
  EXPECT_LT(NormalisedError(ref.dq, Values((*grads)[0])), 1e-12);
  EXPECT_LT(NormalisedError(ref.dv, Values((*grads)[2])), 1e-12);
}

// Q = 0 makes every probability 1/Sk; V = identity (Sk = Dv) makes O the dropped probability
// matrix keep_ij / (Sk (1 - p)). So the forward shows cuDNN's mask, and the backward with the same
// seed/offset must use that mask: dV = D^T dO, dQ = scale dS K with dP = dO * keep / (1 - p).
TEST(AttentionCudaDropout, KeepFractionScaleAndBackwardUseTheForwardMask) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t B = 2, H = 4, S = 64, D = 64;
  const double p = 0.25, scale = 0.125;
  AttentionConfig config;
  config.batch = B;
  config.heads = H;
  config.seq_q = config.seq_kv = S;
  config.head_dim = D;
  config.scale = scale;
  config.dropout = p;
  const DType dt = DType::kBF16;
  std::vector<double> q(B * H * S * D, 0.0), v(B * H * S * D, 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < S; ++j) v[(bh * S + j) * D + j] = 1.0;
  const std::vector<double> k = Random(dt, B * H * S * D, 7, -1, 1);
  const std::vector<double> d_o = Random(dt, B * H * S * D, 8, -1, 1);

  auto graphs = AttentionGraphs::Create();
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  auto fwd_ws = (*graphs)->ForwardWorkspaceBytes(config);
  ASSERT_TRUE(fwd_ws.ok()) << fwd_ws.status();
  auto bwd_ws = (*graphs)->BackwardWorkspaceBytes(config);
  ASSERT_TRUE(bwd_ws.ok()) << bwd_ws.status();
  DeviceBuffer q_d(ToDevice16(dt, q)), k_d(ToDevice16(dt, k)), v_d(ToDevice16(dt, v)), do_d(ToDevice16(dt, d_o));
  const int64_t n = B * H * S * D;
  DeviceBuffer o_d(n * 2), o2_d(n * 2), o3_d(n * 2), stats_d(B * H * S * 4), dq_d(n * 2), dk_d(n * 2), dv_d(n * 2),
      ws_d(std::max(*fwd_ws, *bwd_ws));
  DeviceBuffer seed_d(std::vector<int64_t>{20261203}), offset_d(std::vector<int64_t>{4096}),
      offset2_d(std::vector<int64_t>{8192});
  AttentionForwardArgs fa;
  fa.q = q_d.get();
  fa.k = k_d.get();
  fa.v = v_d.get();
  fa.dropout_seed = static_cast<const int64_t*>(seed_d.get());
  fa.dropout_offset = static_cast<const int64_t*>(offset_d.get());
  fa.o = o_d.get();
  fa.stats = static_cast<float*>(stats_d.get());
  ASSERT_TRUE((*graphs)->Forward(config, fa, ws_d.get(), *fwd_ws, nullptr).ok());
  fa.o = o2_d.get();
  ASSERT_TRUE((*graphs)->Forward(config, fa, ws_d.get(), *fwd_ws, nullptr).ok());
  fa.o = o3_d.get();
  fa.dropout_offset = static_cast<const int64_t*>(offset2_d.get());
  ASSERT_TRUE((*graphs)->Forward(config, fa, ws_d.get(), *fwd_ws, nullptr).ok());
  AttentionBackwardArgs ba;
  ba.q = q_d.get();
  ba.k = k_d.get();
  ba.v = v_d.get();
  ba.o = o_d.get();
  ba.stats = static_cast<const float*>(stats_d.get());
  ba.d_o = do_d.get();
  ba.dropout_seed = static_cast<const int64_t*>(seed_d.get());
  ba.dropout_offset = static_cast<const int64_t*>(offset_d.get());
  ba.dq = dq_d.get();
  ba.dk = dk_d.get();
  ba.dv = dv_d.get();
  ASSERT_TRUE((*graphs)->Backward(config, ba, ws_d.get(), *bwd_ws, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<double> o = FromDevice16(dt, o_d.Read<uint16_t>(n));
  const std::vector<uint16_t> o_bits = o_d.Read<uint16_t>(n);
  EXPECT_EQ(o_bits, o2_d.Read<uint16_t>(n)) << "same seed and offset must give the same mask";
  const std::vector<double> o3 = FromDevice16(dt, o3_d.Read<uint16_t>(n));
  // Every element is 0 or exactly the kept probability 1 / (S (1 - p)).
  const double kept_value = 1.0 / (S * (1 - p));
  static_assert(S == D, "the dropout test reads O as the S x S probability matrix");
  int64_t kept = 0, differ = 0, bad = 0;
  double row_sum_mean = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (o[i] != 0) {
      ++kept;
      if (std::abs(o[i] - kept_value) > 1e-2 * kept_value) ++bad;
    }
    differ += (o[i] != 0) != (o3[i] != 0);
    row_sum_mean += o[i];
  }
  row_sum_mean /= B * H * S;
  const double keep_fraction = static_cast<double>(kept) / n;
  const double sigma = std::sqrt(p * (1 - p) / n);
  std::printf(
      "dropout %.2f: keep fraction %.4f (expected %.4f +- %.4f), mean row sum %.4f, other offset differs at "
      "%.3f of positions\n",
      p, keep_fraction, 1 - p, 5 * sigma, row_sum_mean, static_cast<double>(differ) / n);
  EXPECT_EQ(bad, 0);
  EXPECT_NEAR(keep_fraction, 1 - p, 5 * sigma);
  EXPECT_NEAR(row_sum_mean, 1.0, 0.02);  // dropout keeps the expected value
  EXPECT_GT(static_cast<double>(differ) / n, 0.2) << "another offset must give another mask";
  // Stats ignore dropout: log(S) for uniform scores.
  for (float s : stats_d.Read<float>(B * H * S)) ASSERT_NEAR(s, std::log(static_cast<double>(S)), 1e-4);

  const DroppedGrads ref = DroppedGradients(o, d_o, k, B * H, S, p, scale);
  const double dq_err = NormalisedError(FromDevice16(dt, dq_d.Read<uint16_t>(n)), ref.dq);
  const double dv_err = NormalisedError(FromDevice16(dt, dv_d.Read<uint16_t>(n)), ref.dv);
  double dk_max = 0;
  for (double x : FromDevice16(dt, dk_d.Read<uint16_t>(n))) dk_max = std::max(dk_max, std::abs(x));
  std::printf("dropout backward: normalised error dQ %.2e dV %.2e, max |dK| %.2e (Q = 0: expected 0)\n", dq_err, dv_err,
              dk_max);
  EXPECT_LT(dq_err, 1e-2);
  EXPECT_LT(dv_err, 1e-2);
  EXPECT_LT(dk_max, 1e-6);
}

TEST(AttentionCudaConfig, BadConfigsNameTheField) {
  AttentionConfig good;
  good.batch = 2;
  good.heads = 4;
  good.seq_q = good.seq_kv = 100;
  good.head_dim = 64;
  auto resolved = good.Resolved();
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->kv_heads, 4);
  EXPECT_EQ(resolved->value_dim, 64);
  EXPECT_DOUBLE_EQ(*resolved->scale, 0.125);
  auto expect_error = [](AttentionConfig c, const std::string& words) {
    auto r = c.Resolved();
    ASSERT_FALSE(r.ok()) << c.ToString();
    EXPECT_NE(std::string(r.status().message()).find(words), std::string::npos) << r.status();
  };
  AttentionConfig c = good;
  c.head_dim = 60;
  expect_error(c, "head_dim is 60");
  c = good;
  c.head_dim = 512;
  expect_error(c, "head_dim is 512");
  c = good;
  c.dtype = DType::kF32;
  expect_error(c, "cast fp32 inputs to bf16");
  c = good;
  c.kv_heads = 3;
  expect_error(c, "kv_heads 3 does not divide heads 4");
  c = good;
  c.batch = 0;
  expect_error(c, "batch is 0");
  c = good;
  c.seq_kv = -1;
  expect_error(c, "seq_kv is -1");
  c = good;
  c.dropout = 1.0;
  expect_error(c, "dropout is 1");
  c = good;
  c.mask = AttentionMask::kBias;
  c.bias_heads = 3;
  expect_error(c, "bias dims (1, 3, 100, Sk)");
  c.bias_heads = 1;
  c.bias_rows = 7;
  expect_error(c, "expected (1 or 2, 1 or 4, 1 or 100, Sk)");
  c.bias_rows = 1;
  expect_error(c, "not supported by cuDNN SDPA's backward");
}

TEST(AttentionCudaConfig, RunTimeErrorsAndGraphCache) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto graphs = AttentionGraphs::Create();
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  AttentionConfig c;
  c.batch = 1;
  c.heads = 2;
  c.seq_q = c.seq_kv = 64;
  c.head_dim = 64;
  c.mask = AttentionMask::kKeyLengths;
  auto ws = (*graphs)->ForwardWorkspaceBytes(c);
  ASSERT_TRUE(ws.ok()) << ws.status();
  ASSERT_TRUE((*graphs)->ForwardWorkspaceBytes(c).ok());
  EXPECT_EQ((*graphs)->num_graphs(), 1);  // cached
  AttentionConfig causal = c;
  causal.causal = true;
  ASSERT_TRUE((*graphs)->ForwardWorkspaceBytes(causal).ok());
  EXPECT_EQ((*graphs)->num_graphs(), 2);

  DeviceBuffer q(1 * 2 * 64 * 64 * 2), o(1 * 2 * 64 * 64 * 2), stats(2 * 64 * 4), lengths(std::vector<int32_t>{40}),
      work(*ws);
  AttentionForwardArgs a;
  a.q = a.k = a.v = q.get();
  a.o = o.get();
  a.stats = static_cast<float*>(stats.get());
  a.mask = lengths.get();
  absl::Status s = (*graphs)->Forward(c, a, work.get(), *ws - 1, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(std::string(s.message()).find("workspace"), std::string::npos) << s;
  a.mask = nullptr;
  s = (*graphs)->Forward(c, a, work.get(), *ws, nullptr);
  EXPECT_NE(std::string(s.message()).find("no mask pointer"), std::string::npos) << s;
  a.mask = lengths.get();
  a.o = nullptr;
  s = (*graphs)->Forward(c, a, work.get(), *ws, nullptr);
  EXPECT_NE(std::string(s.message()).find("o is null"), std::string::npos) << s;
  AttentionConfig dropout = c;
  dropout.dropout = 0.1;
  a.o = o.get();
  s = (*graphs)->Forward(dropout, a, work.get(), 1 << 30, nullptr);
  EXPECT_NE(std::string(s.message()).find("seed and offset"), std::string::npos) << s;
  ASSERT_TRUE((*graphs)->Forward(c, a, work.get(), *ws, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace onnxpipe::cuda
