// Softmax / LogSoftmax along any axis, LayerNorm (Y, Mean, InvStdDev) and RMSNorm (Y, InvStdDev)
// against numpy.
#include <cmath>

#include "frontend/ir/infer.h"
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

TEST(Softmax, BothFormsOnEveryAxis) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {3, 4, 5}, 40, -10, 10);
    std::vector<Tensor> got;
    std::string code = "x = a['x'].astype(np.float64)\n";
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      ir::Attrs attrs;
      attrs.Set("axis", axis);
      got.push_back(Eval1(MakeNode(OpKind::kSoftmax, 1, 1, attrs), {x}));
      got.push_back(Eval1(MakeNode(OpKind::kLogSoftmax, 1, 1, attrs), {x}));
      const std::string ax = std::to_string(axis);
      code += "m = x.max(axis=" + ax + ", keepdims=True)\ne = np.exp(x - m)\ns = e.sum(axis=" + ax + ", keepdims=True)\n";
      code += "out['s" + ax + "'] = e / s\nout['l" + ax + "'] = x - m - np.log(s)\n";
    }
    auto ref = Numpy({{"x", x}}, code);
    int i = 0;
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      const std::string ax = std::to_string(axis);
      EXPECT_TRUE(AllClose(got[i++], ref["s" + ax].CastTo(dt), RelTol(dt), 1e-7)) << "softmax axis " << axis;
      EXPECT_TRUE(AllClose(got[i++], ref["l" + ax].CastTo(dt), RelTol(dt), 1e-6)) << "logsoftmax axis " << axis;
    }
    // Default axis is -1.
    EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kSoftmax, 1), {x}), ref["s-1"].CastTo(dt), RelTol(dt), 1e-7));
  }
}

TEST(Softmax, LargeLogitsStayFinite) {
  Tensor x = Tensor::FromVector<float>({1, 3}, {1000.f, 1001.f, -1000.f});
  Tensor s = Eval1(MakeNode(OpKind::kSoftmax, 1), {x});
  Tensor l = Eval1(MakeNode(OpKind::kLogSoftmax, 1), {x});
  const double z = 1 + std::exp(1.0);
  EXPECT_NEAR(s.data<float>()[0], 1 / z, 1e-6);
  EXPECT_NEAR(s.data<float>()[1], std::exp(1.0) / z, 1e-6);
  EXPECT_EQ(s.data<float>()[2], 0.f);
  EXPECT_NEAR(l.data<float>()[0], -std::log(z), 1e-5);
  EXPECT_NEAR(l.data<float>()[2], -2001 - std::log(z) + 1, 1e-2);
}

TEST(LayerNorm, OutputsMatchTheOnnxReference) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {2, 3, 4, 5}, 50, -3, 3);
    for (int64_t axis : {-1, 1, 2, 0}) {
      const int64_t a = axis < 0 ? axis + 4 : axis;
      std::vector<int64_t> norm(x.dims().begin() + a, x.dims().end());
      Tensor scale = Rand(dt, norm, 51), bias = Rand(dt, norm, 52);
      ir::Attrs attrs;
      attrs.Set("axis", axis);
      attrs.Set("epsilon", 1e-3);
      auto r = Eval(MakeNode(OpKind::kLayerNorm, 3, 3, attrs), {x, scale, bias});
      ASSERT_TRUE(r.ok()) << r.status();
      auto ref = Numpy({{"x", x}, {"s", scale}, {"b", bias}},
                       "x = a['x'].astype(np.float64)\naxes = tuple(range(" + std::to_string(a) + ", 4))\n"
                       "m = x.mean(axis=axes, keepdims=True)\nv = ((x - m) ** 2).mean(axis=axes, keepdims=True)\n"
                       "inv = 1 / np.sqrt(v + 1e-3)\n"
                       "out['y'] = (x - m) * inv * a['s'].astype(np.float64) + a['b'].astype(np.float64)\n"
                       "out['m'] = m\nout['i'] = inv\n");
      EXPECT_TRUE(AllClose((*r)[0], ref["y"].CastTo(dt), RelTol(dt), 1e-5)) << axis;
      EXPECT_TRUE(AllClose((*r)[1], ref["m"].CastTo(dt), RelTol(dt), 1e-6)) << axis;
      EXPECT_TRUE(AllClose((*r)[2], ref["i"].CastTo(dt), RelTol(dt), 1e-6)) << axis;
    }
  }
}

