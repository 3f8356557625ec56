// Every op the CUDA backend registers, run through CudaBackend::Run and through the CPU backend on
// the same inputs: the results agree (fp32 within a normalised error of 1e-5 -- max |gpu - cpu|
// over max |cpu| -- or bit for bit where the kernels round exactly as the CPU does: copies, views,
// gathers, dropout masks, casts), and the op did not fall back to the host. Each case runs twice:
// unplanned (fresh outputs, temporary scratch) and planned (an allocator whose workspace is exactly
// what CudaBackend::WorkspaceBytes reported for the node, so an under-reported workspace fails).
// The Bf16* cases run a bf16 graph's nodes (CheckBf16): the CPU's fp32 kernel on the widened inputs,
// its outputs rounded to bf16, is the reference. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/cuda_kernels.h"
#include "executor/cuda/cuda_status.h"
#include "frontend/ir/status.h"
#include "gtest/gtest.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/planned_outputs.h"

namespace onnxpipe::cuda {
namespace {

using testing::PlannedOutputs;

using ir::DType;
using ir::Tensor;

ir::Attrs Attrs(std::initializer_list<std::pair<std::string, ir::AttrValue>> kv) {
  ir::Attrs a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

Tensor Rand(std::vector<int64_t> dims, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return Tensor::FromVector<float>(std::move(dims), v);
}

Tensor Ints(std::vector<int64_t> dims, std::vector<int64_t> v, DType dtype = DType::kI64) {
  const Tensor t = Tensor::FromVector<int64_t>(std::move(dims), v);
  return dtype == DType::kI64 ? t : t.CastTo(dtype);
}

// Floats 0, 1, 2, 0, 1, 2, ... (comparisons of two of them hit equality).
Tensor SmallInts(std::vector<int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 3);
  return Tensor::FromVector<float>(std::move(dims), v);
}

Tensor Bools(std::vector<int64_t> dims, uint32_t seed) {
  Tensor t(DType::kBool, std::move(dims));
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.mutable_data<bool>()[i] = gen() % 3 != 0;
  return t;
}

struct Case {
  ir::OpKind op = ir::OpKind::kIdentity;
  std::vector<Tensor> inputs = {};  // host tensors; undefined = absent, DimsOnly = a `like` input
  ir::Attrs attrs = {};
  int outputs = 1;
  std::vector<int> absent_outputs = {};  // optional outputs the node does not have
  double tol = 1e-5;                     // normalised max error; 0: bit for bit
  backend::ExecContext ctx = {};
  uint32_t host_inputs = 0;  // inputs left on the host (constants)
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<std::shared_ptr<CudaBackend>> be = CudaBackend::Create(0, {.attention = AttentionImpl::kFlash});
    ASSERT_TRUE(be.ok()) << be.status();
    be_ = *be;
  }

  // How output k of the device (got) is judged against the CPU backend's (want).
  using Expect = std::function<void(size_t k, const Tensor& got, const Tensor& want)>;

  // The CPU backend's outputs of `c` on `reference_inputs`, and the CUDA backend's unplanned and
  // planned ones on c.inputs (planned twice: the step in ctx, then in device memory), compared by
  // `expect`.
  // The node of `c` in `g`: its inputs and outputs are values of g.
  static ir::NodeId AddCaseNode(const Case& c, ir::Graph& g) {
    std::vector<ir::ValueId> in_ids, out_ids;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (!t.defined()) {
        in_ids.push_back(ir::kNoValue);
        continue;
      }
      in_ids.push_back(g.AddValue("in" + std::to_string(i), t.dtype(), ir::Shape(t.dims().begin(), t.dims().end())));
    }
    for (int k = 0; k < c.outputs; ++k) {
      const bool absent = std::find(c.absent_outputs.begin(), c.absent_outputs.end(), k) != c.absent_outputs.end();
      out_ids.push_back(absent ? ir::kNoValue
                               : g.AddValue("out" + std::to_string(k), DType::kF32, {}, /*shape_known=*/false));
    }
    return g.AddNode(c.op, "node", in_ids, out_ids, c.attrs);
  }

  // The CPU backend's outputs of `c` on `inputs`.
  static std::vector<Tensor> CpuOutputs(const Case& c, const std::vector<Tensor>& inputs) {
    ir::Graph g;
    const ir::NodeId id = AddCaseNode(c, g);
    absl::StatusOr<std::vector<Tensor>> out = backend::MakeCpuBackend()->Run(g.node(id), inputs, c.ctx);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : std::vector<Tensor>();
  }

  void Compare(const Case& c, const std::vector<Tensor>& reference_inputs, bool expect_device, const Expect& expect) {
    ir::Graph g;
    const ir::Node& node = g.node(AddCaseNode(c, g));
    const std::string name(ir::OpName(c.op));
    const std::vector<Tensor> want = CpuOutputs(c, reference_inputs);
    if (want.empty()) return;
    std::vector<Tensor> dev_in;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      if (!t.has_data() || (c.host_inputs >> i & 1u) != 0) {
        dev_in.push_back(t);
        continue;
      }
      absl::StatusOr<Tensor> d = be_->Upload(t);
      ASSERT_TRUE(d.ok()) << d.status();
      dev_in.push_back(*d);
    }
    // The third run takes the step from device memory (ExecContext::device_offset, as a CUDA graph's
    // replay does) with a wrong ctx.offset beside it: it must not be read.
    absl::StatusOr<Tensor> device_step = be_->Upload(Tensor::Scalar<int64_t>(static_cast<int64_t>(c.ctx.offset)));
    ASSERT_TRUE(device_step.ok()) << device_step.status();
    for (int run = 0; run < 3; ++run) {
      const bool planned = run > 0;
      SCOPED_TRACE(name + (planned ? " planned" : " unplanned") + (run == 2 ? ", step on the device" : ""));
      backend::ExecContext ctx = c.ctx;
      if (run == 2) {
        ctx.device_offset = static_cast<const uint64_t*>(device_step->device_raw());
        ctx.offset += 7919;
      }
      PlannedOutputs plan(*be_, be_->WorkspaceBytes(g, node), /*share=*/false);
      const int64_t fallbacks_before = Fallbacks(name);
      absl::StatusOr<std::vector<Tensor>> got = be_->Run(node, dev_in, ctx, planned ? &plan : nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(Fallbacks(name) - fallbacks_before, expect_device ? 0 : 1) << name << " ran on the host";
      // Trailing optional outputs may be left out or returned undefined (kernel.h): compare them as undefined.
      auto at = [](const std::vector<Tensor>& v, size_t k) { return k < v.size() ? v[k] : Tensor(); };
      for (size_t k = 0; k < std::max(got->size(), want.size()); ++k) {
        SCOPED_TRACE("output " + std::to_string(k));
        const Tensor w = at(want, k), gk = at(*got, k);
        if (k < node.outputs.size() && node.outputs[k] == ir::kNoValue) continue;  // not an output of the node
        ASSERT_EQ(gk.defined(), w.defined());
        if (!w.defined()) continue;
        ASSERT_FALSE(gk.on_host());
        absl::StatusOr<Tensor> h = be_->ToHost(gk);
        ASSERT_TRUE(h.ok()) << h.status();
        expect(k, *h, w);
      }
    }
  }

  void Check(const Case& c, bool expect_device = true) {
    Compare(c, c.inputs, expect_device,
            [&](size_t, const Tensor& got, const Tensor& want) { ExpectClose(got, want, c.tol); });
  }

  // A bf16 graph's node: c.inputs hold bf16 activations (and f32 statistics, integer indices, ...);
  // the reference is the CPU's fp32 kernel on those inputs widened to f32 (exactly), its outputs
  // rounded once to bf16 where the device output is bf16. `out_dtypes` are the dtypes the bf16
  // graph gives the outputs. c.tol = 0: bit for bit; otherwise bf16 outputs within one bf16 unit
  // in the last place (testing::Bf16Close) and f32 ones within c.tol as in Check. `reference`, when
  // given, replaces the widened inputs as the CPU kernel's.
  void CheckBf16(const Case& c, const std::vector<DType>& out_dtypes, bool expect_device = true,
                 const std::vector<Tensor>& reference = {}) {
    ASSERT_EQ(out_dtypes.size(), static_cast<size_t>(c.outputs));
    Compare(c, reference.empty() ? Widened(c.inputs) : reference, expect_device,
            [&](size_t k, const Tensor& got, const Tensor& want) {
      ASSERT_LT(k, out_dtypes.size());
      ASSERT_EQ(got.dtype(), out_dtypes[k]) << "the bf16 graph's output dtype";
      ASSERT_EQ(got.dims(), want.dims());
      if (out_dtypes[k] != DType::kBF16) {
        ExpectClose(got, want, c.tol);
        return;
      }
      const std::vector<float> g = Floats(got), w = Floats(want.CastTo(DType::kBF16));
      if (c.tol == 0) {
        const int64_t i = FirstDifferentBits(g, w);
        EXPECT_EQ(i, -1) << "not bit for bit the fp32 result rounded to bf16: element " << i << " is "
                         << (i >= 0 ? g[i] : 0.f) << ", want " << (i >= 0 ? w[i] : 0.f) << " (signs matter); "
                         << testing::Bf16Close(g, w, 0, 0, 0).message();
        return;
      }
      EXPECT_TRUE(testing::Bf16Close(g, w));
    });
  }

  // `inputs` with bf16 tensors widened to f32 (exactly).
  static std::vector<Tensor> Widened(const std::vector<Tensor>& inputs) {
    std::vector<Tensor> out;
    for (const Tensor& t : inputs) {
      if (!t.defined() || t.dtype() != DType::kBF16) {
        out.push_back(t);
      } else {
        out.push_back(t.has_data() ? t.CastTo(DType::kF32) : Tensor::DimsOnly(DType::kF32, t.dims()));
      }
    }
    return out;
  }

