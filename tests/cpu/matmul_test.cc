// MatMul (numpy semantics), Gemm, Linear and FusedMatMul's KSum output against numpy.
#include "tests/cpu/test_util.h"

namespace onnxpipe::cpu::testing {
namespace {

using ir::DType;
using ir::OpKind;
using ir::Tensor;

TEST(MatMul, MatchesNumpyIncludingVectorsAndBatchBroadcast) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{3, 4}, {4, 5}},       {{4}, {4, 5}},          {{3, 4}, {4}},       {{4}, {4}},
      {{2, 3, 4}, {4, 5}},    {{2, 3, 4}, {2, 4, 5}}, {{1, 3, 4}, {2, 4, 5}}, {{2, 1, 3, 4}, {5, 4, 6}},
      {{2, 3, 4}, {4}},       {{4}, {2, 4, 5}},       {{3, 0}, {0, 5}},    {{2, 3, 4}, {1, 1, 4, 2}},
  };
  for (DType dt : FloatDTypes()) {
    std::map<std::string, Tensor> in;
    std::vector<Tensor> got;
    std::string code;
    for (size_t c = 0; c < shapes.size(); ++c) {
      Tensor a = Rand(dt, shapes[c].first, 30 + c), b = Rand(dt, shapes[c].second, 60 + c);
      const std::string s = std::to_string(c);
      in["a" + s] = a;
      in["b" + s] = b;
      got.push_back(Eval1(MakeNode(OpKind::kMatMul, 2), {a, b}));
      code += "out['" + s + "'] = np.matmul(a['a" + s + "'].astype(np.float64), a['b" + s + "'].astype(np.float64))\n";
    }
    auto ref = Numpy(in, code);
    for (size_t c = 0; c < shapes.size(); ++c) {
      EXPECT_TRUE(AllClose(got[c], ref[std::to_string(c)].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5))
          << c << " " << ir::DTypeName(dt);
    }
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kMatMul, 2), {Rand(DType::kF32, {3, 4}, 1), Rand(DType::kF32, {5, 2}, 2)}).ok());
  EXPECT_FALSE(Eval(MakeNode(OpKind::kMatMul, 2), {Rand(DType::kF32, {2, 3, 4}, 1), Rand(DType::kF32, {3, 4, 2}, 2)}).ok());
  auto ints = Eval(MakeNode(OpKind::kMatMul, 2), {I64({1, 1}, {1}), I64({1, 1}, {1})});
  ASSERT_FALSE(ints.ok());
  EXPECT_NE(ints.status().message().find("MatMul"), std::string::npos);
}