TEST(LayerNorm, NoBiasOneOutputAndBadScale) {
  Tensor x = Rand(DType::kF64, {4, 6}, 53);
  Tensor scale = Rand(DType::kF64, {6}, 54);
  Tensor y = Eval1(MakeNode(OpKind::kLayerNorm, 2), {x, scale});
  // Row 0 by hand.
  double m = 0, v = 0;
  for (int i = 0; i < 6; ++i) m += x.data<double>()[i] / 6;
  for (int i = 0; i < 6; ++i) v += (x.data<double>()[i] - m) * (x.data<double>()[i] - m) / 6;
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(y.data<double>()[i], (x.data<double>()[i] - m) / std::sqrt(v + 1e-5) * scale.data<double>()[i], 1e-12);
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kLayerNorm, 2), {x, Rand(DType::kF64, {5}, 1)}).ok());
  // A scale that broadcasts to the normalised shape is accepted.
  EXPECT_TRUE(Eval(MakeNode(OpKind::kLayerNorm, 2), {x, Rand(DType::kF64, {1}, 1)}).ok());
}

TEST(RMSNorm, OutputsMatchNumpy) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {2, 3, 4, 5}, 60, -3, 3);
    for (int64_t axis : {-1, 2, 0}) {
      const int64_t a = axis < 0 ? axis + 4 : axis;
      std::vector<int64_t> norm(x.dims().begin() + a, x.dims().end());
      Tensor scale = Rand(dt, norm, 61);
      ir::Attrs attrs;
      attrs.Set("axis", axis);
      attrs.Set("epsilon", 1e-3);
      auto r = Eval(MakeNode(OpKind::kRMSNorm, 2, 2, attrs), {x, scale});
      ASSERT_TRUE(r.ok()) << r.status();
      auto ref = Numpy({{"x", x}, {"s", scale}},
                       "x = a['x'].astype(np.float64)\naxes = tuple(range(" + std::to_string(a) + ", 4))\n"
                       "inv = 1 / np.sqrt((x * x).mean(axis=axes, keepdims=True) + 1e-3)\n"
                       "out['y'] = x * inv * a['s'].astype(np.float64)\nout['i'] = inv\n");
      EXPECT_TRUE(AllClose((*r)[0], ref["y"].CastTo(dt), RelTol(dt), 1e-5)) << axis;
      EXPECT_TRUE(AllClose((*r)[1], ref["i"].CastTo(dt), RelTol(dt), 1e-6)) << axis;
    }
  }
}

TEST(RMSNorm, ByHandBroadcastScaleAndBadScale) {
  // x = (3, 4): mean of squares 12.5, so y = x / sqrt(12.5 + eps) * scale.
  Tensor x = Tensor::FromVector<double>({1, 2}, {3.0, 4.0});
  Tensor scale = Tensor::FromVector<double>({2}, {2.0, -1.0});
  ir::Attrs attrs;
  attrs.Set("epsilon", 0.5);
  Tensor y = Eval1(MakeNode(OpKind::kRMSNorm, 2, 1, attrs), {x, scale});
  EXPECT_NEAR(y.data<double>()[0], 3.0 / std::sqrt(13.0) * 2.0, 1e-15);
  EXPECT_NEAR(y.data<double>()[1], -4.0 / std::sqrt(13.0), 1e-15);
  Tensor x2 = Rand(DType::kF64, {4, 6}, 62);
  EXPECT_TRUE(Eval(MakeNode(OpKind::kRMSNorm, 2), {x2, Rand(DType::kF64, {1}, 1)}).ok());  // broadcasts
  auto bad = Eval(MakeNode(OpKind::kRMSNorm, 2), {x2, Rand(DType::kF64, {5}, 1)});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("scale"), std::string::npos) << bad.status();
}