  // The first element whose bits differ (-0 is not +0; NaN meets any NaN: cvt.rn.bf16.f32 and the
  // CPU's FloatToBF16 canonicalise NaN differently), or -1; a and b have one size.
  static int64_t FirstDifferentBits(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
    }
    return -1;
  }

  // The elements of a float tensor (any float dtype) as floats.
  static std::vector<float> Floats(const Tensor& t) {
    const Tensor f = t.CastTo(DType::kF32);
    return std::vector<float>(f.data<float>(), f.data<float>() + f.num_elements());
  }

  int64_t Fallbacks(const std::string& op) const {
    const std::map<std::string, int64_t> f = be_->HostFallbacks();
    auto it = f.find(op);
    return it == f.end() ? 0 : it->second;
  }

  static void ExpectClose(const Tensor& got, const Tensor& want, double tol) {
    ASSERT_EQ(got.dtype(), want.dtype());
    ASSERT_EQ(got.dims(), want.dims());
    if (tol == 0 || want.dtype() != DType::kF32) {
      EXPECT_TRUE(got.BitwiseEquals(want)) << "not bit for bit equal";
      return;
    }
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      const double g = got.data<float>()[i], w = want.data<float>()[i];
      if (std::isnan(w)) {
        EXPECT_TRUE(std::isnan(g)) << "element " << i;
        continue;
      }
      max_err = std::max(max_err, std::abs(g - w));
      max_ref = std::max(max_ref, std::abs(w));
    }
    EXPECT_LE(max_err, tol * std::max(max_ref, 1e-30)) << "max |gpu - cpu| " << max_err << ", max |cpu| " << max_ref;
  }

  std::shared_ptr<CudaBackend> be_;
};

// --- GEMM -------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, MatMulBroadcastsBatchesLikeTheCpu) {
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> shapes[] = {
      {{2, 3, 5, 8}, {8, 6}},        // tall: B without batch
      {{2, 3, 5, 8}, {2, 3, 8, 6}},  // equal batches
      {{5, 8}, {3, 8, 6}},           // A shared across B's batch
      {{3, 1, 5, 8}, {1, 4, 8, 6}},  // both broadcast: one GEMM per output matrix
      {{8}, {2, 8, 6}},              // 1-D A
      {{2, 5, 8}, {8}},              // 1-D B
      {{4, 0}, {0, 3}},              // K = 0: zeros
  };
  uint32_t seed = 1;
  for (const auto& [a, b] : shapes) Check({ir::OpKind::kMatMul, {Rand(a, seed++), Rand(b, seed++)}});
}

TEST_F(CudaOpsTest, FusedMatMulTransposesAndScales) {
  Check({ir::OpKind::kFusedMatMul,
         {Rand({2, 4, 16, 8}, 1), Rand({2, 4, 16, 8}, 2)},
         Attrs({{"trans_b", int64_t{1}}, {"alpha", 0.125}})});  // Q K^T
  Check({ir::OpKind::kFusedMatMul, {Rand({3, 6, 8}, 3), Rand({3, 6, 10}, 4)}, Attrs({{"trans_a", int64_t{1}}})});
  Check({ir::OpKind::kFusedMatMul,
         {Rand({7, 12}, 5), Rand({9, 7}, 6)},
         Attrs({{"trans_a", int64_t{1}}, {"trans_b", int64_t{1}}, {"alpha", -2.0}})});
  Check({ir::OpKind::kFusedMatMul, {Rand({2, 1, 5, 8}, 7), Rand({3, 6, 8}, 8)}, Attrs({{"trans_b", int64_t{1}}})});
}

TEST_F(CudaOpsTest, LinearWithAndWithoutBias) {
  Check({ir::OpKind::kLinear, {Rand({2, 7, 16}, 1), Rand({16, 12}, 2), Rand({12}, 3)}});
  Check(
      {ir::OpKind::kLinear, {Rand({2, 7, 16}, 4), Rand({12, 16}, 5), Rand({12}, 6)}, Attrs({{"trans_b", int64_t{1}}})});
  Check({ir::OpKind::kLinear, {Rand({5, 16}, 7), Rand({16, 24}, 8), Tensor()}});
}

TEST_F(CudaOpsTest, GemmBroadcastsC) {
  Check({ir::OpKind::kGemm, {Rand({6, 9}, 1), Rand({9, 5}, 2), Rand({5}, 3)}});
  Check({ir::OpKind::kGemm,
         {Rand({9, 6}, 4), Rand({5, 9}, 5), Rand({6, 1}, 6)},
         Attrs({{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5}, {"beta", -1.5}})});
  Check({ir::OpKind::kGemm, {Rand({6, 9}, 7), Rand({9, 5}, 8), Rand({6, 5}, 9)}, Attrs({{"beta", 2.0}})});
  Check({ir::OpKind::kGemm, {Rand({6, 9}, 10), Rand({9, 5}, 11)}});
}

// --- Normalisation and softmax -----------------------------------------------------------------

TEST_F(CudaOpsTest, LayerNormAndItsStatistics) {
  Check({ir::OpKind::kLayerNorm, {Rand({4, 7, 96}, 1, -3, 3), Rand({96}, 2), Rand({96}, 3)}, {}, 3});
  Check(
      {ir::OpKind::kLayerNorm, {Rand({4, 7, 32}, 4), Rand({32}, 5), Tensor()}, Attrs({{"epsilon", 1e-3}}), 3, {1, 2}});
  Check({ir::OpKind::kLayerNorm,
         {Rand({3, 5, 24}, 6), Rand({5, 24}, 7), Rand({5, 24}, 8)},
         Attrs({{"axis", int64_t{1}}}),
         3});
}

TEST_F(CudaOpsTest, LayerNormGradWithSavedAndRecomputedStatistics) {
  const Tensor x = Rand({4, 7, 96}, 1, -2, 2), scale = Rand({96}, 2), dy = Rand({4, 7, 96}, 3);
  ir::Graph g;
  const ir::ValueId vx = g.AddValue("x", DType::kF32, {4, 7, 96}), vs = g.AddValue("s", DType::kF32, {96});
  const ir::ValueId y = g.AddValue("y", DType::kF32, {4, 7, 96}), m = g.AddValue("m", DType::kF32, {4, 7, 1}),
                    r = g.AddValue("r", DType::kF32, {4, 7, 1});
  const ir::NodeId ln = g.AddNode(ir::OpKind::kLayerNorm, "ln", {vx, vs}, {y, m, r});
  absl::StatusOr<std::vector<Tensor>> fwd = backend::MakeCpuBackend()->Run(g.node(ln), {x, scale}, {});
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, (*fwd)[1], (*fwd)[2]}, {}, 3});
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor()}, {}, 3});
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor()}, {}, 3, {2}});  // no dBias
  // dresidual (a fused residual's other gradient) added to dX, with and without saved statistics.
  const Tensor dres = Rand({4, 7, 96}, 4);
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, (*fwd)[1], (*fwd)[2], dres}, {}, 3});
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor(), dres}, {}, 3});
  // dY2 (the gradient Sum fused into the norm's backward), alone and with dresidual.
  const Tensor dy2 = Rand({4, 7, 96}, 5);
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, (*fwd)[1], (*fwd)[2], Tensor(), dy2}, {}, 3});
  Check({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor(), dres, dy2}, {}, 3});
}

TEST_F(CudaOpsTest, RMSNormAndItsGradient) {
  Check({ir::OpKind::kRMSNorm, {Rand({4, 7, 96}, 1, -3, 3), Rand({96}, 2)}, Attrs({{"epsilon", 1e-6}}), 2});
  Check({ir::OpKind::kRMSNorm, {Rand({3, 5, 24}, 3), Rand({5, 24}, 4)}, Attrs({{"axis", int64_t{1}}}), 1});
  const Tensor x = Rand({4, 7, 96}, 5, -2, 2), scale = Rand({96}, 6), dy = Rand({4, 7, 96}, 7);
  ir::Graph g;
  const ir::ValueId vx = g.AddValue("x", DType::kF32, {4, 7, 96}), vs = g.AddValue("s", DType::kF32, {96});
  const ir::ValueId y = g.AddValue("y", DType::kF32, {4, 7, 96}), r = g.AddValue("r", DType::kF32, {4, 7, 1});
  const ir::NodeId rms = g.AddNode(ir::OpKind::kRMSNorm, "rms", {vx, vs}, {y, r});
  absl::StatusOr<std::vector<Tensor>> fwd = backend::MakeCpuBackend()->Run(g.node(rms), {x, scale}, {});
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  Check({ir::OpKind::kRMSNormGrad, {dy, x, scale, (*fwd)[1]}, {}, 2});
  Check({ir::OpKind::kRMSNormGrad, {dy, x, scale, Tensor()}, {}, 2});
  Check({ir::OpKind::kRMSNormGrad, {dy, x, scale, Tensor()}, {}, 1});  // no dScale
  Check({ir::OpKind::kRMSNormGrad, {dy, x, scale, (*fwd)[1], Rand({4, 7, 96}, 8)}, {}, 2});  // with dY2
}

// The flash forward's Stats output (each row's log-sum-exp) is the CPU's; with the forward's O and
// Stats as inputs the flash backward (which recomputes) gives the same gradients.
TEST_F(CudaOpsTest, AttentionStatsAreTheCpusAndTheBackwardTakesThem) {
  const Tensor q = Rand({2, 3, 9, 16}, 1), k = Rand({2, 3, 11, 16}, 2), v = Rand({2, 3, 11, 8}, 3);
  for (int64_t causal : {0, 1}) {
    const ir::Attrs a = Attrs({{"scale", 0.4}, {"causal", causal}});
    Check({ir::OpKind::kAttention, {q, k, v}, a, 2});
    ir::Graph g;
    const std::vector<ir::ValueId> ids = {g.AddValue("q", DType::kF32, {}), g.AddValue("k", DType::kF32, {}),
                                          g.AddValue("v", DType::kF32, {})};
    const ir::ValueId o = g.AddValue("o", DType::kF32, {}), st = g.AddValue("st", DType::kF32, {});
    absl::StatusOr<std::vector<Tensor>> fwd = backend::MakeCpuBackend()->Run(
        g.node(g.AddNode(ir::OpKind::kAttention, "attn", ids, {o, st}, a)), {q, k, v}, {});
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    Check({ir::OpKind::kAttentionGrad, {Rand({2, 3, 9, 8}, 5), q, k, v, Tensor(), (*fwd)[0], (*fwd)[1]}, a, 3});
  }
}

