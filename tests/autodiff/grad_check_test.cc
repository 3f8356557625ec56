// Every gradient rule against central finite differences in fp64: each case builds a tiny graph
// op -> loss = sum(y * w) (w fixed random), builds the gradients, evaluates them with the CPU
// backend and compares with (L(p + h) - L(p - h)) / 2h for every element of every parameter.
// The training graph also goes through the verifier and shape inference, which must agree with
// the types the rules computed.
#include <algorithm>
#include <cmath>

#include "frontend/autodiff/autodiff.h"
#include "frontend/ir/precision.h"
#include "frontend/ir/verifier.h"
#include "gtest/gtest.h"
#include "tests/autodiff/test_graph.h"

namespace onnxpipe::autodiff {
namespace {

using ir::OpKind;
using ir::ValueId;
using testing::MakeAttrs;
using testing::TestGraph;
using V = std::vector<ValueId>;

struct GradCase {
  std::string name;
  // Builds the op(s) under test; returns the float outputs that feed the loss.
  std::function<V(TestGraph&)> build;
  double tol = 1e-6;
};

std::ostream& operator<<(std::ostream& os, const GradCase& c) { return os << c.name; }

ir::Attrs Axes(std::vector<int64_t> axes, int64_t keepdims) {
  return MakeAttrs({{"axes", axes}, {"keepdims", keepdims}});
}

std::vector<GradCase> ElementwiseCases() {
  auto unary = [](OpKind op, double lo, double hi, bool away) {
    return [=](TestGraph& t) {
      ValueId x = away ? t.ParamAway("x", {3, 4}, lo, hi) : t.Param("x", {3, 4}, lo, hi);
      return V{t.Op1(op, {x})};
    };
  };
  return {
      {"Add_same", [](TestGraph& t) { return V{t.Op1(OpKind::kAdd, {t.Param("a", {3, 4}), t.Param("b", {3, 4})})}; }},
      {"Add_bcast_row", [](TestGraph& t) { return V{t.Op1(OpKind::kAdd, {t.Param("a", {2, 3, 4}), t.Param("b", {4})})}; }},
      {"Add_bcast_both", [](TestGraph& t) { return V{t.Op1(OpKind::kAdd, {t.Param("a", {3, 1}), t.Param("b", {1, 4})})}; }},
      {"Add_const_operand", [](TestGraph& t) { return V{t.Op1(OpKind::kAdd, {t.ConstF("c", {3, 4}), t.Param("b", {4})})}; }},
      {"Sub_bcast", [](TestGraph& t) { return V{t.Op1(OpKind::kSub, {t.Param("a", {3, 4}), t.Param("b", {3, 1})})}; }},
      {"Mul_bcast", [](TestGraph& t) { return V{t.Op1(OpKind::kMul, {t.Param("a", {2, 3, 4}), t.Param("b", {3, 1})})}; }},
      {"Mul_square", [](TestGraph& t) { ValueId a = t.Param("a", {3, 4}); return V{t.Op1(OpKind::kMul, {a, a})}; }},
      {"Div_bcast", [](TestGraph& t) { return V{t.Op1(OpKind::kDiv, {t.Param("a", {3, 4}), t.ParamAway("b", {4}, 0.5, 2)})}; }},
      {"Div_scalar_param", [](TestGraph& t) { return V{t.Op1(OpKind::kDiv, {t.ParamAway("a", {}, 0.5, 2), t.ParamAway("b", {2, 3}, 0.5, 2)})}; }},
      {"Mod_fmod_bcast", [](TestGraph& t) {
         ir::Attrs fmod;
         fmod.Set("fmod", int64_t{1});
         return V{t.Op1(OpKind::kMod, {t.ParamAway("a", {3, 4}, 0.5, 3), t.ParamAway("b", {4}, 0.3, 0.7)}, fmod)}; }},
      {"Pow_const_exponent", [](TestGraph& t) {
         return V{t.Op1(OpKind::kPow, {t.Param("a", {3, 4}, 0.5, 2), t.g().AddConstant("e", ir::Tensor::Scalar<double>(2.5))})}; }},
      {"Pow_both", [](TestGraph& t) { return V{t.Op1(OpKind::kPow, {t.Param("a", {3, 4}, 0.5, 2), t.Param("e", {4}, -1, 2)})}; }},
      {"Sqrt", unary(OpKind::kSqrt, 0.5, 2, false)},
      {"Reciprocal", unary(OpKind::kReciprocal, 0.5, 2, true)},
      {"Neg", unary(OpKind::kNeg, -1, 1, false)},
      {"Exp", unary(OpKind::kExp, -1, 1, false)},
      {"Log", unary(OpKind::kLog, 0.5, 2, false)},
      {"Erf", unary(OpKind::kErf, -1.5, 1.5, false)},
      {"Tanh", unary(OpKind::kTanh, -2, 2, false)},
      {"Relu", unary(OpKind::kRelu, 0.1, 1, true)},
      {"Sigmoid", unary(OpKind::kSigmoid, -3, 3, false)},
      {"Sin", unary(OpKind::kSin, -3, 3, false)},
      {"Cos", unary(OpKind::kCos, -3, 3, false)},
      {"Abs", unary(OpKind::kAbs, 0.1, 1, true)},
      {"Min_bcast", [](TestGraph& t) { return V{t.Op1(OpKind::kMin, {t.Param("a", {3, 4}), t.Param("b", {4})})}; }},
      {"Max_bcast", [](TestGraph& t) { return V{t.Op1(OpKind::kMax, {t.Param("a", {3, 1}), t.Param("b", {1, 4})})}; }},
      {"Sum_variadic_bcast", [](TestGraph& t) {
         return V{t.Op1(OpKind::kSum, {t.Param("a", {3, 4}), t.Param("b", {4}), t.Param("c", {3, 1})})}; }},
  };
}

std::vector<GradCase> MatMulCases() {
  auto mm = [](std::vector<int64_t> a, std::vector<int64_t> b) {
    return [=](TestGraph& t) { return V{t.Op1(OpKind::kMatMul, {t.Param("a", a), t.Param("b", b)})}; };
  };
  auto gemm = [](std::vector<int64_t> a, std::vector<int64_t> b, std::vector<int64_t> c, ir::Attrs attrs) {
    return [=](TestGraph& t) {
      V ins = {t.Param("a", a), t.Param("b", b)};
      if (!c.empty()) ins.push_back(t.Param("c", c));
      return V{t.Op1(OpKind::kGemm, ins, attrs)};
    };
  };
  auto linear = [](std::vector<int64_t> x, std::vector<int64_t> w, bool bias, int64_t tb) {
    return [=](TestGraph& t) {
      V ins = {t.Param("x", x), t.Param("w", w)};
      if (bias) ins.push_back(t.Param("bias", {tb ? w[0] : w[1]}));
      return V{t.Op1(OpKind::kLinear, ins, MakeAttrs({{"trans_b", tb}}))};
    };
  };
  auto fused = [](std::vector<int64_t> a, std::vector<int64_t> b, int64_t ta, int64_t tb, double alpha) {
    return [=](TestGraph& t) {
      return V{t.Op1(OpKind::kFusedMatMul, {t.Param("a", a), t.Param("b", b)},
                     MakeAttrs({{"trans_a", ta}, {"trans_b", tb}, {"alpha", alpha}}))};
    };
  };
  return {
      {"MatMul_2d", mm({3, 4}, {4, 5})},
      {"MatMul_batched_weight", mm({2, 3, 4}, {4, 5})},
      {"MatMul_batched_both", mm({2, 3, 4}, {2, 4, 5})},
      {"MatMul_bcast_batch", mm({2, 1, 3, 4}, {3, 4, 5})},
      {"MatMul_matrix_times_batched", mm({3, 4}, {2, 4, 5})},
      {"MatMul_vec_mat", mm({4}, {2, 4, 5})},
      {"MatMul_mat_vec", mm({2, 3, 4}, {4})},
      {"MatMul_vec_vec", mm({4}, {4})},
      {"Gemm_bias_row", gemm({3, 4}, {4, 5}, {5}, {})},
      {"Gemm_transA_transB_alpha_beta", gemm({4, 3}, {5, 4}, {3, 5},
                                             MakeAttrs({{"transA", int64_t{1}}, {"transB", int64_t{1}},
                                                        {"alpha", 0.7}, {"beta", 1.3}}))},
      {"Gemm_transB_col_bias", gemm({3, 4}, {5, 4}, {3, 1}, MakeAttrs({{"transB", int64_t{1}}}))},
      {"Gemm_transA_no_C", gemm({4, 3}, {4, 5}, {}, MakeAttrs({{"transA", int64_t{1}}}))},
      {"Gemm_transB_row_C_beta", gemm({3, 4}, {5, 4}, {1, 5}, MakeAttrs({{"transB", int64_t{1}}, {"beta", 0.5}}))},
      {"Linear_rank3_bias", linear({2, 3, 4}, {4, 5}, true, 0)},
      {"Linear_transB", linear({3, 4}, {5, 4}, false, 1)},
      {"Linear_rank1_transB_bias", linear({4}, {5, 4}, true, 1)},
      {"Linear_rank3_transB_bias", linear({2, 3, 4}, {5, 4}, true, 1)},
      {"FusedMatMul_tt_alpha", fused({2, 4, 3}, {5, 4}, 1, 1, 0.5)},
      {"FusedMatMul_ta_batched_b", fused({4, 3}, {2, 4, 5}, 1, 0, 1.0)},
      {"FusedMatMul_tb_batched", fused({2, 3, 4}, {2, 5, 4}, 0, 1, 2.0)},
  };
}

std::vector<GradCase> ShapeCases() {
  return {
      {"Transpose_perm", [](TestGraph& t) {
         return V{t.Op1(OpKind::kTranspose, {t.Param("x", {2, 3, 4})}, MakeAttrs({{"perm", std::vector<int64_t>{2, 0, 1}}}))}; }},
      {"Transpose_default", [](TestGraph& t) { return V{t.Op1(OpKind::kTranspose, {t.Param("x", {2, 3, 4})})}; }},
      {"Reshape", [](TestGraph& t) {
         return V{t.Op1(OpKind::kReshape, {t.Param("x", {2, 3, 4}), t.ConstI("s", {2}, {6, -1})})}; }},
      {"Flatten_axis2", [](TestGraph& t) {
         return V{t.Op1(OpKind::kFlatten, {t.Param("x", {2, 3, 4})}, MakeAttrs({{"axis", int64_t{2}}}))}; }},
      {"Squeeze", [](TestGraph& t) {
         return V{t.Op1(OpKind::kSqueeze, {t.Param("x", {3, 1, 4})}, MakeAttrs({{"axes", std::vector<int64_t>{1}}}))}; }},
      {"Unsqueeze", [](TestGraph& t) {
         return V{t.Op1(OpKind::kUnsqueeze, {t.Param("x", {3, 4})}, MakeAttrs({{"axes", std::vector<int64_t>{0, 3}}}))}; }},
      {"Concat_axis1_with_constant", [](TestGraph& t) {
         return V{t.Op1(OpKind::kConcat, {t.Param("a", {2, 3}), t.ConstF("c", {2, 2}), t.Param("b", {2, 4})},
                        MakeAttrs({{"axis", int64_t{1}}}))}; }},
      {"Concat_same_input_twice", [](TestGraph& t) {
         ValueId a = t.Param("a", {2, 3});
         return V{t.Op1(OpKind::kConcat, {a, a}, MakeAttrs({{"axis", int64_t{0}}}))}; }},
      {"Split_one_output_unused", [](TestGraph& t) {
         V outs = t.Op(OpKind::kSplit, {t.Param("x", {2, 6})}, 3,
                       MakeAttrs({{"axis", int64_t{1}}, {"split", std::vector<int64_t>{2, 1, 3}}}));
         return V{outs[0], outs[2]}; }},
      {"Slice_steps_axes", [](TestGraph& t) {
         return V{t.Op1(OpKind::kSlice, {t.Param("x", {4, 6}), t.ConstI("st", {2}, {1, 0}), t.ConstI("en", {2}, {3, 6}),
                                          t.ConstI("ax", {2}, {0, 1}), t.ConstI("sp", {2}, {1, 2})})}; }},
      {"Slice_negative_step", [](TestGraph& t) {
         return V{t.Op1(OpKind::kSlice, {t.Param("x", {3, 7}), t.ConstI("st", {1}, {-1}), t.ConstI("en", {1}, {-100}),
                                          t.ConstI("ax", {1}, {1}), t.ConstI("sp", {1}, {-2})})}; }},
      {"Expand", [](TestGraph& t) {
         return V{t.Op1(OpKind::kExpand, {t.Param("x", {3, 1}), t.ConstI("s", {3}, {2, 3, 4})})}; }},
      {"Identity", [](TestGraph& t) { return V{t.Op1(OpKind::kIdentity, {t.Param("x", {3, 4})})}; }},
      {"Cast_f64_to_f64", [](TestGraph& t) {
         return V{t.Op1(OpKind::kCast, {t.Param("x", {3, 4})}, MakeAttrs({{"to", std::string("f64")}}))}; }},
      {"Where_bcast", [](TestGraph& t) {
         ValueId c = t.ConstB("c", {3, 4}, {true, false, true, true, false, false, true, false, true, true, false, true});
         return V{t.Op1(OpKind::kWhere, {c, t.Param("x", {3, 4}), t.Param("y", {4})})}; }},
      {"Trilu_lower_k", [](TestGraph& t) {
         return V{t.Op1(OpKind::kTrilu, {t.Param("x", {4, 5}), t.g().AddConstant("k", ir::Tensor::Scalar<int64_t>(1))},
                        MakeAttrs({{"upper", int64_t{0}}}))}; }},
      {"Trilu_upper", [](TestGraph& t) { return V{t.Op1(OpKind::kTrilu, {t.Param("x", {2, 4, 4})})}; }},
      {"GatherElements_repeated_negative", [](TestGraph& t) {
         ValueId idx = t.g().AddConstant("i", ir::Tensor::FromVector<int64_t>({2, 4}, {0, -1, 2, 0, 1, 1, -3, 2}));
         return V{t.Op1(OpKind::kGatherElements, {t.Param("x", {3, 4}), idx}, MakeAttrs({{"axis", int64_t{0}}}))}; }},
      {"GatherND_pairs_repeated", [](TestGraph& t) {
         ValueId idx = t.g().AddConstant("i", ir::Tensor::FromVector<int64_t>({3, 2}, {0, 1, 2, -1, 0, 1}));
         return V{t.Op1(OpKind::kGatherND, {t.Param("x", {3, 4, 2}), idx})}; }},
      {"GatherND_batch_dims1", [](TestGraph& t) {
         ValueId idx = t.g().AddConstant("i", ir::Tensor::FromVector<int64_t>({2, 3, 1}, {3, 0, 3, 1, 2, -4}));
         return V{t.Op1(OpKind::kGatherND, {t.Param("x", {2, 4, 3}), idx}, MakeAttrs({{"batch_dims", int64_t{1}}}))}; }},
      {"CumSum_axis1", [](TestGraph& t) {
         return V{t.Op1(OpKind::kCumSum, {t.Param("x", {3, 5, 2})}, MakeAttrs({{"axis", int64_t{1}}}))}; }},
      {"CumSum_exclusive_reverse", [](TestGraph& t) {
         return V{t.Op1(OpKind::kCumSum, {t.Param("x", {4, 3})},
                        MakeAttrs({{"axis", int64_t{-2}}, {"exclusive", int64_t{1}}, {"reverse", int64_t{1}}}))}; }},
      {"CumSum_exclusive", [](TestGraph& t) {
         return V{t.Op1(OpKind::kCumSum, {t.Param("x", {2, 6})},
                        MakeAttrs({{"axis", int64_t{1}}, {"exclusive", int64_t{1}}}))}; }},
  };
}

std::vector<GradCase> ReduceNormCases() {
  auto reduce = [](OpKind op, std::vector<int64_t> dims, ir::Attrs attrs) {
    return [=](TestGraph& t) { return V{t.Op1(op, {t.Param("x", dims, -2, 2)}, attrs)}; };
  };
  auto layer_norm = [](std::vector<int64_t> x, std::vector<int64_t> s, bool bias, int64_t axis, int nout) {
    return [=](TestGraph& t) {
      V ins = {t.Param("x", x, -2, 2), t.Param("scale", s, 0.5, 1.5)};
      if (bias) ins.push_back(t.Param("bias", s));
      return V{t.Op(OpKind::kLayerNorm, ins, nout, MakeAttrs({{"axis", axis}, {"epsilon", 1e-5}}))[0]};
    };
  };
  auto rms_norm = [](std::vector<int64_t> x, std::vector<int64_t> s, int64_t axis, int nout) {
    return [=](TestGraph& t) {
      V ins = {t.Param("x", x, -2, 2), t.Param("scale", s, 0.5, 1.5)};
      return V{t.Op(OpKind::kRMSNorm, ins, nout, MakeAttrs({{"axis", axis}, {"epsilon", 1e-5}}))[0]};
    };
  };
  return {
      {"ReduceSum_axis1_keepdims", reduce(OpKind::kReduceSum, {2, 3, 4}, Axes({1}, 1))},
      {"ReduceSum_axes02", reduce(OpKind::kReduceSum, {2, 3, 4}, Axes({0, 2}, 0))},
      {"ReduceSum_all", reduce(OpKind::kReduceSum, {2, 3, 4}, MakeAttrs({{"keepdims", int64_t{0}}}))},
      {"ReduceMean_last", reduce(OpKind::kReduceMean, {2, 3, 4}, Axes({-1}, 0))},
      {"ReduceMean_all_keepdims", reduce(OpKind::kReduceMean, {2, 3, 4}, MakeAttrs({{"keepdims", int64_t{1}}}))},
      {"ReduceMax_axis1", reduce(OpKind::kReduceMax, {2, 5, 3}, Axes({1}, 0))},
      {"ReduceMax_keepdims", reduce(OpKind::kReduceMax, {4, 5}, Axes({-1}, 1))},
      {"Softmax_last", reduce(OpKind::kSoftmax, {3, 5}, {})},
      {"Softmax_axis1", reduce(OpKind::kSoftmax, {2, 4, 3}, MakeAttrs({{"axis", int64_t{1}}}))},
      {"LogSoftmax_last", reduce(OpKind::kLogSoftmax, {3, 5}, {})},
      {"LogSoftmax_axis0", reduce(OpKind::kLogSoftmax, {4, 3}, MakeAttrs({{"axis", int64_t{0}}}))},
      {"LayerNorm_bias", layer_norm({2, 3, 5}, {5}, true, -1, 1)},
      {"LayerNorm_no_bias", layer_norm({4, 6}, {6}, false, -1, 1)},
      {"LayerNorm_axis_minus2", layer_norm({2, 3, 4}, {3, 4}, true, -2, 1)},
      {"LayerNorm_saved_stats", layer_norm({3, 5}, {5}, true, 1, 3)},
      {"RMSNorm_last", rms_norm({2, 3, 5}, {5}, -1, 1)},
      {"RMSNorm_axis_minus2", rms_norm({2, 3, 4}, {3, 4}, -2, 1)},
      {"RMSNorm_broadcast_scale", rms_norm({3, 4}, {1}, -1, 1)},
      {"RMSNorm_saved_inv_std", rms_norm({3, 5}, {5}, 1, 2)},
      // Only the scale needs a gradient (the input is a frozen embedding): no dX.
      {"RMSNorm_frozen_input", [](TestGraph& t) {
         return V{t.Op1(OpKind::kRMSNorm, {t.ConstF("x", {3, 5}, -2, 2), t.Param("scale", {5}, 0.5, 1.5)})}; }},
      {"LayerNorm_frozen_input", [](TestGraph& t) {
         return V{t.Op1(OpKind::kLayerNorm, {t.ConstF("x", {3, 5}, -2, 2), t.Param("scale", {5}, 0.5, 1.5),
                                             t.Param("bias", {5})})}; }},
      // Rotary: x trained, the tables constants (no gradient): RotaryGrad against finite differences.
      {"Rotary_rotate_half_partial", [](TestGraph& t) {
         return V{t.Op1(OpKind::kRotary, {t.Param("x", {2, 3, 4, 10}, -2, 2), t.ConstF("cos", {2, 1, 4, 6}, -1, 1),
                                          t.ConstF("sin", {2, 1, 4, 6}, -1, 1)},
                        MakeAttrs({{"rotary_dim", int64_t{6}}}))}; }},
      {"Rotary_interleaved_gptj_layout", [](TestGraph& t) {
         return V{t.Op1(OpKind::kRotary, {t.Param("x", {2, 4, 3, 8}, -2, 2), t.ConstF("cos", {2, 4, 1, 4}, -1, 1),
                                          t.ConstF("sin", {2, 4, 1, 4}, -1, 1)},
                        MakeAttrs({{"rotary_dim", int64_t{4}}, {"interleaved", int64_t{1}}}))}; }},
      {"Gelu_erf", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGelu, {t.Param("x", {3, 4}, -3, 3)}, MakeAttrs({{"approximate", std::string("none")}}))}; }},
      {"Gelu_tanh", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGelu, {t.Param("x", {3, 4}, -3, 3)}, MakeAttrs({{"approximate", std::string("tanh")}}))}; }},
      {"Gelu_fused_dropout", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGelu, {t.Param("x", {4, 8}, -3, 3)},
                        MakeAttrs({{"approximate", std::string("none")}, {"dropout", 0.3},
                                   {"rng_key", std::string("mlp_dropout")}}))}; }},
      // GatedActivation: act(gate) * up, both trained; GatedActivationGrad's dGate and dUp in one node.
      {"GatedActivation_silu", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGatedActivation, {t.Param("gate", {2, 3, 4}, -4, 4), t.Param("up", {2, 3, 4}, -2, 2)},
                        MakeAttrs({{"activation", std::string("silu")}}))}; }},
      {"GatedActivation_gelu_erf", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGatedActivation, {t.Param("gate", {3, 5}, -3, 3), t.Param("up", {3, 5}, -2, 2)},
                        MakeAttrs({{"activation", std::string("gelu")}, {"approximate", std::string("none")}}))}; }},
      {"GatedActivation_gelu_tanh", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGatedActivation, {t.Param("gate", {3, 5}, -3, 3), t.Param("up", {3, 5}, -2, 2)},
                        MakeAttrs({{"activation", std::string("gelu")}, {"approximate", std::string("tanh")}}))}; }},
      // One value as gate and up (silu(x) * x): the two contributions add up.
      {"GatedActivation_silu_gate_is_up", [](TestGraph& t) {
         const ValueId x = t.Param("x", {3, 4}, -3, 3);
         return V{t.Op1(OpKind::kGatedActivation, {x, x}, MakeAttrs({{"activation", std::string("silu")}}))}; }},
      // Only up trained: the backward node has dUp alone (dGate absent).
      {"GatedActivation_frozen_gate", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGatedActivation, {t.ConstF("gate", {3, 4}, -3, 3), t.Param("up", {3, 4}, -2, 2)},
                        MakeAttrs({{"activation", std::string("gelu")}, {"approximate", std::string("tanh")}}))}; }},
      {"GatedActivation_frozen_up", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGatedActivation, {t.Param("gate", {3, 4}, -3, 3), t.ConstF("up", {3, 4}, -2, 2)},
                        MakeAttrs({{"activation", std::string("silu")}}))}; }},
  };
}

