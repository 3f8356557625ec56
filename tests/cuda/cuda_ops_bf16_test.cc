// The bf16 graphs' nodes on the CUDA backend (cuda_ops_fixture.h's CheckBf16): the CPU's fp32 kernel on the
// widened inputs, its outputs rounded to bf16, is the reference. Skips without a GPU.
#include "tests/cuda/cuda_ops_fixture.h"

namespace onnxpipe::cuda::ops_test {
namespace {

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
  // dXDropped: dX as stored (bf16) through the forward's dropout; the reference drops the fp32 dX (within an ulp).
  backend::ExecContext train;
  train.training = true, train.seed = 5, train.offset = 2;
  CheckBf16({ir::OpKind::kLayerNormGrad,
             {dy, x, scale, (*ln_fwd)[1], (*ln_fwd)[2], dres},
             Attrs({{"dropout", 0.1}, {"rng_key", std::string("/layer/dropout1/Dropout")}}),
             4,
             {},
             1e-5,
             train},
            {kB, kB, kB, kB});
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

// A learned bias's gradient (dMask) in bf16, with dropout: within a bf16 unit of the CPU's fp32 result; dQ, dK,
// dV (the tensor-core kernels, whose P and dS are bf16 operands) within a normalised 1e-2, as the flash tests.
TEST_F(CudaOpsTest, Bf16AttentionGradOfALearnedBias) {
  backend::ExecContext train;
  train.training = true, train.seed = 5, train.offset = 2;
  const Case c{ir::OpKind::kAttentionGrad,
               {RandB({3, 2, 9, 64}, 11), RandB({3, 2, 9, 64}, 12), RandB({3, 2, 40, 64}, 13),
                RandB({3, 2, 40, 64}, 14), RandB({1, 2, 9, 40}, 15, -2, 2)},
               Attrs({{"dropout", 0.25}, {"rng_key", std::string("/block/attn/Attention")}}),
               4,
               {},
               1e-5,
               train};
  Compare(c, Widened(c.inputs), /*expect_device=*/true, [](size_t k, const Tensor& got, const Tensor& want) {
    ASSERT_EQ(got.dtype(), kB);
    const std::vector<float> g = Floats(got), w = Floats(want.CastTo(kB));
    if (k == 3) {
      EXPECT_TRUE(testing::Bf16Close(g, w));
      return;
    }
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(g[i]) - w[i]));
      max_ref = std::max(max_ref, std::abs(static_cast<double>(w[i])));
    }
    EXPECT_LE(max_err, 1e-2 * max_ref) << "output " << k;
  });
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
    // The keep bits (output 1, d 40): the forward's are the CPU's (a micro-batch's rows, inference's all kept),
    // and the backward reading them computes the CPU's.
    for (const backend::ExecContext& ctx : {train, eval}) {
      Case bits_fwd{ir::OpKind::kGelu, {Rand({4, 6, 40}, 4, -5, 5)}, a, 2, {}, 1e-5, ctx};
      bits_fwd.ctx.row_offset = 3, bits_fwd.ctx.rows = 4;
      Check(bits_fwd);
      const Tensor bits = CpuOutputs(bits_fwd, bits_fwd.inputs)[1];
      ASSERT_EQ(bits.dims(), (std::vector<int64_t>{4, 6, 5}));
      Case bits_bwd{ir::OpKind::kGeluGrad, {Rand({4, 6, 40}, 5), bits_fwd.inputs[0], bits}, a, 1, {}, 1e-5, ctx};
      bits_bwd.ctx = bits_fwd.ctx;
      Check(bits_bwd);
    }
    const Case bf16_fwd{ir::OpKind::kGelu, {RandB({3, 8, 64}, 9, -5, 5)}, a, 2, {}, 1e-5, train};
    CheckBf16(bf16_fwd, {kB, DType::kU8});
    const Tensor bf16_bits = CpuOutputs(bf16_fwd, Widened(bf16_fwd.inputs))[1];
    CheckBf16({ir::OpKind::kGeluGrad, {RandB({3, 8, 64}, 10), bf16_fwd.inputs[0], bf16_bits}, a, 1, {}, 1e-5, train},
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

}  // namespace
}  // namespace onnxpipe::cuda::ops_test