// A learned additive bias (T5's) wants AttentionGrad's dMask, which the fused kernels do not compute: the host
// runs the node and the device gets the CPU's dQ, dK, dV and dMask.
TEST_F(CudaOpsTest, AttentionGradOfALearnedBiasRunsOnTheHost) {
  const Tensor q = Rand({2, 3, 8}, 1), k = Rand({2, 5, 8}, 2), v = Rand({2, 5, 4}, 3);
  Check({ir::OpKind::kAttentionGrad, {Rand({2, 3, 4}, 5), q, k, v, Rand({2, 3, 5}, 4)}, Attrs({{"scale", 0.5}}), 4},
        /*expect_device=*/false);
}

TEST_F(CudaOpsTest, SoftmaxForwardAndBackward) {
  for (ir::OpKind op : {ir::OpKind::kSoftmax, ir::OpKind::kLogSoftmax}) {
    Check({op, {Rand({4, 5, 33}, 1, -4, 4)}});
    Check({op, {Rand({6, 1000, 1}, 2, -4, 4)}, Attrs({{"axis", int64_t{1}}})});
  }
  const Tensor y = Rand({4, 5, 33}, 3, 0, 0.1f), dy = Rand({4, 5, 33}, 4);
  Check({ir::OpKind::kSoftmaxGrad, {dy, y}});
  Check({ir::OpKind::kLogSoftmaxGrad, {dy, Rand({4, 5, 33}, 5, -5, -1)}});
}

TEST_F(CudaOpsTest, SoftmaxCrossEntropyLossAndItsGradient) {
  const Tensor scores = Rand({12, 10}, 1, -3, 3);
  std::vector<int64_t> labels(12);
  for (int i = 0; i < 12; ++i) labels[i] = (i * 7) % 10;
  labels[4] = -100;
  labels[9] = -100;
  const Tensor weights = Rand({10}, 2, 0.5, 2);
  const ir::Attrs configs[] = {
      Attrs({{"ignore_index", int64_t{-100}}}),
      Attrs({{"reduction", std::string("sum")}, {"ignore_index", int64_t{-100}}, {"label_smoothing", 0.1}}),
      Attrs({{"reduction", std::string("none")}, {"ignore_index", int64_t{-100}}}),
  };
  for (const ir::Attrs& attrs : configs) {
    for (DType label_type : {DType::kI64, DType::kI32}) {
      for (bool weighted : {false, true}) {
        const Tensor l = Ints({12}, labels, label_type);
        const Tensor w = weighted ? weights : Tensor();
        Check({ir::OpKind::kSoftmaxCrossEntropyLoss, {scores, l, w}, attrs, 2});
        Check({ir::OpKind::kSoftmaxCrossEntropyLoss, {scores, l, w}, attrs, 2, {1}});
        // The gradient from the CPU forward's log_prob.
        ir::Graph g;
        const ir::ValueId s = g.AddValue("s", DType::kF32, {12, 10}), lv = g.AddValue("l", label_type, {12});
        const ir::ValueId wv = weighted ? g.AddValue("w", DType::kF32, {10}) : ir::kNoValue;
        const ir::ValueId loss = g.AddValue("loss", DType::kF32, {}), lp = g.AddValue("lp", DType::kF32, {12, 10});
        const ir::NodeId n = g.AddNode(ir::OpKind::kSoftmaxCrossEntropyLoss, "sce", {s, lv, wv}, {loss, lp}, attrs);
        absl::StatusOr<std::vector<Tensor>> fwd = backend::MakeCpuBackend()->Run(g.node(n), {scores, l, w}, {});
        ASSERT_TRUE(fwd.ok()) << fwd.status();
        const bool none = attrs.Get<std::string>("reduction", "mean") == "none";
        const Tensor dloss = none ? Rand({12}, 3) : Tensor::FromVector<float>({}, {0.75f});
        Check({ir::OpKind::kSoftmaxCrossEntropyLossGrad, {dloss, (*fwd)[1], l, w}, attrs});
        // What autodiff builds: the forward's loss and Stats, the gradient from the scores and the CPU's Stats; f32
        // scores, then bf16 ones (the loss and Stats f32, dScores bf16).
        Check({ir::OpKind::kSoftmaxCrossEntropyLoss, {scores, l, w}, attrs, 3, {1}});
        const std::vector<Tensor> stats =
            CpuOutputs({ir::OpKind::kSoftmaxCrossEntropyLoss, {scores, l, w}, attrs, 3, {1}}, {scores, l, w});
        ASSERT_EQ(stats.size(), 3u);
        Check({ir::OpKind::kSoftmaxCrossEntropyLossGrad, {dloss, scores, l, w, stats[2]}, attrs});
        const Tensor half = scores.CastTo(DType::kBF16);
        CheckBf16({ir::OpKind::kSoftmaxCrossEntropyLoss, {half, l, w}, attrs, 3, {1}},
                  {DType::kF32, DType::kF32, DType::kF32});
        const std::vector<Tensor> half_stats = CpuOutputs({ir::OpKind::kSoftmaxCrossEntropyLoss, {half, l, w}, attrs, 3, {1}},
                                                          Widened({half, l, w}));
        CheckBf16({ir::OpKind::kSoftmaxCrossEntropyLossGrad, {dloss, half, l, w, half_stats[2]}, attrs},
                  {DType::kBF16});
      }
    }
  }
}

TEST_F(CudaOpsTest, AnOutOfRangeLabelIsTheCpuError) {
  ir::Graph g;
  const ir::ValueId s = g.AddValue("s", DType::kF32, {3, 4}), l = g.AddValue("l", DType::kI64, {3});
  const ir::ValueId loss = g.AddValue("loss", DType::kF32, {});
  const ir::NodeId n = g.AddNode(ir::OpKind::kSoftmaxCrossEntropyLoss, "sce", {s, l}, {loss});
  const Tensor scores = *be_->Upload(Rand({3, 4}, 1)), labels = *be_->Upload(Ints({3}, {0, 4, 1}));
  absl::StatusOr<std::vector<Tensor>> r = be_->Run(g.node(n), {scores, labels}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("label 4"), std::string::npos) << r.status();
}

// --- Elementwise, reductions, broadcasts ---------------------------------------------------------

TEST_F(CudaOpsTest, ArithmeticBroadcasts) {
  for (ir::OpKind op : {ir::OpKind::kAdd, ir::OpKind::kSub, ir::OpKind::kMul, ir::OpKind::kDiv}) {
    Check({op, {Rand({4, 1, 6}, 1), Rand({3, 1}, 2, 0.5, 2)}});
    Check({op, {Rand({2, 3, 64}, 3), Rand({64}, 4, 0.5, 2)}});
    Check({op, {Rand({}, 5, 0.5, 2), Rand({2, 7}, 6, 0.5, 2)}});
  }
  for (ir::OpKind op : {ir::OpKind::kAdd, ir::OpKind::kSub, ir::OpKind::kMul}) {
    Check({op, {Ints({2, 3}, {1, -2, 3, 4, 5, 6}), Ints({3}, {7, 8, -9})}, {}, 1, {}, 0});
    Check({op, {Ints({2, 1}, {3, -4}, DType::kI32), Ints({1, 3}, {5, 6, 7}, DType::kI32)}, {}, 1, {}, 0});
  }
}

TEST_F(CudaOpsTest, PowMinMaxComparisonsAndLogic) {
  Check({ir::OpKind::kPow, {Rand({2, 3, 16}, 1, 0.1f, 3), Rand({16}, 2, -2, 2)}});
  for (ir::OpKind op : {ir::OpKind::kMin, ir::OpKind::kMax}) {
    Check({op, {Rand({4, 1, 6}, 3), Rand({3, 1}, 4)}, {}, 1, {}, 0});
    Check({op, {Ints({2, 3}, {1, -2, 3, 4, 5, 6}), Ints({3}, {7, 0, -9})}, {}, 1, {}, 0});
  }
  // Small integers as floats, so that equality is hit.
  const Tensor x = SmallInts({4, 6}), y = SmallInts({6});
  for (ir::OpKind op : {ir::OpKind::kEqual, ir::OpKind::kLess, ir::OpKind::kGreater, ir::OpKind::kGreaterOrEqual,
                        ir::OpKind::kLessOrEqual}) {
    Check({op, {x, y}, {}, 1, {}, 0});
    Check({op, {Ints({2, 3}, {1, -2, 3, 4, 5, 6}), Ints({3}, {1, 0, 6})}, {}, 1, {}, 0});
  }
  Check({ir::OpKind::kAnd, {Bools({3, 8}, 6), Bools({8}, 7)}, {}, 1, {}, 0});
  Check({ir::OpKind::kNot, {Bools({3, 8}, 8)}, {}, 1, {}, 0});
}

TEST_F(CudaOpsTest, ReluGradAndZerosLike) {
  Check({ir::OpKind::kReluGrad, {Rand({3, 50}, 1), Rand({3, 50}, 2)}, {}, 1, {}, 0});
  Check({ir::OpKind::kZerosLike, {Tensor::DimsOnly(DType::kF32, {3, 5})}, {}, 1, {}, 0});
  Check({ir::OpKind::kZerosLike, {Tensor::DimsOnly(DType::kBF16, {3, 5})}, {}, 1, {}, 0});
}

TEST_F(CudaOpsTest, SumOfBroadcastOperands) {
  Check({ir::OpKind::kSum, {Rand({4, 6}, 1), Rand({4, 6}, 2)}});
  Check({ir::OpKind::kSum, {Rand({6}, 3), Rand({4, 6}, 4), Rand({4, 1}, 5), Rand({}, 6)}});
}

