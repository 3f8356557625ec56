#!/usr/bin/env python3
"""Writes the ONNX Attention and RotaryEmbedding (ai.onnx opset 23) models that tests/autodiff/onnx_attention_test.cc
imports, with numpy references of their outputs (the formulas of the ONNX specification, in float64):

  RotaryEmbedding: per head, with angles c = cos_cache[...], s = sin_cache[...] (R / 2 of them per position, taken by
  position_ids when given) and x1, x2 the two halves of the first R features (interleaved: the even and odd ones),
  y1 = x1 c - x2 s, y2 = x1 s + x2 c; the other features pass through.
  Attention: softmax(scale Q K^T + mask [+ causal]) V per head, K/V head h // (Hq / Hkv) for query head h; a bool
  mask keeps where true.

  rotary_4d_partial.onnx     X (2, 3, 5, 8), caches (2, 5, 3) as constants, rotary_embedding_dim 6, rotate-half
  rotary_3d_interleaved.onnx X (2, 5, 12) with num_heads 3, caches (7, 2) taken by constant position_ids (2, 5),
                             interleaved, the whole head (4) rotated
  attention_4d_gqa.onnx      Q "X" (2, 4, 5, 3), K (2, 2, 6, 3), V (2, 2, 6, 2), a constant bool mask (2, 1, 5, 6),
                             the default scale
  attention_3d_causal.onnx   Q "X" (2, 5, 6) with q_num_heads 2, K (2, 5, 3) and V (2, 5, 4) with kv_num_heads 1,
                             a constant float mask (5, 5), is_causal, scale 0.7
  attention_softcap.onnx, attention_past_key.onnx, rotary_3d_without_heads.onnx: malformed for onnxpipe (a score cap,
                             a KV cache, a 3-D X without num_heads)
Float32 models (onnxruntime runs these ops in float32 only); the references are float64 from the float32 values.
Inputs and references: <model>.<input>.npy and <model>.Y.npy. Needs onnx >= 1.18 (knows opset
23) and numpy; when onnxruntime is installed it also checks that it agrees with the references:
  VENV/bin/python tests/data/onnx_attention/make_models.py
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import reference_models  # noqa: E402
F32 = TensorProto.FLOAT


def rotary_reference(x, cos, sin, rotary_dim, interleaved):
    """x (B, H, S, D); cos, sin (B, S, R / 2)."""
    c, s = cos[:, None], sin[:, None]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        y = np.empty_like(rot)
        y[..., 0::2], y[..., 1::2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        h = rotary_dim // 2
        x1, x2 = rot[..., :h], rot[..., h:]
        y = np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return np.concatenate([y, rest], axis=-1)


def attention_reference(q, k, v, mask, scale, causal):
    """q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = scale * q @ np.swapaxes(k, -1, -2)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    if causal:
        sq, sk = scores.shape[-2:]
        scores = np.where(np.tril(np.ones((sq, sk), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def const(name, array):
    return helper.make_node("Constant", [], [name], name=name + "_const", value=numpy_helper.from_array(array, name))


def model(name, node, inputs, constants, y_shape):
    graph = helper.make_graph([*(const(n, a) for n, a in constants.items()), node], name,
                              [helper.make_tensor_value_info(n, F32, a.shape) for n, a in inputs.items()],
                              [helper.make_tensor_value_info("Y", F32, y_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], producer_name="onnxpipe-tests",
                             ir_version=10)


def write(name, m, inputs, y):
    reference_models.write(HERE, name, m, inputs, y, inputs, atol=1e-5 * max(1.0, float(np.abs(y).max())))


def f32(a):
    return np.asarray(a, np.float32)


def main():
    rng = np.random.default_rng(23)
    # Rotate-half on 6 of 8 features, 4-D X, caches per batch and position.
    x = f32(rng.uniform(-2, 2, (2, 3, 5, 8)))
    angles = rng.uniform(-3, 3, (2, 5, 3))
    cos, sin = f32(np.cos(angles)), f32(np.sin(angles))
    node = helper.make_node("RotaryEmbedding", ["X", "cos", "sin"], ["Y"], name="/attn/rotary", rotary_embedding_dim=6)
    write("rotary_4d_partial", model("rotary_4d_partial", node, {"X": x}, {"cos": cos, "sin": sin}, x.shape), {"X": x},
          rotary_reference(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), 6, False))
    # Interleaved on a 3-D X of 3 heads of 4, caches of 7 positions taken by position_ids.
    x = f32(rng.uniform(-2, 2, (2, 5, 12)))
    angles = rng.uniform(-3, 3, (7, 2))
    pos = np.array([[0, 1, 2, 3, 4], [2, 3, 4, 5, 6]], np.int64)
    cos, sin = f32(np.cos(angles)), f32(np.sin(angles))
    node = helper.make_node("RotaryEmbedding", ["X", "cos", "sin", "pos"], ["Y"], name="/attn/rotary", interleaved=1,
                            num_heads=3)
    heads = x.astype(np.float64).reshape(2, 5, 3, 4).transpose(0, 2, 1, 3)
    y = rotary_reference(heads, cos[pos].astype(np.float64), sin[pos].astype(np.float64), 4, True)
    y = y.transpose(0, 2, 1, 3).reshape(2, 5, 12)
    write("rotary_3d_interleaved",
          model("rotary_3d_interleaved", node, {"X": x}, {"cos": cos, "sin": sin, "pos": pos}, x.shape), {"X": x}, y)
    # Grouped-query attention, 4-D, a bool mask, the default scale.
    q, k, v = f32(rng.normal(size=(2, 4, 5, 3))), f32(rng.normal(size=(2, 2, 6, 3))), f32(rng.normal(size=(2, 2, 6, 2)))
    mask = rng.uniform(size=(2, 1, 5, 6)) < 0.7
    mask[..., 0] = True  # every row keeps a key
    node = helper.make_node("Attention", ["X", "K", "V", "mask"], ["Y"], name="/attn/sdpa")
    inputs = {"X": q, "K": k, "V": v}
    write("attention_4d_gqa", model("attention_4d_gqa", node, inputs, {"mask": mask}, (2, 4, 5, 2)), inputs,
          attention_reference(*(t.astype(np.float64) for t in (q, k, v)), mask, 1 / np.sqrt(3), False))
    # 3-D, two query heads over one K/V head, a float mask, causal, an explicit scale.
    q, k, v = f32(rng.normal(size=(2, 5, 6))), f32(rng.normal(size=(2, 5, 3))), f32(rng.normal(size=(2, 5, 4)))
    fmask = f32(rng.normal(size=(5, 5)))
    node = helper.make_node("Attention", ["X", "K", "V", "mask"], ["Y"], name="/attn/sdpa", is_causal=1, scale=0.7,
                            q_num_heads=2, kv_num_heads=1)
    split = lambda t, h: t.astype(np.float64).reshape(2, 5, h, -1).transpose(0, 2, 1, 3)
    scale = np.float64(np.float32(0.7))  # a FLOAT attribute
    y = attention_reference(split(q, 2), split(k, 1), split(v, 1), fmask.astype(np.float64), scale, True)
    inputs = {"X": q, "K": k, "V": v}
    write("attention_3d_causal", model("attention_3d_causal", node, inputs, {"mask": fmask}, (2, 5, 8)), inputs,
          y.transpose(0, 2, 1, 3).reshape(2, 5, 8))
    # Malformed for onnxpipe.
    q4 = {n: f32(rng.normal(size=(1, 2, 3, 4))) for n in ("X", "K", "V")}
    node = helper.make_node("Attention", ["X", "K", "V"], ["Y"], name="/attn/sdpa", softcap=30.0)
    onnx.save_model(model("attention_softcap", node, q4, {}, (1, 2, 3, 4)),
                    os.path.join(HERE, "attention_softcap.onnx"))
    node = helper.make_node("Attention", ["X", "K", "V", "", "past"], ["Y"], name="/attn/sdpa")
    onnx.save_model(model("attention_past_key", node, q4, {"past": f32(rng.normal(size=(1, 2, 2, 4)))}, (1, 2, 3, 4)),
                    os.path.join(HERE, "attention_past_key.onnx"))
    node = helper.make_node("RotaryEmbedding", ["X", "cos", "sin"], ["Y"], name="/attn/rotary")
    onnx.save_model(model("rotary_3d_without_heads", node, {"X": f32(rng.normal(size=(1, 3, 8)))},
                          {"cos": f32(np.ones((1, 3, 2))), "sin": f32(np.zeros((1, 3, 2)))}, (1, 3, 8)),
                    os.path.join(HERE, "rotary_3d_without_heads.onnx"))


if __name__ == "__main__":
    main()