// LayerNormGrad's dresidual is the Add after it, each rounded: bit for bit LayerNormGrad then Add
// (f32 and f64), and it must be X's dtype and shape.
TEST(LayerNormGrad, DresidualIsTheAddAfterIt) {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  attrs.Set("epsilon", 1e-5);
  for (DType t : {DType::kF32, DType::kF64}) {
    const Tensor dy = Rand(t, {3, 5, 8}, 70), x = Rand(t, {3, 5, 8}, 71), scale = Rand(t, {8}, 72);
    const Tensor dres = Rand(t, {3, 5, 8}, 73);
    absl::StatusOr<std::vector<Tensor>> plain = Eval(MakeNode(OpKind::kLayerNormGrad, 3, 3, attrs), {dy, x, scale});
    ASSERT_TRUE(plain.ok()) << plain.status();
    const Tensor want = Eval1(MakeNode(OpKind::kAdd, 2), {(*plain)[0], dres});
    absl::StatusOr<std::vector<Tensor>> fused =
        Eval(MakeNode(OpKind::kLayerNormGrad, 6, 3, attrs), {dy, x, scale, Tensor(), Tensor(), dres});
    ASSERT_TRUE(fused.ok()) << fused.status();
    EXPECT_TRUE((*fused)[0].BitwiseEquals(want)) << ir::DTypeName(t);
    EXPECT_TRUE((*fused)[1].BitwiseEquals((*plain)[1])) << "dScale";
    EXPECT_TRUE((*fused)[2].BitwiseEquals((*plain)[2])) << "dBias";
    auto bad = Eval(MakeNode(OpKind::kLayerNormGrad, 6, 3, attrs),
                    {dy, x, scale, Tensor(), Tensor(), Rand(t, {3, 8}, 74)});
    EXPECT_FALSE(bad.ok());
  }
}

// LayerNormGrad's dXDropped (output 3) is DropoutGrad of its dX (output 0) by the forward's stream (the
// node's dropout and rng_key), bit for bit in f32 and f64, with dresidual, a whole batch and a
// micro-batch's rows, training and inference (dX itself then); bf16 computes through f32 and rounds
// once; it needs the dropout attribute.
TEST(LayerNormGrad, DroppedDxIsDropoutGradOfDx) {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  attrs.Set("epsilon", 1e-5);
  attrs.Set("dropout", 0.3);
  attrs.Set("rng_key", std::string("/layer/dropout1/Dropout"));
  ir::Attrs drop;
  drop.Set("ratio", 0.3);
  drop.Set("rng_key", std::string("/layer/dropout1/Dropout"));
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16}) {
    const Tensor dy = Rand(t, {4, 5, 24}, 80), x = Rand(t, {4, 5, 24}, 81), scale = Rand(t, {24}, 82);
    const Tensor dres = Rand(t, {4, 5, 24}, 83);
    for (const EvalContext& ctx : {EvalContext{true, 7, 3}, EvalContext{true, 7, 3, 2, 8}, EvalContext{false, 7, 3}}) {
      absl::StatusOr<std::vector<Tensor>> got =
          Eval(MakeNode(OpKind::kLayerNormGrad, 6, 4, attrs), {dy, x, scale, Tensor(), Tensor(), dres}, ctx);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), 4u);
      Tensor want = Eval1(MakeNode(OpKind::kDropoutGrad, 1, 1, drop, "grad"), {(*got)[0]}, ctx);
      if (t == DType::kBF16) {
        const std::vector<Tensor> wide = {dy.CastTo(DType::kF32), x.CastTo(DType::kF32), scale.CastTo(DType::kF32),
                                          Tensor(), Tensor(), dres.CastTo(DType::kF32)};
        absl::StatusOr<std::vector<Tensor>> f32 = Eval(MakeNode(OpKind::kLayerNormGrad, 6, 4, attrs), wide, ctx);
        ASSERT_TRUE(f32.ok()) << f32.status();
        want = (*f32)[3].CastTo(DType::kBF16);
      }
      EXPECT_TRUE((*got)[3].BitwiseEquals(want)) << ir::DTypeName(t) << " training " << ctx.training;
      if (!ctx.training) {
        EXPECT_TRUE((*got)[3].BitwiseEquals((*got)[0]));
        continue;
      }
      int64_t zeros = 0;
      for (int64_t i = 0; i < want.num_elements(); ++i) zeros += want.GetAsDouble(i) == 0.0;
      EXPECT_GT(zeros, want.num_elements() / 8) << "about 30 % dropped";
    }
  }
  ir::Attrs plain = attrs;
  plain.Set("dropout", 0.0);
  ir::Graph g;
  const ir::ValueId v = g.AddValue("x", DType::kF32, {2, 8});
  const ir::ValueId s = g.AddValue("s", DType::kF32, {8});
  std::vector<ir::ValueId> outs;
  for (int k = 0; k < 4; ++k) outs.push_back(g.AddValue("o" + std::to_string(k), DType::kF32, {}, false));
  g.AddNode(OpKind::kLayerNormGrad, "lng", {v, v, s}, outs, plain);
  const absl::Status inferred = ir::InferShapes(g);
  EXPECT_FALSE(inferred.ok());
  EXPECT_NE(std::string(inferred.message()).find("needs a nonzero attribute dropout"), std::string::npos) << inferred;
}