TEST(Gemm, TransposesAlphaBetaAndBroadcastC) {
  for (DType dt : FloatDTypes()) {
    std::map<std::string, Tensor> in;
    std::vector<Tensor> got;
    std::string code;
    int c = 0;
    for (int64_t ta : {0, 1}) {
      for (int64_t tb : {0, 1}) {
        for (const std::vector<int64_t>& cdims : std::vector<std::vector<int64_t>>{{}, {5}, {3, 1}, {3, 5}, {1, 5}}) {
          Tensor a = Rand(dt, ta ? std::vector<int64_t>{4, 3} : std::vector<int64_t>{3, 4}, 100 + c);
          Tensor b = Rand(dt, tb ? std::vector<int64_t>{5, 4} : std::vector<int64_t>{4, 5}, 200 + c);
          Tensor cc = Rand(dt, cdims, 300 + c);
          ir::Attrs attrs;
          attrs.Set("transA", ta);
          attrs.Set("transB", tb);
          attrs.Set("alpha", 0.5);
          attrs.Set("beta", 2.0);
          const std::string s = std::to_string(c);
          in["a" + s] = a;
          in["b" + s] = b;
          in["c" + s] = cc;
          got.push_back(Eval1(MakeNode(OpKind::kGemm, 3, 1, attrs), {a, b, cc}));
          code += "A = a['a" + s + "'].astype(np.float64)\nB = a['b" + s + "'].astype(np.float64)\n";
          code += std::string("out['") + s + "'] = 0.5 * (" + (ta ? "A.T" : "A") + " @ " + (tb ? "B.T" : "B") +
                  ") + 2.0 * a['c" + s + "'].astype(np.float64)\n";
          ++c;
        }
      }
    }
    auto ref = Numpy(in, code);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(AllClose(got[i], ref[std::to_string(i)].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5)) << i;
    }
    // Without C.
    Tensor a = Rand(dt, {2, 3}, 1), b = Rand(dt, {3, 2}, 2);
    auto r2 = Numpy({{"a", a}, {"b", b}}, "out['y'] = a['a'].astype(np.float64) @ a['b'].astype(np.float64)\n");
    EXPECT_TRUE(AllClose(Eval1(MakeNode(OpKind::kGemm, 2), {a, b}), r2["y"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
  }
  EXPECT_FALSE(Eval(MakeNode(OpKind::kGemm, 3), {Rand(DType::kF32, {2, 3}, 1), Rand(DType::kF32, {3, 2}, 2),
                                                  Rand(DType::kF32, {3}, 3)}).ok());
}

TEST(Linear, TransBAndBiasOverLeadingDims) {
  for (DType dt : FloatDTypes()) {
    Tensor x = Rand(dt, {2, 3, 8}, 1), w = Rand(dt, {8, 5}, 2), wt = Rand(dt, {5, 8}, 3), b = Rand(dt, {5}, 4);
    ir::Attrs tb;
    tb.Set("trans_b", int64_t{1});
    Tensor y1 = Eval1(MakeNode(OpKind::kLinear, 3), {x, w, b});
    Tensor y2 = Eval1(MakeNode(OpKind::kLinear, 2, 1, tb), {x, wt});
    Tensor y3 = Eval1(MakeNode(OpKind::kLinear, 2), {Rand(dt, {8}, 5), w});
    auto ref = Numpy({{"x", x}, {"w", w}, {"wt", wt}, {"b", b}, {"v", Rand(dt, {8}, 5)}},
                     "f = lambda k: a[k].astype(np.float64)\n"
                     "out['y1'] = f('x') @ f('w') + f('b')\nout['y2'] = f('x') @ f('wt').T\nout['y3'] = f('v') @ f('w')\n");
    EXPECT_TRUE(AllClose(y1, ref["y1"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_TRUE(AllClose(y2, ref["y2"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_TRUE(AllClose(y3, ref["y3"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_FALSE(Eval(MakeNode(OpKind::kLinear, 2, 1, tb), {x, w}).ok());
    EXPECT_FALSE(Eval(MakeNode(OpKind::kLinear, 3), {x, w, Rand(dt, {4}, 1)}).ok());
  }
}

TEST(FusedMatMul, KSumOutputSumsTheOperandOverK) {
  for (DType dt : FloatDTypes()) {
    // dW = dY^T X (k_sum a: dY's column sums) and dW^T = X^T dY (k_sum b), dY (6, 5), X (6, 4).
    Tensor dy = Rand(dt, {6, 5}, 1), x = Rand(dt, {6, 4}, 2), bt = Rand(dt, {5, 6}, 3);
    auto node = [](std::string of, int64_t ta, int64_t tb) {
      ir::Attrs at;
      at.Set("trans_a", ta);
      at.Set("trans_b", tb);
      at.Set("k_sum", std::move(of));
      return MakeNode(OpKind::kFusedMatMul, 2, 2, at);
    };
    auto a = Eval(node("a", 1, 0), {dy, x});
    auto b = Eval(node("b", 1, 0), {x, dy});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    auto ref = Numpy({{"dy", dy}, {"x", x}},
                     "f = lambda k: a[k].astype(np.float64)\n"
                     "out['w'] = f('dy').T @ f('x')\nout['wt'] = f('x').T @ f('dy')\n"
                     "out['s'] = f('dy').sum(axis=0)\n");
    EXPECT_TRUE(AllClose((*a)[0], ref["w"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_TRUE(AllClose((*a)[1], ref["s"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_TRUE(AllClose((*b)[0], ref["wt"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    EXPECT_TRUE(AllClose((*b)[1], ref["s"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    // Sums of op(A) = A (6, 5) untransposed: its row sums; of op(B) = B^T under trans_b: B's row sums.
    auto d = Eval(node("a", 0, 1), {dy, Rand(dt, {7, 5}, 6)});
    ASSERT_TRUE(d.ok()) << d.status();
    auto ref2 = Numpy({{"dy", dy}, {"bt", bt}},
                      "f = lambda k: a[k].astype(np.float64)\n"
                      "out['s'] = f('dy').sum(axis=1)\nout['t'] = f('bt').sum(axis=1)\n");
    EXPECT_TRUE(AllClose((*d)[1], ref2["s"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    auto e = Eval(node("b", 0, 1), {Rand(dt, {3, 6}, 4), bt});
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(AllClose((*e)[1], ref2["t"].CastTo(dt), RelTol(dt) * 5, RelTol(dt) * 5));
    // Batched operands or a bad k_sum: a clear error naming the output.
    auto batched = Eval(node("a", 1, 0), {Rand(dt, {2, 6, 5}, 5), Rand(dt, {2, 6, 4}, 6)});
    ASSERT_FALSE(batched.ok());
    EXPECT_NE(batched.status().message().find("KSum"), std::string::npos) << batched.status();
    EXPECT_FALSE(Eval(node("c", 1, 0), {dy, x}).ok());
  }
}

}  // namespace
}  // namespace onnxpipe::cpu::testing