std::vector<GradCase> AttentionCases() {
  auto attn = [](std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v, ir::Attrs attrs,
                 std::function<ValueId(TestGraph&)> mask) {
    return [=](TestGraph& t) {
      V ins = {t.Param("q", q), t.Param("k", k), t.Param("v", v)};
      if (mask) ins.push_back(mask(t));
      return V{t.Op1(OpKind::kAttention, ins, attrs)};
    };
  };
  return {
      {"Attention_plain", attn({2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, MakeAttrs({{"scale", 0.5}}), nullptr)},
      {"Attention_causal", attn({2, 4, 4}, {2, 4, 4}, {2, 4, 3}, MakeAttrs({{"causal", int64_t{1}}}), nullptr)},
      {"Attention_additive_mask", attn({2, 3, 4}, {2, 5, 4}, {2, 5, 2}, MakeAttrs({}),
                                       [](TestGraph& t) { return t.ConstF("mask", {3, 5}, -2, 0); })},
      {"Attention_bool_mask_bcast_kv", attn({2, 2, 3, 4}, {2, 1, 5, 4}, {2, 1, 5, 3},
                                            MakeAttrs({{"mask_kind", std::string("bool")}}),
                                            [](TestGraph& t) {
                                              return t.ConstB("mask", {2, 1, 1, 5},
                                                              {true, true, false, true, true, false, true, true, true, false});
                                            })},
      // A learned additive bias (T5's relative positions): dMask, full and broadcast over the batch/queries.
      {"Attention_learned_bias", attn({2, 3, 4}, {2, 5, 4}, {2, 5, 2}, MakeAttrs({}),
                                      [](TestGraph& t) { return t.Param("bias", {2, 3, 5}, -1, 1); })},
      {"Attention_learned_bias_bcast", attn({2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, MakeAttrs({{"causal", int64_t{1}}}),
                                            [](TestGraph& t) { return t.Param("bias", {2, 1, 5}, -1, 1); })},
      {"Attention_learned_bias_dropout", attn({2, 4, 4}, {2, 6, 4}, {2, 6, 3}, MakeAttrs({{"dropout", 0.3}}),
                                              [](TestGraph& t) { return t.Param("bias", {4, 6}, -1, 1); })},
      {"Attention_dropout", attn({2, 4, 4}, {2, 6, 4}, {2, 6, 3}, MakeAttrs({{"dropout", 0.3}}), nullptr)},
      // Grouped-query attention: 6 query heads over 2 K/V heads (query head h reads K/V head h / 3).
      {"Attention_grouped_kv", attn({2, 6, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, MakeAttrs({{"causal", int64_t{1}}}),
                                    nullptr)},
      {"Attention_grouped_kv_mask_dropout", attn({1, 4, 4, 4}, {1, 2, 6, 4}, {1, 2, 6, 2},
                                                 MakeAttrs({{"dropout", 0.2}}),
                                                 [](TestGraph& t) { return t.Param("bias", {4, 4, 6}, -1, 1); })},
      {"Attention_dropout_causal", attn({2, 5, 4}, {2, 5, 4}, {2, 5, 4},
                                        MakeAttrs({{"dropout", 0.2}, {"causal", int64_t{1}}}), nullptr)},
  };
}

std::vector<GradCase> GatherDropoutLossCases() {
  auto sce = [](std::vector<int64_t> scores, std::vector<int64_t> label_dims, std::vector<int64_t> labels,
                ir::Attrs attrs, bool weights, bool use_log_prob) {
    return [=](TestGraph& t) {
      V ins = {t.Param("scores", scores, -2, 2), t.ConstI("labels", label_dims, labels)};
      if (weights) ins.push_back(t.ConstF("class_w", {scores[1]}, 0.5, 2));
      V outs = t.Op(OpKind::kSoftmaxCrossEntropyLoss, ins, use_log_prob ? 2 : 1, attrs);
      return use_log_prob ? outs : V{outs[0]};
    };
  };
  return {
      {"Gather_axis0_repeated", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGather, {t.Param("table", {6, 4}), t.ConstI("idx", {2, 2}, {1, 3, 1, 5})})}; }},
      {"Gather_axis1_negative", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGather, {t.Param("x", {3, 5}), t.ConstI("idx", {3}, {4, -1, 0})},
                        MakeAttrs({{"axis", int64_t{1}}}))}; }},
      {"Gather_scalar_index", [](TestGraph& t) {
         return V{t.Op1(OpKind::kGather, {t.Param("x", {3, 5}), t.g().AddConstant("i", ir::Tensor::Scalar<int64_t>(2))})}; }},
      {"Dropout", [](TestGraph& t) {
         return V{t.Op1(OpKind::kDropout, {t.Param("x", {4, 8})}, MakeAttrs({{"ratio", 0.3}}))}; }},
      {"SCE_mean_ignore", sce({4, 5}, {4}, {1, -100, 3, 0},
                              MakeAttrs({{"reduction", std::string("mean")}, {"ignore_index", int64_t{-100}}}), false, false)},
      {"SCE_mean_weights", sce({4, 5}, {4}, {1, 2, 3, 0}, MakeAttrs({{"reduction", std::string("mean")}}), true, false)},
      {"SCE_sum_spatial", sce({2, 4, 3}, {2, 3}, {0, 3, 1, 2, 2, 0}, MakeAttrs({{"reduction", std::string("sum")}}), false, false)},
      {"SCE_none_weights_ignore", sce({3, 4}, {3}, {2, 1, 0},
                                      MakeAttrs({{"reduction", std::string("none")}, {"ignore_index", int64_t{1}}}), true, false)},
      {"SCE_loss_and_log_prob", sce({3, 4}, {3}, {2, 1, 0}, MakeAttrs({{"reduction", std::string("mean")}}), false, true)},
      {"SCE_label_smoothing", sce({4, 5}, {4}, {1, -100, 3, 0},
                                  MakeAttrs({{"reduction", std::string("mean")}, {"ignore_index", int64_t{-100}},
                                             {"label_smoothing", 0.1}}), false, false)},
      {"SCE_label_smoothing_weights", sce({4, 5}, {4}, {1, 2, 3, 0},
                                          MakeAttrs({{"reduction", std::string("mean")}, {"label_smoothing", 0.2}}),
                                          true, false)},
  };
}

