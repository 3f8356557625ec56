#include "tests/passes/test_patterns.h"

namespace onnxpipe::passes::testing::patterns {

// The opset < 17 export of nn.LayerNorm(16, eps=1e-5) on a (B, S, 16) input.
LayerNormGraph BuildDecomposedLayerNorm(GraphBuilder& b, const LayerNormVariant& v) {
  const Dim B = Dim::Symbol("B"), S = Dim::Symbol("S");
  const ir::Shape full = {B, S, Dim(16)}, reduced = {B, S, Dim(1)};
  const ir::Attrs axes = MakeAttrs({{"axes", std::vector<int64_t>{v.axis}}});
  LayerNormGraph out;
  out.x = b.Input("x", full);
  ValueId m = b.Op(OpKind::kReduceMean, {out.x}, reduced, axes);
  ValueId d = b.Op(OpKind::kSub, {out.x, m}, full);
  if (v.extra_mean_use) b.Output(m);
  const ir::Attrs to_f32 = MakeAttrs({{"to", std::string("f32")}});
  ValueId d_sq = v.casts ? b.Op(OpKind::kCast, {d}, full, to_f32) : d;
  ValueId p = v.square_as_mul ? b.Op(OpKind::kMul, {d_sq, d_sq}, full)
                              : b.Op(OpKind::kPow, {d_sq, b.Scalar(static_cast<float>(v.pow_exponent))}, full);
  if (v.casts) p = b.Op(OpKind::kCast, {p}, full, to_f32);
  ValueId var = b.Op(OpKind::kReduceMean, {p}, reduced, axes);
  ValueId eps = b.Scalar(1e-5f);
  ValueId e = b.Op(OpKind::kAdd, v.swap_operands ? std::vector<ValueId>{eps, var} : std::vector<ValueId>{var, eps},
                   reduced);
  ValueId s = b.Op(OpKind::kSqrt, {e}, reduced);
  ValueId n = v.reciprocal ? b.Op(OpKind::kMul, {d, b.Op(OpKind::kReciprocal, {s}, reduced)}, full)
                           : b.Op(OpKind::kDiv, {d, s}, full);
  out.scale = b.Param("ln.weight", {16});
  ValueId y = b.Op(OpKind::kMul, v.swap_operands ? std::vector<ValueId>{out.scale, n} : std::vector<ValueId>{n, out.scale},
                   full);
  out.bias = ir::kNoValue;
  if (v.bias) {
    out.bias = b.Param("ln.bias", {16});
    y = b.Op(OpKind::kAdd, v.swap_operands ? std::vector<ValueId>{out.bias, y} : std::vector<ValueId>{y, out.bias},
             full);
  }
  out.y = b.Op(OpKind::kRelu, {y}, full);  // a consumer, so the LayerNorm output is internal
  b.Output(out.y);
  return out;
}


RMSNormGraph BuildDecomposedRMSNorm(GraphBuilder& b, const RMSNormVariant& v) {
  const Dim B = Dim::Symbol("B"), S = v.two_axes ? Dim(4) : Dim::Symbol("S");
  const ir::Shape full = {B, S, Dim(16)};
  const ir::Shape reduced = v.two_axes ? ir::Shape{B, Dim(1), Dim(1)}
                                       : v.middle_axis ? ir::Shape{B, Dim(1), Dim(16)} : ir::Shape{B, S, Dim(1)};
  const std::vector<int64_t> axes = v.two_axes ? std::vector<int64_t>{-2, -1} : std::vector<int64_t>{v.middle_axis ? 1 : -1};
  RMSNormGraph out;
  out.x = b.Input("x", full);
  const ir::Attrs to_f32 = MakeAttrs({{"to", std::string("f32")}});
  const ValueId xf = v.casts ? b.Op(OpKind::kCast, {out.x}, full, to_f32) : out.x;
  const ValueId xs = v.other_square ? b.Op(OpKind::kNeg, {xf}, full) : xf;
  const ValueId p = v.square_as_mul ? b.Op(OpKind::kMul, {xs, xs}, full) : b.Op(OpKind::kPow, {xs, b.Scalar(2.0f)}, full);
  const ValueId ms = b.Op(OpKind::kReduceMean, {p}, reduced, MakeAttrs({{"axes", axes}}));
  if (v.extra_mean_use) b.Output(ms);
  const ValueId eps = v.eps_parameter ? b.Param("eps", {}) : b.Scalar(1e-6f);
  const ValueId s = b.Op(OpKind::kAdd, {ms, eps}, reduced);
  ValueId n = ir::kNoValue;
  switch (v.rsqrt) {
    case RMSNormVariant::kReciprocalSqrt:
      n = b.Op(OpKind::kMul, {xf, b.Op(OpKind::kReciprocal, {b.Op(OpKind::kSqrt, {s}, reduced)}, reduced)}, full);
      break;
    case RMSNormVariant::kDivOneBySqrt:
      n = b.Op(OpKind::kMul, {b.Op(OpKind::kDiv, {b.Scalar(1.0f), b.Op(OpKind::kSqrt, {s}, reduced)}, reduced), xf}, full);
      break;
    case RMSNormVariant::kPowMinusHalf:
      n = b.Op(OpKind::kMul, {xf, b.Op(OpKind::kPow, {s, b.Scalar(-0.5f)}, reduced)}, full);
      break;
    case RMSNormVariant::kDivBySqrt:
      n = b.Op(OpKind::kDiv, {xf, b.Op(OpKind::kSqrt, {s}, reduced)}, full);
      break;
  }
  if (v.casts) n = b.Op(OpKind::kCast, {n}, full, to_f32);
  out.weight = v.two_axes ? b.Param("norm.weight", {4, 16}) : b.Param("norm.weight", {16});
  const ValueId y = b.Op(OpKind::kMul, v.weight_first ? std::vector<ValueId>{out.weight, n} : std::vector<ValueId>{n, out.weight},
                         full);
  out.y = b.Op(OpKind::kRelu, {y}, full);
  b.Output(out.y);
  return out;
}

RotaryGraph BuildRotary(GraphBuilder& b, const RotaryVariant& v) {
  const int64_t w = v.width, r = v.rotary_dim, h = r / 2;
  const Dim B(2), H(2), S(8);
  auto shape = [&](int64_t last) {
    return v.gptj_layout ? ir::Shape{B, S, H, Dim(last)} : ir::Shape{B, H, S, Dim(last)};
  };
  const ir::Shape tables = v.gptj_layout ? ir::Shape{B, S, Dim(1), Dim(r)} : ir::Shape{B, Dim(1), S, Dim(r)};
  const int64_t end = std::numeric_limits<int64_t>::max();
  auto slice = [&](ValueId in, int64_t start, int64_t stop, int64_t step, int64_t axis, const ir::Shape& out) {
    std::vector<ValueId> args = {in, b.IntVec({start}), b.IntVec({stop}), b.IntVec({axis})};
    if (step != 1) args.push_back(b.IntVec({step}));
    return b.Op(OpKind::kSlice, args, out);
  };
  RotaryGraph out;
  const ValueId xin = b.Input("xin", shape(w));
  out.x = b.Op(OpKind::kMul, {xin, b.Param("w", {w})}, shape(w));
  out.cos = v.table_parameter ? b.Param("cos", ir::ToInts(tables)) : b.Input("cos", tables);
  out.sin = b.Input("sin", tables);
  const ValueId xr = r == w ? out.x : slice(out.x, 0, r, 1, -1, shape(r));
  ValueId rot;
  if (v.interleaved) {
    ir::Shape pair = shape(h);
    const ValueId odd = slice(xr, v.same_half_twice ? 0 : 1, v.end_as_width ? r : end, 2, -1, pair);
    const ValueId even = slice(xr, 0, v.end_as_width ? r : end, 2, -1, pair);
    pair.push_back(Dim(1));
    const ir::Attrs last = MakeAttrs({{"axes", std::vector<int64_t>{-1}}});
    const ValueId u0 =
        b.Op(OpKind::kUnsqueeze, {v.neg_first_half ? odd : b.Op(OpKind::kNeg, {odd}, shape(h))}, pair, last);
    const ValueId u1 =
        b.Op(OpKind::kUnsqueeze, {v.neg_first_half ? b.Op(OpKind::kNeg, {even}, shape(h)) : even}, pair, last);
    ir::Shape pairs = shape(h);
    pairs.push_back(Dim(2));
    const ValueId stacked = b.Op(OpKind::kConcat, {u0, u1}, pairs, MakeAttrs({{"axis", int64_t{-1}}}));
    rot = b.Op(OpKind::kReshape, {stacked, b.IntVec(ir::ToInts(shape(r)))}, shape(r));
  } else {
    const int64_t axis = v.seq_axis ? -2 : -1;
    ir::Shape half = shape(r);
    if (v.seq_axis) {
      half[half.size() - 2] = Dim(half[half.size() - 2].value() / 2);
    } else {
      half.back() = Dim(h);
    }
    const int64_t extent = v.seq_axis ? 8 : r, mid = extent / 2;
    const ValueId x1 = slice(xr, 0, mid, 1, axis, half);
    const ValueId x2 = slice(xr, v.same_half_twice ? 0 : mid, v.same_half_twice ? mid : (v.end_as_width ? extent : end),
                             1, axis, half);
    const ValueId first = v.neg_first_half ? b.Op(OpKind::kNeg, {x1}, half) : b.Op(OpKind::kNeg, {x2}, half);
    const ValueId second = v.neg_first_half ? x2 : x1;
    rot = b.Op(OpKind::kConcat, {first, second}, shape(r), MakeAttrs({{"axis", axis}}));
  }
  const ValueId other = v.other_x ? b.Op(OpKind::kRelu, {xr}, shape(r)) : xr;
  const ValueId xc =
      b.Op(OpKind::kMul, v.swap_muls ? std::vector<ValueId>{out.cos, other} : std::vector<ValueId>{other, out.cos},
           shape(r));
  const ValueId rs = b.Op(
      OpKind::kMul, v.swap_muls ? std::vector<ValueId>{out.sin, rot} : std::vector<ValueId>{rot, out.sin}, shape(r));
  out.y = b.Op(OpKind::kAdd, v.swap_add ? std::vector<ValueId>{rs, xc} : std::vector<ValueId>{xc, rs}, shape(r));
  if (r < w) {
    const ValueId pass = slice(out.x, r, v.end_as_width ? w : end, 1, -1, shape(w - r));
    out.y = b.Op(OpKind::kConcat, v.pass_first ? std::vector<ValueId>{pass, out.y} : std::vector<ValueId>{out.y, pass},
                 shape(w), MakeAttrs({{"axis", int64_t{-1}}}));
  }
  b.Output(out.y);
  return out;
}

GatedMlpGraph BuildGatedMlp(GraphBuilder& b, const GatedMlpVariant& v) {
  const Dim B = v.symbolic ? Dim::Symbol("B") : Dim(2), S = v.symbolic ? Dim::Symbol("S") : Dim(3);
  const ir::Shape in = {B, S, Dim(8)}, hidden = {B, S, Dim(16)};
  GatedMlpGraph out;
  const ValueId x = b.Input("x", in);
  out.gate = b.Op(OpKind::kMatMul, {x, b.Param("gate_proj", {8, 16})}, hidden);
  out.up = v.up_is_gate     ? out.gate
           : v.broadcast_up ? b.Op(OpKind::kMatMul, {x, b.Param("up_proj", {8, 1})}, {B, S, Dim(1)})
                            : b.Op(OpKind::kMatMul, {x, b.Param("up_proj", {8, 16})}, hidden);
  ValueId act;
  if (v.act == GatedMlpVariant::kSilu) {
    const ValueId s = v.tanh_not_sigmoid ? b.Op(OpKind::kTanh, {out.gate}, hidden)
                                         : b.Op(OpKind::kSigmoid, {v.sigmoid_of_other ? out.up : out.gate}, hidden);
    if (v.sigmoid_used) b.Output(s);
    act = b.Op(OpKind::kMul, v.sigmoid_first ? std::vector<ValueId>{s, out.gate} : std::vector<ValueId>{out.gate, s},
               hidden);
  } else {
    ir::Attrs a = MakeAttrs({{"approximate", std::string(v.act == GatedMlpVariant::kGeluTanh ? "tanh" : "none")}});
    if (v.gelu_dropout) {
      a.Set("dropout", 0.1);
      a.Set("rng_key", std::string("mlp/dropout"));
    }
    act = b.Op(OpKind::kGelu, {out.gate}, hidden, a);
  }
  if (v.act_used) b.Output(act);
  out.h =
      b.Op(OpKind::kMul, v.up_first ? std::vector<ValueId>{out.up, act} : std::vector<ValueId>{act, out.up}, hidden);
  out.y = b.Op(OpKind::kMatMul, {out.h, b.Param("down_proj", {16, 8})}, in);
  b.graph().outputs().insert(b.graph().outputs().begin(), out.y);
  return out;
}

DynamoSdpaGraph BuildDynamoSdpa(GraphBuilder& b, bool trainable_scale) {
  const Dim B = Dim(2), H = Dim(4), KVH = Dim(2), S = Dim(kS), Dh = Dim(4);
  DynamoSdpaGraph out;
  ir::Graph& g = b.graph();
  auto frozen_scalar = [&](const std::string& name, float v, bool frozen) {
    const ValueId id = g.AddConstant(name, Tensor::FromVector<float>({}, {v}), /*is_initializer=*/true);
    if (frozen) g.value(id).param_state = ir::ParamState::kFrozen;
    return id;
  };
  out.q = b.Input("q", {B, H, S, Dh});
  const ValueId k = b.Input("k", {B, KVH, S, Dh}), v = b.Input("v", {B, KVH, S, Dh});
  const ValueId keep = b.Input("keep", {B, Dim(1), S, S}, DType::kBool);
  auto repeat_kv = [&](ValueId x) {
    const ValueId u = b.Op(OpKind::kUnsqueeze, {x}, {B, KVH, Dim(1), S, Dh}, MakeAttrs({{"axes", std::vector<int64_t>{2}}}));
    const ValueId e = b.Op(OpKind::kExpand, {u, b.IntVec({2, 2, 2, kS, 4})}, {B, KVH, Dim(2), S, Dh});
    return b.Op(OpKind::kReshape, {e, b.IntVec({2, 4, kS, 4})}, {B, H, S, Dh});
  };
  out.k_heads = repeat_kv(k);
  out.v_heads = repeat_kv(v);
  const ValueId flat = b.Op(OpKind::kReshape, {out.k_heads, b.IntVec({-1, kS, 4})}, {B * H, S, Dh});
  const ValueId flat_t = b.Op(OpKind::kTranspose, {flat}, {B * H, Dh, S}, Perm({0, 2, 1}));
  const ValueId kt = b.Op(OpKind::kReshape, {flat_t, b.IntVec({2, 4, 4, kS})}, {B, H, Dh, S});
  const ValueId scale = frozen_scalar("val_147", out.sqrt_scale, !trainable_scale);
  const ValueId qs = b.Op(OpKind::kMul, {out.q, scale}, {B, H, S, Dh});
  const ValueId kts = b.Op(OpKind::kMul, {kt, scale}, {B, H, Dh, S});
  const ValueId zero = frozen_scalar("val_151", 0.0f, true);
  out.mask = b.Op(OpKind::kWhere, {keep, zero, frozen_scalar("val_152", -3.4028234663852886e38f, true)},
                  {B, Dim(1), S, S});
  const ValueId s = b.Op(OpKind::kAdd, {b.Op(OpKind::kMatMul, {qs, kts}, {B, H, S, S}), out.mask}, {B, H, S, S});
  const ValueId p = b.Op(OpKind::kSoftmax, {s}, {B, H, S, S});
  const ValueId nan = b.Op(OpKind::kIsNaN, {p}, {B, H, S, S}, {}, DType::kBool);
  const ValueId guarded = b.Op(OpKind::kWhere, {nan, zero, p}, {B, H, S, S});
  out.out = b.Op(OpKind::kMatMul, {guarded, out.v_heads}, {B, H, S, Dh});
  b.Output(out.out);
  return out;
}

// Builds y = gelu(x) in the requested form; returns {x, y}.
std::pair<ValueId, ValueId> BuildGelu(GraphBuilder& b, const GeluOptions& o) {
  ValueId in = b.Input("in", kGeluShape);
  ValueId x = o.x_from_add ? b.Op(OpKind::kAdd, {b.Param("bias", {8}), in}, kGeluShape) : in;
  auto mul = [&](ValueId a, ValueId c) { return b.Op(OpKind::kMul, {a, c}, kGeluShape); };
  auto add = [&](ValueId a, ValueId c) { return b.Op(OpKind::kAdd, {a, c}, kGeluShape); };
  ValueId f = ir::kNoValue, y = ir::kNoValue;  // every GeluForm sets both
  switch (o.form) {
    case GeluForm::kErfExporter:
    case GeluForm::kErfHalfFirst:
    case GeluForm::kErfMulRsqrt2: {
      ValueId arg = o.form == GeluForm::kErfMulRsqrt2 ? mul(x, b.Scalar(0.70710678f))
                    : b.Op(OpKind::kDiv, {x, b.Scalar(o.form == GeluForm::kErfExporter ? 1.4142135f : 1.4142f)}, kGeluShape);
      f = b.Op(OpKind::kErf, {arg}, kGeluShape);
      if (o.form == GeluForm::kErfExporter) {
        y = mul(mul(x, add(f, b.Scalar(1.0f))), b.Scalar(o.half));
      } else if (o.form == GeluForm::kErfHalfFirst) {
        y = mul(mul(x, b.Scalar(o.half)), add(b.Scalar(1.0f), f));
      } else {
        y = mul(x, mul(b.Scalar(o.half), add(f, b.Scalar(1.0f))));
      }
      break;
    }
    case GeluForm::kTanhExporter:
    case GeluForm::kTanhPow: {
      ValueId cube = o.form == GeluForm::kTanhExporter
                         ? mul(x, mul(x, x))
                         : b.Op(OpKind::kPow, {x, b.Scalar(3.0f)}, kGeluShape);
      ValueId inner = o.form == GeluForm::kTanhExporter ? mul(b.Scalar(0.044715f), cube) : mul(cube, b.Scalar(0.044715f));
      ValueId arg = o.form == GeluForm::kTanhExporter ? mul(b.Scalar(0.7978845834732056f), add(x, inner))
                                                  : mul(add(x, inner), b.Scalar(0.7978846f));
      f = b.Op(OpKind::kTanh, {arg}, kGeluShape);
      y = o.form == GeluForm::kTanhExporter ? mul(b.Scalar(o.half), mul(x, add(b.Scalar(1.0f), f)))
                                        : mul(mul(x, b.Scalar(o.half)), add(f, b.Scalar(1.0f)));
      break;
    }
  }
  if (o.extra_use) b.Output(f);
  b.Output(b.Op(OpKind::kRelu, {y}, kGeluShape));
  return {x, y};
}


ir::Attrs Perm(std::vector<int64_t> p) { return MakeAttrs({{"perm", p}}); }

// Additive (S, S) causal mask as torch.triu(full(-inf), 1) builds it, with leading unit dims.
Tensor AdditiveCausal(std::vector<int64_t> dims, float fill) {
  Tensor t(DType::kF32, dims);
  for (int64_t i = 0; i < kS; ++i)
    for (int64_t j = 0; j < kS; ++j) t.mutable_data<float>()[i * kS + j] = j > i ? fill : 0.0f;
  return t;
}

// Boolean (S, S) mask; `masked_above`: true above the diagonal (masked_fill's condition).
Tensor BoolTriangle(std::vector<int64_t> dims, bool masked_above) {
  Tensor t(DType::kBool, dims);
  for (int64_t i = 0; i < kS; ++i)
    for (int64_t j = 0; j < kS; ++j) t.mutable_data<bool>()[i * kS + j] = (j > i) == masked_above;
  return t;
}


MhaGraph BuildMha(GraphBuilder& b, const MhaOptions& o) {
  const Dim BH = Dim(4), S = Dim(kS), Dh = Dim(8);
  MhaGraph m;
  ValueId qr = b.Input("q", {S, BH, Dh});
  m.kr = b.Input("k", {S, BH, Dh});
  ValueId vr = b.Input("v", {S, BH, Dh});
  m.qh = b.Op(OpKind::kTranspose, {qr}, {BH, S, Dh}, Perm({1, 0, 2}));
  m.vh = b.Op(OpKind::kTranspose, {vr}, {BH, S, Dh}, Perm({1, 0, 2}));
  ValueId qs = b.Op(OpKind::kDiv, {m.qh, b.Scalar(std::sqrt(8.0f))}, {BH, S, Dh});
  ValueId kt = b.Op(OpKind::kTranspose, {m.kr}, {BH, Dh, S}, Perm({1, 2, 0}));
  ValueId s = b.Op(OpKind::kMatMul, {qs, kt}, {BH, S, S});
  if (o.mask != MhaOptions::kNone) {
    // baddbmm(mask, q, k^T): Mul(scores, 1) + Mul(mask, 1).
    m.mask = o.mask == MhaOptions::kCausalConst ? b.Const("mask", AdditiveCausal({1, kS, kS}))
                                                : b.Input("attn_mask", {Dim(1), S, S});
    ValueId scaled_mask = b.Op(OpKind::kMul, {m.mask, b.Scalar(1.0f)}, {Dim(1), S, S});
    s = b.Op(OpKind::kAdd, {b.Op(OpKind::kMul, {s, b.Scalar(1.0f)}, {BH, S, S}), scaled_mask}, {BH, S, S});
  }
  if (o.scale_after_mask) s = b.Op(OpKind::kMul, {s, b.Scalar(0.5f)}, {BH, S, S});
  ValueId p = b.Op(OpKind::kSoftmax, {s}, {BH, S, S}, MakeAttrs({{"axis", int64_t{-1}}}));
  if (o.extra_softmax_use) b.Output(p);
  if (o.nan_guard != MhaOptions::kNoGuard) {  // SDPA decompositions: Where(IsNaN(P), 0, P)
    ValueId isnan = b.Op(OpKind::kIsNaN, {p}, {BH, S, S}, {}, DType::kBool);
    p = b.Op(OpKind::kWhere, {isnan, b.Scalar(o.nan_guard == MhaOptions::kZeroGuard ? 0.0f : 1.0f), p}, {BH, S, S});
  }
  ir::Graph& g = b.graph();
  ValueId dropped = g.AddValue("drop_out", DType::kF32, {BH, S, S});
  ValueId drop_mask = g.AddValue("drop_mask", DType::kBool, {BH, S, S});
  g.AddNode(OpKind::kDropout, "/attn/Dropout", {p}, {dropped, drop_mask}, MakeAttrs({{"ratio", 0.1}}));
  if (o.dropout_mask_used) b.Output(drop_mask);
  m.out = b.Op(OpKind::kMatMul, {dropped, m.vh}, {BH, S, Dh});
  b.Output(b.Op(OpKind::kTranspose, {m.out}, {S, BH, Dh}, Perm({1, 0, 2})));
  return m;
}


GptGraph BuildGpt(GraphBuilder& b, const GptOptions& o) {
  const Dim B = Dim(2), H = Dim(2), S = Dim(kS), Dh = Dim(4);
  GptGraph m;
  ValueId qr = b.Input("q", {B, S, H, Dh});
  m.kr = b.Input("k", {B, S, H, Dh});
  ValueId vr = b.Input("v", {B, S, H, Dh});
  m.qh = b.Op(OpKind::kTranspose, {qr}, {B, H, S, Dh}, Perm({0, 2, 1, 3}));
  m.vh = b.Op(OpKind::kTranspose, {vr}, {B, H, S, Dh}, Perm({0, 2, 1, 3}));
  ValueId kt = b.Op(OpKind::kTranspose, {m.kr}, {B, H, Dh, S}, Perm({0, 2, 3, 1}));
  ValueId s = b.Op(OpKind::kMatMul, {m.qh, kt}, {B, H, S, S});
  s = b.Op(OpKind::kMul, {s, b.Scalar(0.5f)}, {B, H, S, S});
  if (o.extra_scores_use) b.Output(s);
  switch (o.cond) {
    case GptOptions::kCausalConst:
      m.cond = b.Const("cond", BoolTriangle({1, 1, kS, kS}, /*masked_above=*/true));
      break;
    case GptOptions::kInputCond:
    case GptOptions::kKeepCond:
      m.cond = b.Input("cond", {B, Dim(1), Dim(1), S}, DType::kBool);
      break;
    case GptOptions::kWindowConst: {
      Tensor band(DType::kBool, {1, 1, kS, kS});
      for (int64_t i = 0; i < kS; ++i)
        for (int64_t j = 0; j < kS; ++j) band.mutable_data<bool>()[i * kS + j] = j <= i && j >= i - 2;
      m.cond = b.Const("cond", band);
      break;
    }
  }
  const bool keep = o.cond == GptOptions::kKeepCond || o.cond == GptOptions::kWindowConst;
  ValueId fill = b.Scalar(keep ? -3.4028234663852886e38f : -kInf);
  s = keep ? b.Op(OpKind::kWhere, {m.cond, s, fill}, {B, H, S, S}) : b.Op(OpKind::kWhere, {m.cond, fill, s}, {B, H, S, S});
  if (o.padding_mask) {
    m.padding = b.Input("padding", {B, Dim(1), Dim(1), S});
    s = b.Op(OpKind::kAdd, {s, m.padding}, {B, H, S, S});
  }
  ValueId p = b.Op(OpKind::kSoftmax, {s}, {B, H, S, S}, MakeAttrs({{"axis", int64_t{3}}}));
  m.out = b.Op(OpKind::kMatMul, {p, m.vh}, {B, H, S, Dh});
  b.Output(m.out);
  return m;
}


BloomGraph BuildBloom(GraphBuilder& b, bool masked_fill) {
  const Dim B = Dim(2), H = Dim(2), BH = Dim(4), S = Dim(kS), Dh = Dim(4);
  BloomGraph m;
  m.q = b.Input("q", {BH, S, Dh});
  m.kt = b.Input("kt", {BH, Dh, S});
  m.v = b.Input("v", {BH, S, Dh});
  m.alibi = b.Input("alibi", {BH, Dim(1), S});
  m.mask = masked_fill ? b.Input("mask", {B, Dim(1), S, S}, DType::kBool) : b.Input("mask", {B, Dim(1), S, S});
  ValueId s = b.Op(OpKind::kMatMul, {m.q, m.kt}, {BH, S, S});
  s = b.Op(OpKind::kMul, {s, b.Scalar(0.5f)}, {BH, S, S});
  ValueId bias = b.Op(OpKind::kMul, {m.alibi, b.Scalar(1.0f)}, {BH, Dim(1), S});
  s = b.Op(OpKind::kAdd, {s, bias}, {BH, S, S});
  s = b.Op(OpKind::kReshape, {s, b.Const("split", Tensor::FromVector<int64_t>({4}, {2, 2, kS, kS}))}, {B, H, S, S});
  s = masked_fill ? b.Op(OpKind::kWhere, {m.mask, b.Scalar(-3.4028234663852886e38f), s}, {B, H, S, S})
                  : b.Op(OpKind::kAdd, {s, m.mask}, {B, H, S, S});
  ValueId p = b.Op(OpKind::kSoftmax, {s}, {B, H, S, S}, MakeAttrs({{"axis", int64_t{-1}}}));
  p = b.Op(OpKind::kReshape, {p, b.Const("merge", Tensor::FromVector<int64_t>({3}, {4, kS, kS}))}, {BH, S, S});
  m.out = b.Op(OpKind::kMatMul, {p, m.v}, {BH, S, Dh});
  b.Output(m.out);
  return m;
}

}  // namespace onnxpipe::passes::testing::patterns