TEST_F(CudaOpsTest, UnaryMath) {
  for (ir::OpKind op : {ir::OpKind::kSqrt, ir::OpKind::kLog, ir::OpKind::kReciprocal})
    Check({op, {Rand({3, 50}, 1, 0.1f, 4)}});
  for (ir::OpKind op : {ir::OpKind::kExp, ir::OpKind::kTanh, ir::OpKind::kSigmoid, ir::OpKind::kNeg, ir::OpKind::kRelu,
                        ir::OpKind::kErf, ir::OpKind::kAbs, ir::OpKind::kSin, ir::OpKind::kCos})
    Check({op, {Rand({3, 50}, 2, -4, 4)}});
  for (ir::OpKind op : {ir::OpKind::kNeg, ir::OpKind::kAbs, ir::OpKind::kRelu})
    Check({op, {Ints({5}, {-3, 0, 7, -(int64_t{1} << 40), 2})}, {}, 1, {}, 0});
}

TEST_F(CudaOpsTest, ReductionsMatchTheCpu) {
  const Tensor x = Rand({4, 5, 6}, 1);
  for (ir::OpKind op : {ir::OpKind::kReduceSum, ir::OpKind::kReduceMean}) {
    Check({op, {x}, Attrs({{"axes", std::vector<int64_t>{1}}})});
    Check({op, {x}, Attrs({{"axes", std::vector<int64_t>{0, -1}}, {"keepdims", int64_t{0}}})});
    Check({op, {x}});  // every axis
    Check({op, {x}, Attrs({{"noop_with_empty_axes", int64_t{1}}})});
  }
  Check({ir::OpKind::kReduceToShapeOf, {x, Tensor::DimsOnly(DType::kF32, {6})}});
  Check({ir::OpKind::kReduceToShapeOf, {x, Tensor::DimsOnly(DType::kF32, {5, 1})}});
  Check({ir::OpKind::kReduceToShapeOf, {x, Tensor::DimsOnly(DType::kF32, {4, 5, 6})}});
}

TEST_F(CudaOpsTest, ExpandLikeBroadcastsAndScales) {
  Check({ir::OpKind::kExpandLike,
         {Rand({4, 6}, 1), Tensor::DimsOnly(DType::kF32, {4, 5, 6})},
         Attrs({{"axes", std::vector<int64_t>{1}}})});
  Check({ir::OpKind::kExpandLike, {Rand({}, 2), Tensor::DimsOnly(DType::kF32, {3, 7})}, Attrs({{"mean", int64_t{1}}})});
  Check({ir::OpKind::kExpandLike,
         {Rand({4}, 3), Tensor::DimsOnly(DType::kF32, {4, 9})},
         Attrs({{"axes", std::vector<int64_t>{-1}}, {"mean", int64_t{1}}})});
}

TEST_F(CudaOpsTest, WhereAndCast) {
  Check({ir::OpKind::kWhere, {Bools({4, 1, 6}, 1), Rand({5, 6}, 2), Rand({4, 5, 1}, 3)}});
  Check({ir::OpKind::kWhere, {Bools({3}, 4), Ints({3}, {1, 2, 3}), Ints({2, 3}, {4, 5, 6, 7, 8, 9})}, {}, 1, {}, 0});
  std::vector<float> special = {0.f, -0.f, 1.5f, -1.5f, 2.99f, -7.9f, 1e20f, -1e20f, NAN, 3e9f};
  const Tensor f = Tensor::FromVector<float>({10}, special);
  for (const char* to : {"i64", "i32", "bool", "f32"}) {
    Check({ir::OpKind::kCast, {f}, Attrs({{"to", std::string(to)}})});
  }
  Check({ir::OpKind::kCast, {Ints({4}, {-3, 0, 7, int64_t{1} << 40})}, Attrs({{"to", std::string("f32")}})});
  Check({ir::OpKind::kCast, {Ints({4}, {-3, 0, 7, 1}, DType::kI32)}, Attrs({{"to", std::string("i64")}})});
}

// --- Shape views -----------------------------------------------------------------------------------

TEST_F(CudaOpsTest, ShapeOpsAreViewsOrCopies) {
  const Tensor x = Rand({2, 3, 1, 4}, 1);
  const Tensor shape = Ints({3}, {0, -1, 2});
  Check({ir::OpKind::kReshape, {x, shape}, {}, 1, {}, 0, {}, /*host_inputs=*/1u << 1});  // constant on the host
  Check({ir::OpKind::kReshape, {x, shape}, {}, 1, {}, 0});                               // shape on the device
  Check({ir::OpKind::kFlatten, {x}, Attrs({{"axis", int64_t{2}}}), 1, {}, 0});
  Check({ir::OpKind::kSqueeze, {x}, Attrs({{"axes", std::vector<int64_t>{2}}}), 1, {}, 0});
  Check({ir::OpKind::kUnsqueeze, {x}, Attrs({{"axes", std::vector<int64_t>{0, -1}}}), 1, {}, 0});
  Check({ir::OpKind::kReshapeLike, {x, Tensor::DimsOnly(DType::kF32, {6, 4})}, {}, 1, {}, 0});
  Check({ir::OpKind::kIdentity, {Ints({3}, {4, 5, 6})}, {}, 1, {}, 0});

  // Planned as a view: the output is the input's device buffer.
  ir::Graph g;
  const ir::ValueId in = g.AddValue("x", DType::kF32, {2, 3, 1, 4}), out = g.AddValue("y", DType::kF32, {24});
  const ir::NodeId n = g.AddNode(ir::OpKind::kFlatten, "f", {in}, {out}, Attrs({{"axis", int64_t{0}}}));
  const Tensor d = *be_->Upload(x);
  PlannedOutputs shared(*be_, 0, /*share=*/true);
  absl::StatusOr<std::vector<Tensor>> r = be_->Run(g.node(n), {d}, {}, &shared);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].address(), d.address());
  EXPECT_EQ((*r)[0].dims(), (std::vector<int64_t>{1, 24}));
}

TEST_F(CudaOpsTest, ABadReshapeIsTheCpuError) {
  ir::Graph g;
  const ir::ValueId in = g.AddValue("x", DType::kF32, {2, 3}), s = g.AddValue("s", DType::kI64, {1});
  const ir::ValueId out = g.AddValue("y", DType::kF32, {5});
  const ir::NodeId n = g.AddNode(ir::OpKind::kReshape, "r", {in, s}, {out});
  absl::StatusOr<std::vector<Tensor>> r = be_->Run(g.node(n), {*be_->Upload(Rand({2, 3}, 1)), Ints({1}, {5})}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cannot reshape"), std::string::npos) << r.status();
}

TEST_F(CudaOpsTest, TransposeAndSliceAreStridedCopies) {
  const Tensor x = Rand({2, 3, 4, 5}, 1);
  Check({ir::OpKind::kTranspose, {x}, Attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}), 1, {}, 0});
  Check({ir::OpKind::kTranspose, {x}, {}, 1, {}, 0});  // reversed dims
  // Attention's head split: rows of 64 floats move as 16-byte units; a slice starting one float in
  // moves single floats; int64 rows move in pairs.
  const Tensor heads = Rand({2, 8, 16, 64}, 3);
  Check({ir::OpKind::kTranspose, {heads}, Attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}), 1, {}, 0});
  Check({ir::OpKind::kSlice,
         {heads, Ints({1}, {1}), Ints({1}, {63}), Ints({1}, {-1}), Tensor()},
         {},
         1,
         {},
         0,
         {},
         /*host_inputs=*/0b11110u});
  std::vector<int64_t> iv(4 * 6 * 2);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = static_cast<int64_t>(i * 7919 % 1000) - 500;
  Check({ir::OpKind::kTranspose, {Ints({4, 6, 2}, iv)}, Attrs({{"perm", std::vector<int64_t>{1, 0, 2}}}), 1, {}, 0});
  Check({ir::OpKind::kTranspose,
         {Ints({2, 3}, {1, 2, 3, 4, 5, 6})},
         Attrs({{"perm", std::vector<int64_t>{1, 0}}}),
         1,
         {},
         0});
  // starts, ends, axes, steps: clamped ends, a negative step, a negative axis.
  const Tensor starts = Ints({3}, {1, -1, 0}), ends = Ints({3}, {100, 0, 3}), axes = Ints({3}, {1, -1, 0});
  const Tensor steps = Ints({3}, {2, -2, 1});
  Check({ir::OpKind::kSlice, {x, starts, ends, axes, steps}, {}, 1, {}, 0, {}, /*host_inputs=*/0b11110u});
  Check({ir::OpKind::kSlice, {x, starts, ends, axes, steps}, {}, 1, {}, 0});  // operands on the device
  Check({ir::OpKind::kSlice,
         {x, Ints({2}, {0, 1}), Ints({2}, {1, 3}), Tensor(), Tensor()},
         {},
         1,
         {},
         0,
         {},
         /*host_inputs=*/0b11110u});
  // The gradient of the first slice: dY has the slice's shape (2, 1, 4, 2).
  Check({ir::OpKind::kSliceGrad,
         {Rand({2, 1, 4, 2}, 2), Tensor::DimsOnly(DType::kF32, {2, 3, 4, 5}), starts, ends, axes, steps},
         {},
         1,
         {},
         0,
         {},
         /*host_inputs=*/0b111100u});
}