// A norm gradient's dY2 is the Sum before it: bit for bit Sum(dY, dY2) then LayerNormGrad (with
// dresidual) or RMSNormGrad in f32 and f64; in bf16 (computed through f32 here) the fused sum skips
// the Sum's rounding to bf16, so within bf16's precision. dY2 must have dY's shape.
TEST(NormGrad, Dy2IsTheSumBeforeIt) {
  ir::Attrs attrs;
  attrs.Set("axis", int64_t{-1});
  attrs.Set("epsilon", 1e-5);
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16})
  for (OpKind op : {OpKind::kLayerNormGrad, OpKind::kRMSNormGrad}) {
    SCOPED_TRACE(std::string(ir::DTypeName(t)) + " " + std::string(ir::OpName(op)));
    const Tensor dy = Rand(t, {3, 5, 8}, 80), dy2 = Rand(t, {3, 5, 8}, 81);
    const Tensor x = Rand(t, {3, 5, 8}, 82), scale = Rand(t, {8}, 83), dres = Rand(t, {3, 5, 8}, 84);
    const Tensor sum = Eval1(MakeNode(OpKind::kSum, 2), {dy, dy2});
    const bool ln = op == OpKind::kLayerNormGrad;
    const int outs = ln ? 3 : 2, fused_ins = ir::NormGradDy2Input(op) + 1;
    std::vector<Tensor> plain_in = {sum, x, scale, Tensor()};
    if (ln) plain_in.insert(plain_in.end(), {Tensor(), dres});
    std::vector<Tensor> fused_in = plain_in;
    fused_in[0] = dy;
    fused_in.push_back(dy2);
    absl::StatusOr<std::vector<Tensor>> want = Eval(MakeNode(op, fused_ins - 1, outs, attrs), plain_in);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::vector<Tensor>> fused = Eval(MakeNode(op, fused_ins, outs, attrs), fused_in);
    ASSERT_TRUE(fused.ok()) << fused.status();
    for (int k = 0; k < outs; ++k) {
      if (t == DType::kBF16) {
        EXPECT_TRUE(AllClose((*fused)[k], (*want)[k], 2e-2, 2e-2)) << "output " << k;
      } else {
        EXPECT_TRUE((*fused)[k].BitwiseEquals((*want)[k])) << ir::DTypeName(t) << " output " << k;
      }
    }
    fused_in.back() = Rand(t, {3, 8}, 85);
    auto bad = Eval(MakeNode(op, fused_ins, outs, attrs), fused_in);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(std::string(bad.status().message()).find("dY2"), std::string::npos) << bad.status();
  }
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