class GradCheckTest : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheckTest, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  TestGraph t;
  V ys = c.build(t);
  absl::StatusOr<ValueId> loss = t.AddWeightedSumLoss(ys);
  ASSERT_TRUE(loss.ok()) << loss.status();
  const ir::Graph forward = t.g();
  absl::StatusOr<TrainingGraphInfo> info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_FALSE(info->param_grads.empty());
  EXPECT_TRUE(info->unreachable_params.empty());
  absl::Status verified = ir::Verify(t.g());
  ASSERT_TRUE(verified.ok()) << verified;
  // Shape inference over the backward nodes must agree with what the rules declared.
  absl::Status inferred = ir::InferShapes(t.g());
  ASSERT_TRUE(inferred.ok()) << inferred;
  for (ir::NodeId id : t.g().LiveNodes()) {
    const ir::Node& n = t.g().node(id);
    if (n.phase != ir::Phase::kBackward) continue;
    EXPECT_FALSE(n.origin.empty()) << n.name;
  }

  absl::StatusOr<std::vector<ir::Tensor>> out = testing::Run(t.g());
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t k = 0; k < info->param_grads.size(); ++k) {
    const ParamGrad& pg = info->param_grads[k];
    const std::string& pname = t.g().value(pg.param).name;
    EXPECT_EQ(t.g().value(pg.grad).name, "grad/" + pname);
    const ir::Tensor& analytic = (*out)[1 + k];
    ASSERT_EQ(analytic.dims(), t.g().value(pg.param).constant->dims()) << pname;
    absl::StatusOr<std::vector<double>> numeric = testing::NumericGradient(forward, pg.param, 1e-6);
    ASSERT_TRUE(numeric.ok()) << numeric.status();
    double max_err = 0;
    for (int64_t i = 0; i < analytic.num_elements(); ++i) {
      const double a = analytic.data<double>()[i], n = (*numeric)[i];
      const double err = std::abs(a - n) / std::max(1.0, std::abs(n));
      max_err = std::max(max_err, err);
      EXPECT_LE(err, c.tol) << c.name << ": d loss / d " << pname << "[" << i << "] analytic " << a
                            << " numeric " << n;
    }
    RecordProperty("max_rel_err_" + pname, std::to_string(max_err));
  }
}