TEST_F(CudaOpsTest, ConcatSplitAndExpandAreStridedCopies) {
  const Tensor a = Rand({2, 3, 4}, 1), b = Rand({2, 5, 4}, 2), c = Rand({2, 1, 4}, 3);
  Check({ir::OpKind::kConcat, {a, b, c}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0});
  Check({ir::OpKind::kConcat, {a, Rand({2, 3, 6}, 4)}, Attrs({{"axis", int64_t{-1}}}), 1, {}, 0});
  Check({ir::OpKind::kConcat, {Ints({2}, {1, 2}), Ints({3}, {3, 4, 5})}, Attrs({{"axis", int64_t{0}}}), 1, {}, 0});
  const Tensor qkv = Rand({2, 5, 48}, 5);  // GPT-2's fused QKV projection
  Check({ir::OpKind::kSplit, {qkv}, Attrs({{"axis", int64_t{-1}}}), 3, {}, 0});
  Check({ir::OpKind::kSplit, {qkv}, Attrs({{"axis", int64_t{1}}, {"split", std::vector<int64_t>{1, 4}}}), 2, {}, 0});
  Check({ir::OpKind::kSplit, {qkv}, Attrs({{"axis", int64_t{1}}, {"num_outputs", int64_t{2}}}), 2, {}, 0});  // 3, 2
  Check({ir::OpKind::kSplit, {qkv}, Attrs({{"axis", int64_t{-1}}}), 3, {1}, 0});  // the middle piece unused
  Check({ir::OpKind::kConcatGrad,
         {Rand({2, 9, 4}, 6), Tensor::DimsOnly(DType::kF32, {2, 3, 4}), Tensor::DimsOnly(DType::kF32, {2, 5, 4}),
          Tensor::DimsOnly(DType::kF32, {2, 1, 4})},
         Attrs({{"axis", int64_t{1}}}),
         3,
         {},
         0});
  Check({ir::OpKind::kExpand, {Rand({3, 1}, 7), Ints({3}, {2, 1, 5})}, {}, 1, {}, 0, {}, /*host_inputs=*/1u << 1});
  Check({ir::OpKind::kExpand, {Rand({3, 1}, 7), Ints({3}, {2, 1, 5})}, {}, 1, {}, 0});  // shape on the device
  Check({ir::OpKind::kExpand, {Bools({1, 4}, 8), Ints({2}, {3, 1})}, {}, 1, {}, 0, {}, /*host_inputs=*/1u << 1});
}

// The index ops of Hugging Face exports (RoBERTa's position ids, DistilBERT's dynamo GatherND) on the
// device: forward bit for bit, gradients bit for bit in fp32 (both add in index order); indices on the
// device and as host constants.
TEST_F(CudaOpsTest, CumSumGatherElementsGatherNDAndGradientsRunOnTheDevice) {
  const Tensor mask = Ints({2, 6}, {1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0});
  Check({ir::OpKind::kCumSum, {mask}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0});
  Check({ir::OpKind::kCumSum,
         {Rand({4, 5, 3}, 1)},
         Attrs({{"axis", int64_t{-2}}, {"reverse", int64_t{1}}}),
         1,
         {},
         1e-6});
  const Tensor data = Rand({4, 5}, 2);
  const Tensor ge_idx = Ints({4, 3}, {0, 4, -1, 2, 2, 1, 3, 0, -5, 1, 1, 1});
  for (uint32_t host : {0u, 1u << 1}) {
    Check({ir::OpKind::kGatherElements, {data, ge_idx}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0, {}, host});
    Check({ir::OpKind::kGatherElementsGrad,
           {Rand({4, 3}, 3), ge_idx, Tensor::DimsOnly(DType::kF32, {4, 5})},
           Attrs({{"axis", int64_t{1}}}),
           1,
           {},
           0,
           {},
           host});
    const Tensor nd_idx = Ints({3, 2}, {0, 1, 3, -1, 0, 1});
    Check({ir::OpKind::kGatherND, {data, nd_idx}, {}, 1, {}, 0, {}, host});
    Check({ir::OpKind::kGatherNDGrad,
           {Rand({3}, 4), nd_idx, Tensor::DimsOnly(DType::kF32, {4, 5})},
           {},
           1,
           {},
           0,
           {},
           host});
    const Tensor rows = Ints({2, 1}, {3, 3});
    Check({ir::OpKind::kGatherNDGrad,
           {Rand({2, 5}, 5), rows, Tensor::DimsOnly(DType::kF32, {4, 5})},
           {},
           1,
           {},
           0,
           {},
           host});
  }
}

// --- Embedding and dropout -----------------------------------------------------------------------------

TEST_F(CudaOpsTest, GatherAndItsGradient) {
  const Tensor table = Rand({10, 16}, 1);
  const Tensor idx = Ints({3, 4}, {0, 9, -1, 3, 3, 5, 0, 2, 7, 3, -10, 1});
  Check({ir::OpKind::kGather, {table, idx}, {}, 1, {}, 0});
  Check({ir::OpKind::kGather, {table, idx.CastTo(DType::kI32)}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0});
  Check({ir::OpKind::kGather, {Ints({5}, {1, 2, 3, 4, 5}), Ints({2}, {4, 0})}, {}, 1, {}, 0});
  Check({ir::OpKind::kGatherGrad, {Rand({3, 4, 16}, 2), idx, Tensor::DimsOnly(DType::kF32, {10, 16})}});
  Check({ir::OpKind::kGatherGrad,
         {Rand({10, 3, 4}, 3), idx, Tensor::DimsOnly(DType::kF32, {10, 16})},
         Attrs({{"axis", int64_t{1}}})});
}

TEST_F(CudaOpsTest, AnOutOfRangeIndexIsTheCpuError) {
  ir::Graph g;
  const ir::ValueId t = g.AddValue("t", DType::kF32, {4, 2}), i = g.AddValue("i", DType::kI64, {2});
  const ir::ValueId out = g.AddValue("y", DType::kF32, {2, 2});
  const ir::NodeId n = g.AddNode(ir::OpKind::kGather, "g", {t, i}, {out});
  absl::StatusOr<std::vector<Tensor>> r =
      be_->Run(g.node(n), {*be_->Upload(Rand({4, 2}, 1)), *be_->Upload(Ints({2}, {1, 4}))}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("index 4"), std::string::npos) << r.status();
}

TEST_F(CudaOpsTest, DropoutMasksAreTheCpusBitForBit) {
  backend::ExecContext train;
  train.training = true;
  train.seed = 11;
  train.offset = 3;
  Case c{ir::OpKind::kDropout, {Rand({4, 6, 40}, 1)}, Attrs({{"ratio", 0.1}}), 2, {}, 0, train};
  Check(c);
  c.ctx.row_offset = 4;  // micro-batch rows [4, 8) of an 8-row batch
  c.ctx.rows = 4;
  c.attrs = Attrs({{"ratio", 0.5}, {"rng_key", std::string("attn_dropout")}});
  Check(c);
  c.absent_outputs = {1};
  Check(c);
  backend::ExecContext eval;
  Check({ir::OpKind::kDropout, {Rand({4, 6}, 2)}, Attrs({{"ratio", 0.3}}), 2, {}, 0, eval});
  // Without the mask the gradient regenerates the forward's (the stream of its rng_key).
  Case regen{ir::OpKind::kDropoutGrad,
             {Rand({4, 6, 40}, 3)},
             Attrs({{"ratio", 0.5}, {"rng_key", std::string("attn_dropout")}}),
             1,
             {},
             0,
             train};
  Check(regen);
  regen.ctx.row_offset = 4, regen.ctx.rows = 4;
  Check(regen);
  // The gradient scales by 1 / (1 - ratio) while training, by 1 outside it; the mask applies either way.
  for (const backend::ExecContext& ctx : {train, eval}) {
    Check({ir::OpKind::kDropoutGrad,
           {Rand({4, 6, 40}, 3), Bools({4, 6, 40}, 4)},
           Attrs({{"ratio", 0.1}}),
           1,
           {},
           0,
           ctx});
  }
}

// --- Optimizer -----------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, SgdAndAdamWUpdates) {
  const Tensor p = Rand({33, 17}, 1), g = Rand({33, 17}, 2), buf = Rand({33, 17}, 3);
  const Tensor lr = Tensor::FromVector<double>({}, {0.05});
  const Tensor scale = Tensor::FromVector<float>({}, {0.8f});
  Check({ir::OpKind::kSGDUpdate, {p, g, lr, Tensor(), Tensor()}, {}, 2, {1}});
  Check({ir::OpKind::kSGDUpdate,
         {p, g, lr, buf, scale},
         Attrs({{"momentum", 0.9}, {"nesterov", int64_t{1}}, {"weight_decay", 1e-2}}),
         2});
  Check({ir::OpKind::kSGDUpdate,
         {p, g, lr, buf, Tensor()},
         Attrs({{"momentum", 0.9}}),
         2,
         {},
         1e-5,
         {},
         /*host_inputs=*/1u << 2});
  const Tensor m = Rand({33, 17}, 4), v = Rand({33, 17}, 5, 0, 0.1f);
  const Tensor step = Tensor::FromVector<int64_t>({}, {3});
  Check({ir::OpKind::kAdamWUpdate, {p, g, m, v, lr, step, scale}, Attrs({{"weight_decay", 0.1}}), 3});
  Check({ir::OpKind::kAdamWUpdate,
         {p, g, m, v, lr, step, Tensor()},
         {},
         3,
         {},
         1e-5,
         {},
         /*host_inputs=*/(1u << 4) | (1u << 5)});
}

// Backend::RunGroup over many update nodes (one multi-tensor step on the GPU): each node's outputs
// are what the CPU backend computes for that node alone (the kernels round as the CPU does).
// `inputs[i]` are node i's host inputs; a tensor shared by every node (lr, step, the clipping
// scale) is uploaded once, as the executor's step scalars are. `attrs[i]` may differ from node 0's:
// such a group runs node by node, with the same results.
void CheckUpdateGroup(const std::shared_ptr<CudaBackend>& be, ir::OpKind op, int outputs,
                      const std::vector<std::vector<Tensor>>& inputs, const std::vector<ir::Attrs>& attrs,
                      uint32_t host_inputs) {
  ir::Graph g;
  std::vector<const ir::Node*> nodes;
  std::vector<std::vector<Tensor>> dev(inputs.size());
  std::map<const void*, Tensor> uploaded;  // host buffer -> its device copy
  for (size_t n = 0; n < inputs.size(); ++n) {
    std::vector<ir::ValueId> in_ids, out_ids;
    for (size_t i = 0; i < inputs[n].size(); ++i) {
      const Tensor& x = inputs[n][i];
      in_ids.push_back(x.defined() ? g.AddValue("in" + std::to_string(n) + "_" + std::to_string(i), x.dtype(),
                                                ir::Shape(x.dims().begin(), x.dims().end()))
                                   : ir::kNoValue);
      if (!x.defined() || (host_inputs >> i & 1u) != 0) {
        dev[n].push_back(x);
        continue;
      }
      auto it = uploaded.find(x.address());
      if (it == uploaded.end()) {
        absl::StatusOr<Tensor> d = be->Upload(x);
        ASSERT_TRUE(d.ok()) << d.status();
        it = uploaded.emplace(x.address(), *d).first;
      }
      dev[n].push_back(it->second);
    }
    for (int k = 0; k < outputs; ++k)
      out_ids.push_back(g.AddValue("out" + std::to_string(n) + "_" + std::to_string(k), DType::kF32, {}, false));
    g.AddNode(op, "update" + std::to_string(n), in_ids, out_ids, attrs[n]);
  }
  for (ir::NodeId id = 0; id < static_cast<ir::NodeId>(inputs.size()); ++id) nodes.push_back(&g.node(id));
  absl::StatusOr<std::vector<std::vector<Tensor>>> got = be->RunGroup(nodes, dev, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    absl::StatusOr<std::vector<Tensor>> want = backend::MakeCpuBackend()->Run(*nodes[n], inputs[n], {});
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ((*got)[n].size(), want->size()) << "node " << n;
    for (size_t k = 0; k < want->size(); ++k) {
      absl::StatusOr<Tensor> h = be->ToHost((*got)[n][k]);
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_TRUE(h->BitwiseEquals((*want)[k])) << ir::OpName(op) << " node " << n << " output " << k;
    }
  }
}

