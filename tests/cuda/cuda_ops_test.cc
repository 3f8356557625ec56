// Every op the CUDA backend registers, run through CudaBackend::Run and through the CPU backend on
// the same inputs (cuda_ops_fixture.h): the results agree (fp32 within a normalised error of 1e-5 -- max |gpu - cpu|
// over max |cpu| -- or bit for bit where the kernels round exactly as the CPU does: copies, views,
// gathers, dropout masks, casts), and the op did not fall back to the host. Each case runs twice:
// unplanned (fresh outputs, temporary scratch) and planned (an allocator whose workspace is exactly
// what CudaBackend::WorkspaceBytes reported for the node, so an under-reported workspace fails).
// The bf16 graphs' cases are cuda_ops_bf16_test.cc. Skips without a GPU.
#include "tests/cuda/cuda_ops_fixture.h"

namespace onnxpipe::cuda::ops_test {
namespace {

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
  // dXDropped (output 3): dX through the forward's dropout, the CPU's mask; a micro-batch's rows; inference.
  backend::ExecContext train;
  train.training = true, train.seed = 11, train.offset = 3;
  Case dropped{ir::OpKind::kLayerNormGrad,
               {dy, x, scale, (*fwd)[1], (*fwd)[2], dres},
               Attrs({{"dropout", 0.1}, {"rng_key", std::string("/layer/dropout1/Dropout")}}),
               4,
               {},
               1e-5,
               train};
  Check(dropped);
  dropped.ctx.row_offset = 4, dropped.ctx.rows = 4;
  dropped.inputs = {dy, x, scale, Tensor(), Tensor(), Tensor(), dy2};
  Check(dropped);
  dropped.ctx = backend::ExecContext{};
  Check(dropped);
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
  // A fused residual (op.h): S = residual + X normalised, with and without the Sum output (d 96 and 41: 16-byte
  // runs and element by element), and the gradient's dresidual added to dX, with and without dY2.
  for (const int64_t d : {int64_t{96}, int64_t{41}}) {
    SCOPED_TRACE(d);
    const std::vector<Tensor> in = {Rand({4, 7, d}, 9, -2, 2), Rand({d}, 10), Rand({4, 7, d}, 11, -2, 2)};
    Check({ir::OpKind::kRMSNorm, in, {}, 3});
    Check({ir::OpKind::kRMSNorm, in, {}, 3, {1}});  // Y and Sum
    Check({ir::OpKind::kRMSNorm, in, {}, 1});       // Y only: S is not stored
    const Tensor dyd = Rand({4, 7, d}, 12), dres = Rand({4, 7, d}, 13);
    Check({ir::OpKind::kRMSNormGrad, {dyd, in[0], in[1], Tensor(), Tensor(), dres}, {}, 2});
    Check({ir::OpKind::kRMSNormGrad, {dyd, in[0], in[1], Tensor(), Rand({4, 7, d}, 14), dres}, {}, 2});
  }
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

// A learned additive bias (T5's) wants AttentionGrad's dMask: the device computes it with dQ, dK and dV, the
// CPU's within fp32 rounding (its sum over the dims the bias broadcasts is in another order): a bias per batch
// matrix, one shared over the batch (T5's (1, H, Sq, Sk)) under a causal mask, with the forward's dropout (a
// micro-batch's rows shift its counters); bf16 in cuda_ops_bf16_test.
TEST_F(CudaOpsTest, AttentionGradOfALearnedBiasRunsOnTheDevice) {
  const Tensor q = Rand({2, 3, 8}, 1), k = Rand({2, 5, 8}, 2), v = Rand({2, 5, 4}, 3);
  Check({ir::OpKind::kAttentionGrad, {Rand({2, 3, 4}, 5), q, k, v, Rand({2, 3, 5}, 4)}, Attrs({{"scale", 0.5}}), 4});
  const Tensor q4 = Rand({3, 2, 9, 16}, 6), k4 = Rand({3, 2, 40, 16}, 7), v4 = Rand({3, 2, 40, 8}, 8);
  const Tensor d_o = Rand({3, 2, 9, 8}, 9), bias = Rand({1, 2, 9, 40}, 10, -2, 2);
  backend::ExecContext train;
  train.training = true, train.seed = 5, train.offset = 2, train.row_offset = 1, train.rows = 3;
  for (const backend::ExecContext& ctx : {backend::ExecContext{}, train}) {
    const ir::Attrs a =
        Attrs({{"causal", int64_t{1}}, {"dropout", 0.25}, {"rng_key", std::string("/block/attn/Attention")}});
    Check({ir::OpKind::kAttentionGrad, {d_o, q4, k4, v4, bias}, a, 4, {}, 1e-5, ctx});
  }
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
// such a group runs node by node, with the same results. With `extras` the nodes also output their gradient's sum
// of squares (within double rounding of the CPU's: the GPU adds its partial sums in another order) and their bf16
// compute copy (op.h: UpdateSumSquaresOutput, UpdateComputeCopyOutput).
void CheckUpdateGroup(const std::shared_ptr<CudaBackend>& be, ir::OpKind op, int outputs,
                      const std::vector<std::vector<Tensor>>& inputs, std::vector<ir::Attrs> attrs,
                      uint32_t host_inputs, bool extras = false) {
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
    if (extras) {
      out_ids.resize(ir::UpdateSumSquaresOutput(op), ir::kNoValue);
      out_ids.push_back(g.AddValue("sum" + std::to_string(n), DType::kF64, {}, false));
      out_ids.push_back(g.AddValue("copy" + std::to_string(n), DType::kBF16, {}, false));
      attrs[n].Set("copy_to", std::string("bf16"));
    }
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
      ASSERT_EQ((*got)[n][k].defined(), (*want)[k].defined()) << "node " << n << " output " << k;
      if (!(*want)[k].defined()) continue;
      absl::StatusOr<Tensor> h = be->ToHost((*got)[n][k]);
      ASSERT_TRUE(h.ok()) << h.status();
      if (static_cast<int>(k) == ir::UpdateSumSquaresOutput(op)) {
        const double w = (*want)[k].data<double>()[0];
        EXPECT_NEAR(h->data<double>()[0], w, 1e-12 * w) << ir::OpName(op) << " node " << n << " sum of squares";
        continue;
      }
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
  {
    SCOPED_TRACE("SGD forming the sums of squares and writing the bf16 copies, momentum absent");
    CheckUpdateGroup(be_, ir::OpKind::kSGDUpdate, 1, sgd, std::vector<ir::Attrs>(n), 1u << 2, /*extras=*/true);
  }
  {
    SCOPED_TRACE("AdamW forming the sums of squares and writing the bf16 copies");
    for (auto& in : adam) in.pop_back();  // no clipping scale: the norm comes after the updates
    CheckUpdateGroup(be_, ir::OpKind::kAdamWUpdate, 3, adam, std::vector<ir::Attrs>(n, adamw), 0, /*extras=*/true);
  }
}

TEST_F(CudaOpsTest, GradientNormAndClipScale) {
  Check({ir::OpKind::kSumSquares, {Rand({100, 37}, 1), Rand({5}, 2), Rand({70000}, 3)}});
  for (float norm : {0.5f, 3.f, NAN}) {
    Check({ir::OpKind::kClipScale, {Tensor::FromVector<float>({}, {norm})}, Attrs({{"max_norm", 1.0}})});
  }
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
}  // namespace onnxpipe::cuda::ops_test