// The same training graph computed in fp32 (every kernel's f32 instantiation) agrees with fp64.
TEST_P(GradCheckTest, Float32MatchesFloat64) {
  const GradCase& c = GetParam();
  TestGraph t;
  V ys = c.build(t);
  absl::StatusOr<ValueId> loss = t.AddWeightedSumLoss(ys);
  ASSERT_TRUE(loss.ok()) << loss.status();
  absl::StatusOr<TrainingGraphInfo> info = BuildGradients(&t.g(), *loss, {});
  ASSERT_TRUE(info.ok()) << info.status();
  ir::Graph f32 = t.g();
  ASSERT_TRUE(ir::ConvertFloatPrecision(f32, ir::DType::kF64, ir::DType::kF32).ok());
  auto ref = testing::Run(t.g());
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto got = testing::Run(f32);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(ref->size(), got->size());
  for (size_t k = 0; k < ref->size(); ++k) {
    ASSERT_EQ((*got)[k].dtype(), ir::DType::kF32);
    const ir::Tensor g64 = (*got)[k].CastTo(ir::DType::kF64);
    double scale = 1;
    for (int64_t i = 0; i < g64.num_elements(); ++i) scale = std::max(scale, std::abs((*ref)[k].data<double>()[i]));
    for (int64_t i = 0; i < g64.num_elements(); ++i) {
      EXPECT_NEAR(g64.data<double>()[i], (*ref)[k].data<double>()[i], 2e-5 * scale)
          << c.name << " output " << t.g().value(t.g().outputs()[k]).name << "[" << i << "]";
    }
  }
}

std::vector<GradCase> AllCases() {
  std::vector<GradCase> all;
  for (auto family : {ElementwiseCases, MatMulCases, ShapeCases, ReduceNormCases, AttentionCases,
                      GatherDropoutLossCases}) {
    for (GradCase& c : family()) all.push_back(std::move(c));
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Rules, GradCheckTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

}  // namespace
}  // namespace onnxpipe::autodiff