TEST_F(CudaOpsTest, UpdateGroupsEqualEachNodeOnTheCpu) {
  const std::vector<std::vector<int64_t>> dims = {{1}, {7}, {33, 17}, {1000}, {70000}, {3, 65536 + 5}};
  const Tensor lr = Tensor::FromVector<double>({}, {0.05});
  const Tensor step = Tensor::FromVector<int64_t>({}, {4});
  const Tensor scale = Tensor::FromVector<float>({}, {0.8f});
  const ir::Attrs sgd_momentum = Attrs({{"momentum", 0.9}, {"nesterov", int64_t{1}}, {"weight_decay", 1e-2}});
  const ir::Attrs adamw = Attrs({{"weight_decay", 0.1}, {"beta2", 0.95}});
  std::vector<std::vector<Tensor>> sgd, sgd_buf, adam;
  for (size_t i = 0; i < dims.size(); ++i) {
    const Tensor p = Rand(dims[i], 10 + i), g = Rand(dims[i], 20 + i), b = Rand(dims[i], 30 + i);
    const Tensor v = Rand(dims[i], 40 + i, 0, 0.1f);
    sgd.push_back({p, g, lr, Tensor(), Tensor()});
    sgd_buf.push_back({p, g, lr, b, scale});
    adam.push_back({p, g, b, v, lr, step, scale});
  }
  const size_t n = dims.size();
  {
    SCOPED_TRACE("SGD, lr on the host");
    CheckUpdateGroup(be_, ir::OpKind::kSGDUpdate, 1, sgd, std::vector<ir::Attrs>(n), 1u << 2);
  }
  {
    SCOPED_TRACE("SGD with momentum, nesterov, weight decay and a clipping scale");
    CheckUpdateGroup(be_, ir::OpKind::kSGDUpdate, 2, sgd_buf, std::vector<ir::Attrs>(n, sgd_momentum), 0);
  }
  {
    SCOPED_TRACE("SGD, one node with another weight decay: node by node");
    std::vector<ir::Attrs> mixed(n, sgd_momentum);
    mixed[2] = Attrs({{"momentum", 0.9}, {"nesterov", int64_t{1}}, {"weight_decay", 0.5}});
    CheckUpdateGroup(be_, ir::OpKind::kSGDUpdate, 2, sgd_buf, mixed, 0);
  }
  {
    SCOPED_TRACE("AdamW with a clipping scale, lr and step on the device");
    CheckUpdateGroup(be_, ir::OpKind::kAdamWUpdate, 3, adam, std::vector<ir::Attrs>(n, adamw), 0);
  }
}

TEST_F(CudaOpsTest, GradientNormAndClipScale) {
  Check({ir::OpKind::kSumSquares, {Rand({100, 37}, 1), Rand({5}, 2), Rand({70000}, 3)}});
  for (float norm : {0.5f, 3.f, NAN}) {
    Check({ir::OpKind::kClipScale, {Tensor::FromVector<float>({}, {norm})}, Attrs({{"max_norm", 1.0}})});
  }
}

// --- bf16 graphs ------------------------------------------------------------------------------------------
// What the --dtype bf16 mode gives the kernels: bf16 activations and weights (fp32 masters read through
// Cast), fp32 norm statistics, fp32 loss and optimizer. Each op runs on the device and matches the CPU's
// fp32 kernel on the widened inputs with its result rounded to bf16: bit for bit where the arithmetic is the
// same (tol 0), else within one bf16 unit in the last place.

Tensor B(const Tensor& t) { return t.CastTo(DType::kBF16); }
Tensor RandB(std::vector<int64_t> dims, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  return B(Rand(std::move(dims), seed, lo, hi));
}
constexpr DType kB = DType::kBF16, kF = DType::kF32;

TEST_F(CudaOpsTest, Bf16GemmsAccumulateInFp32AndRoundOnce) {
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> shapes[] = {
      {{2, 3, 5, 8}, {8, 6}},        // tall
      {{2, 3, 5, 8}, {2, 3, 8, 6}},  // equal batches
      {{3, 1, 5, 8}, {1, 4, 8, 6}},  // one GEMM per output matrix
      {{8}, {2, 8, 6}},              // 1-D A
      {{4, 0}, {0, 3}},              // K = 0: zeros
      {{2, 16, 96}, {96, 64}},       // a projection
  };
  uint32_t seed = 1;
  for (const auto& [a, b] : shapes) CheckBf16({ir::OpKind::kMatMul, {RandB(a, seed++), RandB(b, seed++)}}, {kB});
  CheckBf16({ir::OpKind::kFusedMatMul,
             {RandB({2, 4, 16, 8}, 1), RandB({2, 4, 16, 8}, 2)},
             Attrs({{"trans_b", int64_t{1}}, {"alpha", 0.125}})},
            {kB});  // Q K^T
  CheckBf16({ir::OpKind::kFusedMatMul, {RandB({32, 24}, 3), RandB({32, 40}, 4)}, Attrs({{"trans_a", int64_t{1}}})},
            {kB});  // dW = X^T dY
  CheckBf16({ir::OpKind::kFusedMatMul,
             {RandB({7, 12}, 5), RandB({9, 7}, 6)},
             Attrs({{"trans_a", int64_t{1}}, {"trans_b", int64_t{1}}, {"alpha", -2.0}})},
            {kB});
  CheckBf16({ir::OpKind::kLinear, {RandB({2, 7, 64}, 7), RandB({64, 48}, 8), RandB({48}, 9)}}, {kB});
  CheckBf16({ir::OpKind::kLinear,
             {RandB({4, 32, 256}, 10), RandB({128, 256}, 11), RandB({128}, 12)},
             Attrs({{"trans_b", int64_t{1}}})},
            {kB});
  CheckBf16({ir::OpKind::kLinear, {RandB({5, 16}, 13), RandB({16, 24}, 14), Tensor()}}, {kB});
  CheckBf16({ir::OpKind::kLinear, {RandB({3, 40}, 15), RandB({40, 37}, 16), RandB({37}, 17)}}, {kB});  // odd N
  CheckBf16({ir::OpKind::kGemm,
             {RandB({9, 6}, 18), RandB({5, 9}, 19), RandB({6, 1}, 20)},
             Attrs({{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.5}, {"beta", -1.5}})},
            {kB});
}

TEST_F(CudaOpsTest, FusedMatMulKSumIsTheBiasGradient) {
  // dW = dY^T X with dY's column sums (k_sum a, the BGRADA epilogue) and dW^T = X^T dY (k_sum b, BGRADB), fp32
  // and bf16; alpha != 1 and k = 0 take the reduction path.
  auto ksum = [](std::string of, int64_t ta, int64_t tb, double alpha = 1.0) {
    return Attrs({{"trans_a", ta}, {"trans_b", tb}, {"alpha", alpha}, {"k_sum", std::move(of)}});
  };
  Check({ir::OpKind::kFusedMatMul, {Rand({96, 48}, 1), Rand({96, 64}, 2)}, ksum("a", 1, 0), 2});
  Check({ir::OpKind::kFusedMatMul, {Rand({96, 64}, 3), Rand({96, 48}, 4)}, ksum("b", 1, 0), 2});
  Check({ir::OpKind::kFusedMatMul, {Rand({24, 40}, 5), Rand({16, 40}, 6)}, ksum("a", 0, 1, 0.5), 2});
  Check({ir::OpKind::kFusedMatMul, {Rand({24, 40}, 7), Rand({16, 40}, 8)}, ksum("b", 0, 1), 2});
  Check({ir::OpKind::kFusedMatMul, {Rand({0, 8}, 9), Rand({0, 6}, 10)}, ksum("b", 1, 0), 2});
  CheckBf16({ir::OpKind::kFusedMatMul, {RandB({512, 96}, 11), RandB({512, 64}, 12)}, ksum("a", 1, 0), 2}, {kB, kB});
  CheckBf16({ir::OpKind::kFusedMatMul, {RandB({512, 64}, 13), RandB({512, 96}, 14)}, ksum("b", 1, 0), 2}, {kB, kB});
  CheckBf16({ir::OpKind::kFusedMatMul, {RandB({33, 20}, 15), RandB({33, 12}, 16)}, ksum("b", 1, 0, 2.0), 2}, {kB, kB});
  // `to` f32 (CastIntoGemm): the f32 masters' gradients straight from the bf16 GEMM, both outputs.
  ir::Attrs to_f32 = ksum("a", 1, 0);
  to_f32.Set("to", std::string("f32"));
  CheckBf16({ir::OpKind::kFusedMatMul, {RandB({512, 96}, 17), RandB({512, 64}, 18)}, to_f32, 2}, {kF, kF});
  CheckBf16({ir::OpKind::kFusedMatMul,
             {RandB({40, 24}, 19), RandB({40, 32}, 20)},
             Attrs({{"trans_a", int64_t{1}}, {"to", std::string("f32")}})},
            {kF});
}

TEST_F(CudaOpsTest, Bf16NormsKeepFp32Statistics) {
  CheckBf16({ir::OpKind::kLayerNorm, {RandB({4, 7, 96}, 1, -3, 3), RandB({96}, 2), RandB({96}, 3)}, {}, 3},
            {kB, kF, kF});
  CheckBf16(
      {ir::OpKind::kLayerNorm, {RandB({4, 7, 32}, 4), RandB({32}, 5), Tensor()}, Attrs({{"epsilon", 1e-3}}), 3, {1, 2}},
      {kB, kF, kF});
  CheckBf16({ir::OpKind::kRMSNorm, {RandB({4, 7, 96}, 6, -3, 3), RandB({96}, 7)}, Attrs({{"epsilon", 1e-6}}), 2},
            {kB, kF});
  // Gradients from the CPU forward's statistics (fp32, of the bf16 input) and recomputed ones.
  const Tensor x = RandB({4, 7, 96}, 8, -2, 2), scale = RandB({96}, 9), dy = RandB({4, 7, 96}, 10);
  ir::Graph g;
  const ir::ValueId vx = g.AddValue("x", kF, {4, 7, 96}), vs = g.AddValue("s", kF, {96});
  const ir::ValueId y = g.AddValue("y", kF, {4, 7, 96}), m = g.AddValue("m", kF, {4, 7, 1}),
                    r = g.AddValue("r", kF, {4, 7, 1});
  const ir::NodeId ln = g.AddNode(ir::OpKind::kLayerNorm, "ln", {vx, vs}, {y, m, r});
  const ir::ValueId y2 = g.AddValue("y2", kF, {4, 7, 96}), r2 = g.AddValue("r2", kF, {4, 7, 1});
  const ir::NodeId rms = g.AddNode(ir::OpKind::kRMSNorm, "rms", {vx, vs}, {y2, r2});
  const std::vector<Tensor> wide = {x.CastTo(kF), scale.CastTo(kF)};
  absl::StatusOr<std::vector<Tensor>> ln_fwd = backend::MakeCpuBackend()->Run(g.node(ln), wide, {});
  absl::StatusOr<std::vector<Tensor>> rms_fwd = backend::MakeCpuBackend()->Run(g.node(rms), wide, {});
  ASSERT_TRUE(ln_fwd.ok()) << ln_fwd.status();
  ASSERT_TRUE(rms_fwd.ok()) << rms_fwd.status();
  CheckBf16({ir::OpKind::kLayerNormGrad, {dy, x, scale, (*ln_fwd)[1], (*ln_fwd)[2]}, {}, 3}, {kB, kB, kB});
  CheckBf16({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor()}, {}, 3, {2}}, {kB, kB, kB});  // no dBias
  CheckBf16({ir::OpKind::kLayerNormGrad, {dy, x, scale, Tensor(), Tensor()}, {}, 3, {1, 2}}, {kB, kB, kB});
  // dY2: the device adds it to dY rounded to bf16 (the Sum it replaces), so the reference is the CPU
  // kernel on that rounded sum as dY.
  const Tensor dy2 = RandB({4, 7, 96}, 11), dres = RandB({4, 7, 96}, 12);
  Tensor summed(kF, dy.dims());
  const std::vector<float> a = Floats(dy), b = Floats(dy2);
  for (size_t i = 0; i < a.size(); ++i) summed.mutable_data<float>()[i] = a[i] + b[i];
  summed = summed.CastTo(kB).CastTo(kF);
  auto sum_reference = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> r = Widened(in);
    r[0] = summed;
    r.back() = Tensor();
    return r;
  };
  const std::vector<Tensor> ln_in = {dy, x, scale, (*ln_fwd)[1], (*ln_fwd)[2], dres, dy2};
  CheckBf16({ir::OpKind::kLayerNormGrad, ln_in, {}, 3}, {kB, kB, kB}, true, sum_reference(ln_in));
  CheckBf16({ir::OpKind::kRMSNormGrad, {dy, x, scale, (*rms_fwd)[1]}, {}, 2}, {kB, kB});
  CheckBf16({ir::OpKind::kRMSNormGrad, {dy, x, scale, Tensor()}, {}, 1}, {kB});  // no dScale
  const std::vector<Tensor> rms_in = {dy, x, scale, (*rms_fwd)[1], dy2};
  CheckBf16({ir::OpKind::kRMSNormGrad, rms_in, {}, 2}, {kB, kB}, true, sum_reference(rms_in));
}

TEST_F(CudaOpsTest, Bf16SoftmaxGeluAndDropout) {
  for (ir::OpKind op : {ir::OpKind::kSoftmax, ir::OpKind::kLogSoftmax})
    CheckBf16({op, {RandB({4, 5, 40}, 1, -4, 4)}}, {kB});
  CheckBf16({ir::OpKind::kSoftmaxGrad, {RandB({4, 5, 40}, 2), RandB({4, 5, 40}, 3, 0, 0.1f)}}, {kB});
  CheckBf16({ir::OpKind::kLogSoftmaxGrad, {RandB({4, 5, 40}, 4), RandB({4, 5, 40}, 5, -5, -1)}}, {kB});
  for (const char* form : {"none", "tanh"}) {
    const ir::Attrs a = Attrs({{"approximate", std::string(form)}});
    CheckBf16({ir::OpKind::kGelu, {RandB({3, 7, 64}, 6, -5, 5)}, a}, {kB});
    CheckBf16({ir::OpKind::kGeluGrad, {RandB({3, 7, 64}, 7), RandB({3, 7, 64}, 8, -5, 5)}, a}, {kB});
  }
  // The keep mask is the CPU's bit for bit; the kept values are x * scale rounded once.
  backend::ExecContext train;
  train.training = true;
  train.seed = 11;
  train.offset = 3;
  CheckBf16({ir::OpKind::kDropout, {RandB({4, 6, 40}, 9)}, Attrs({{"ratio", 0.1}}), 2, {}, 0, train},
            {kB, DType::kBool});
  CheckBf16({ir::OpKind::kDropoutGrad,
             {RandB({4, 6, 40}, 10), Bools({4, 6, 40}, 11)},
             Attrs({{"ratio", 0.1}}),
             1,
             {},
             0,
             train},
            {kB});
}

TEST_F(CudaOpsTest, GeluWithAFusedDropoutIsTheCpus) {
  backend::ExecContext train;
  train.training = true;
  train.seed = 11;
  train.offset = 3;
  backend::ExecContext eval;
  for (const char* form : {"none", "tanh"}) {
    const ir::Attrs a =
        Attrs({{"approximate", std::string(form)}, {"dropout", 0.3}, {"rng_key", std::string("/mlp/dropout/Dropout")}});
    // 4 * 6 * 41 elements: runs of four and a tail; a micro-batch's rows shift the counters.
    Case fwd{ir::OpKind::kGelu, {Rand({4, 6, 41}, 1, -5, 5)}, a, 1, {}, 1e-5, train};
    Case bwd{ir::OpKind::kGeluGrad, {Rand({4, 6, 41}, 2), Rand({4, 6, 41}, 3, -5, 5)}, a, 1, {}, 1e-5, train};
    for (Case* c : {&fwd, &bwd}) {
      Check(*c);
      c->ctx.row_offset = 3, c->ctx.rows = 4;  // rows [3, 7) of the batch: counters not a multiple of 4
      Check(*c);
      c->ctx = eval;
      Check(*c);
    }
    CheckBf16({ir::OpKind::kGelu, {RandB({3, 7, 64}, 6, -5, 5)}, a, 1, {}, 1e-5, train}, {kB});
    CheckBf16({ir::OpKind::kGeluGrad, {RandB({3, 7, 64}, 7), RandB({3, 7, 64}, 8, -5, 5)}, a, 1, {}, 1e-5, train},
              {kB});
  }
}

TEST_F(CudaOpsTest, LayerNormWithAFusedResidualAndDropoutIsTheCpus) {
  // S = residual + dropout(X), normalised (op.h): d 96 (16-byte runs), 41 (element by element) and 1024; the Sum
  // output wanted or not; a micro-batch's rows shift the dropout counters; inference and no dropout keep X.
  backend::ExecContext train;
  train.training = true;
  train.seed = 5;
  train.offset = 2;
  const ir::Attrs dropped = Attrs({{"axis", int64_t{-1}},
                                   {"epsilon", 1e-5},
                                   {"dropout", 0.2},
                                   {"rng_key", std::string("/layer/dropout1/Dropout")}});
  const ir::Attrs plain = Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5}});
  for (const int64_t d : {int64_t{96}, int64_t{41}, int64_t{1024}}) {
    SCOPED_TRACE(d);
    const std::vector<Tensor> in = {Rand({4, 6, d}, 1, -2, 2), Rand({d}, 2), Rand({d}, 3), Rand({4, 6, d}, 4, -2, 2)};
    for (const ir::Attrs& a : {dropped, plain}) {
      Case c{ir::OpKind::kLayerNorm, in, a, 4, {}, 1e-5, train};
      Check(c);
      c.ctx.row_offset = 3, c.ctx.rows = 4;  // rows [3, 7) of the batch
      Check(c);
      c.ctx = {};
      Check(c);
      Check({ir::OpKind::kLayerNorm, in, a, 4, {1, 2}, 1e-5, train});  // Y and Sum only
      Check({ir::OpKind::kLayerNorm, in, a, 1, {}, 1e-5, train});      // Y only: S is not stored
    }
    // bf16: S rounds once, as the unfused Add stores it, and Y normalises that rounded S, as the unfused
    // LayerNorm reads it. The reference is the CPU's S (exact in f32) rounded to bf16 and normalised by the
    // same op with X = 0 (its dropout adds nothing).
    const std::vector<Tensor> inb = {RandB({3, 5, d}, 5, -2, 2), RandB({d}, 6), RandB({d}, 7),
                                     RandB({3, 5, d}, 8, -2, 2)};
    const Case bf16{ir::OpKind::kLayerNorm, inb, dropped, 4, {}, 5e-3, train};
    std::vector<Tensor> reference = Widened(inb);
    const std::vector<Tensor> cpu = CpuOutputs(bf16, reference);
    ASSERT_EQ(cpu.size(), 4u);
    reference[3] = cpu[3].CastTo(DType::kBF16).CastTo(DType::kF32);
    reference[0] = Tensor::FromVector<float>(inb[0].dims(), std::vector<float>(inb[0].num_elements(), 0.f));
    CheckBf16(bf16, {kB, kF, kF, kB}, /*expect_device=*/true, reference);
  }
}

TEST_F(CudaOpsTest, Bf16ElementwiseIsTheFp32ResultRounded) {
  for (ir::OpKind op : {ir::OpKind::kAdd, ir::OpKind::kSub, ir::OpKind::kMul, ir::OpKind::kDiv}) {
    CheckBf16({op, {RandB({4, 1, 6}, 1), RandB({3, 1}, 2, 0.5, 2)}, {}, 1, {}, 0}, {kB});
    CheckBf16({op, {RandB({2, 3, 64}, 3), RandB({64}, 4, 0.5, 2)}, {}, 1, {}, 0}, {kB});
  }
  CheckBf16({ir::OpKind::kSum, {RandB({4, 6}, 5), RandB({4, 6}, 6)}, {}, 1, {}, 0}, {kB});
  CheckBf16({ir::OpKind::kSum, {RandB({6}, 7), RandB({4, 6}, 8)}, {}, 1, {}, 0}, {kB});
  // More than two gradients: summed in fp32, rounded once (as the CPU's fp32 sum is).
  CheckBf16(
      {ir::OpKind::kSum, {RandB({4, 6}, 9), RandB({4, 6}, 10), RandB({4, 6}, 11), RandB({4, 6}, 12)}, {}, 1, {}, 0},
      {kB});
  for (ir::OpKind op : {ir::OpKind::kSqrt, ir::OpKind::kLog, ir::OpKind::kReciprocal})
    CheckBf16({op, {RandB({3, 50}, 13, 0.1f, 4)}}, {kB});
  for (ir::OpKind op : {ir::OpKind::kExp, ir::OpKind::kTanh, ir::OpKind::kSigmoid, ir::OpKind::kNeg, ir::OpKind::kRelu,
                        ir::OpKind::kErf, ir::OpKind::kAbs, ir::OpKind::kSin, ir::OpKind::kCos})
    CheckBf16({op, {RandB({3, 50}, 14, -4, 4)}}, {kB});
  CheckBf16({ir::OpKind::kReluGrad, {RandB({3, 50}, 23), RandB({3, 50}, 24)}, {}, 1, {}, 0}, {kB});
  CheckBf16({ir::OpKind::kPow, {RandB({2, 3, 16}, 18, 0.1f, 3), RandB({16}, 19, -2, 2)}}, {kB});
  for (ir::OpKind op : {ir::OpKind::kMin, ir::OpKind::kMax})
    CheckBf16({op, {RandB({4, 1, 6}, 20), RandB({3, 1}, 21)}, {}, 1, {}, 0}, {kB});
  for (ir::OpKind op : {ir::OpKind::kEqual, ir::OpKind::kLess, ir::OpKind::kGreater, ir::OpKind::kGreaterOrEqual,
                        ir::OpKind::kLessOrEqual})
    CheckBf16({op, {B(SmallInts({4, 6})), B(SmallInts({6}))}, {}, 1, {}, 0}, {DType::kBool});
  CheckBf16({ir::OpKind::kWhere, {Bools({4, 1, 6}, 15), RandB({5, 6}, 16), RandB({4, 5, 1}, 17)}, {}, 1, {}, 0}, {kB});
}

TEST_F(CudaOpsTest, Bf16CastsAreTheCpusConversions) {
  const std::vector<float> special = {
      0.f,    -0.f, 1.5f, -1.5f,       2.99f,       -7.9f,    1e20f,
      -1e20f, NAN,  3e9f, 1.00390625f, 1.01171875f, INFINITY, 3.4e38f};  // ties round to even; overflow to inf
  const Tensor f = Tensor::FromVector<float>({14}, special);
  CheckBf16({ir::OpKind::kCast, {f}, Attrs({{"to", std::string("bf16")}}), 1, {}, 0}, {kB});
  CheckBf16({ir::OpKind::kCast, {B(f)}, Attrs({{"to", std::string("f32")}}), 1, {}, 0}, {kF});
  // To integers the fp32 rules (truncate, saturate, NaN -> 0) apply to the widened value.
  for (auto [to, dtype] : {std::pair{"i64", DType::kI64}, {"i32", DType::kI32}, {"bool", DType::kBool}})
    CheckBf16({ir::OpKind::kCast, {B(f)}, Attrs({{"to", std::string(to)}}), 1, {}, 0}, {dtype});
  Check({ir::OpKind::kCast, {B(f)}, Attrs({{"to", std::string("bf16")}}), 1, {}, 0});  // a copy
  Check({ir::OpKind::kCast, {Ints({4}, {-3, 0, 7, int64_t{1} << 40})}, Attrs({{"to", std::string("bf16")}}), 1, {}, 0});
}

TEST_F(CudaOpsTest, Bf16ReductionsAndBroadcasts) {
  const Tensor x = RandB({4, 5, 64}, 1);
  for (ir::OpKind op : {ir::OpKind::kReduceSum, ir::OpKind::kReduceMean}) {
    CheckBf16({op, {x}, Attrs({{"axes", std::vector<int64_t>{1}}})}, {kB});
    CheckBf16({op, {x}, Attrs({{"axes", std::vector<int64_t>{0, -1}}, {"keepdims", int64_t{0}}})}, {kB});
  }
  CheckBf16({ir::OpKind::kReduceToShapeOf, {x, Tensor::DimsOnly(kB, {64})}}, {kB});  // a bias gradient
  CheckBf16({ir::OpKind::kReduceToShapeOf, {x, Tensor::DimsOnly(kB, {5, 1})}}, {kB});
  CheckBf16({ir::OpKind::kExpandLike,
             {RandB({4, 6}, 2), Tensor::DimsOnly(kB, {4, 5, 6})},
             Attrs({{"axes", std::vector<int64_t>{1}}}),
             1,
             {},
             0},
            {kB});
  CheckBf16({ir::OpKind::kExpandLike,
             {RandB({4}, 3), Tensor::DimsOnly(kB, {4, 96})},
             Attrs({{"axes", std::vector<int64_t>{-1}}, {"mean", int64_t{1}}}),
             1,
             {},
             0},
            {kB});
}

TEST_F(CudaOpsTest, Bf16LayoutsAndEmbeddings) {
  const Tensor heads = RandB({2, 8, 16, 64}, 1);
  CheckBf16({ir::OpKind::kTranspose, {heads}, Attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}), 1, {}, 0}, {kB});
  CheckBf16({ir::OpKind::kReshape, {heads, Ints({3}, {0, 0, -1})}, {}, 1, {}, 0, {}, /*host_inputs=*/1u << 1}, {kB});
  CheckBf16({ir::OpKind::kSlice,
             {heads, Ints({1}, {1}), Ints({1}, {63}), Ints({1}, {-1}), Tensor()},
             {},
             1,
             {},
             0,
             {},
             /*host_inputs=*/0b11110u},
            {kB});
  CheckBf16({ir::OpKind::kConcat, {RandB({2, 3, 4}, 4), RandB({2, 5, 4}, 5)}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0},
            {kB});
  CheckBf16({ir::OpKind::kSplit, {RandB({2, 5, 48}, 6)}, Attrs({{"axis", int64_t{-1}}}), 3, {}, 0}, {kB, kB, kB});
  CheckBf16({ir::OpKind::kExpand, {RandB({3, 1}, 7), Ints({3}, {2, 1, 5})}, {}, 1, {}, 0, {}, /*host_inputs=*/1u << 1},
            {kB});
  const Tensor table = RandB({10, 16}, 2);
  const Tensor idx = Ints({3, 4}, {0, 9, -1, 3, 3, 5, 0, 2, 7, 3, -10, 1});
  CheckBf16({ir::OpKind::kGather, {table, idx}, {}, 1, {}, 0}, {kB});
  CheckBf16({ir::OpKind::kGatherGrad, {RandB({3, 4, 16}, 3), idx, Tensor::DimsOnly(kB, {10, 16})}}, {kB});
}

// More than two broadcast bf16 addends would round at every addition on the device: the kernel leaves the
// node to the host (whose CPU kernel then needs bf16 support of its own).
TEST_F(CudaOpsTest, Bf16SumOfManyBroadcastOperandsIsLeftToTheHost) {
  ir::Graph g;
  std::vector<ir::ValueId> ids;
  std::vector<Tensor> dev;
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{6}, {4, 6}, {4, 1}}) {
    ids.push_back(g.AddValue("x" + std::to_string(ids.size()), kB, ir::Shape(dims.begin(), dims.end())));
    absl::StatusOr<Tensor> d = be_->Upload(RandB(dims, static_cast<uint32_t>(ids.size())));
    ASSERT_TRUE(d.ok()) << d.status();
    dev.push_back(*d);
  }
  const ir::NodeId n = g.AddNode(ir::OpKind::kSum, "sum", ids, {g.AddValue("y", kB, {4, 6})});
  const KernelTable table = RegisterAllKernels();
  KernelContext ctx;
  ctx.backend = be_.get();
  EXPECT_FALSE(table.at(ir::OpKind::kSum).run(ctx, g.node(n), dev).has_value());
}

// --- What stays on the host ----------------------------------------------------------------------------

// fp64 graphs, and layouts a kernel does not cover (a softmax over a non-trailing axis), run the
// CPU kernel on the host: counted, and bit for bit the CPU's result.
TEST_F(CudaOpsTest, UncoveredCasesFallBackToTheHost) {
  Case c{ir::OpKind::kMatMul, {Rand({3, 4}, 1).CastTo(DType::kF64), Rand({4, 2}, 2).CastTo(DType::kF64)}};
  c.tol = 0;
  Check(c, /*expect_device=*/false);
  Check({ir::OpKind::kSoftmax, {Rand({2, 5, 3}, 3)}, Attrs({{"axis", int64_t{1}}}), 1, {}, 0}, /*expect_device=*/false);
}

}  // namespace
}  // namespace onnxpipe::cuda
